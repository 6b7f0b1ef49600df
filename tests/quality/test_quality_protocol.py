"""Pieces of the issue-24 protocol (benchmarks/quality/RESULTS.md): twin-free splits and the
format rate. Pure functions: no processes, no models."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from toyq import task
from toyq.evaluate import well_formed


def _twins_in(held, train) -> float:
    tr = {tuple(p) for p in train.tolist()}
    return float(np.mean([(b, a) in tr for a, b in held.tolist() if a != b]))


def test_plain_split_leaks_swapped_twins_twin_free_does_not():
    cfg = task.TaskConfig()
    train, held = task.split_pairs(cfg)
    assert _twins_in(held, train) > 0.7          # the published protocol's held-out set
    tf = replace(cfg, twin_free=True, n_valid=120)
    train, valid, test = task.split_pairs_protocol(tf)
    for a_side, b_side in ((test, train), (valid, train), (test, valid)):
        assert _twins_in(a_side, b_side) == 0.0
        assert not {tuple(p) for p in a_side.tolist()} & {tuple(p) for p in b_side.tolist()}
    m = cfg.max_operand + 1
    assert len(train) + len(valid) + len(test) == m * m
    assert cfg.n_heldout <= len(test) <= cfg.n_heldout + 1
    assert tf.n_valid <= len(valid) <= tf.n_valid + 1
    again = task.split_pairs_protocol(tf)
    assert all((x == y).all() for x, y in zip(again, (train, valid, test)))
    tr2, te2 = task.split_pairs(tf)                # the trainer-facing pair: train, test
    assert (tr2 == train).all() and (te2 == test).all()


def test_defaults_keep_the_published_split_and_cache_key():
    from toyq.prepare import PrepConfig, cache_key

    cfg = task.TaskConfig()
    m = cfg.max_operand + 1
    grid = np.stack(np.meshgrid(np.arange(m), np.arange(m), indexing="ij"), -1).reshape(-1, 2)
    perm = np.random.default_rng([cfg.seed, 1]).permutation(len(grid))
    train, held = task.split_pairs(cfg)
    assert (held == grid[perm[:cfg.n_heldout]]).all() and (train == grid[perm[cfg.n_heldout:]]).all()
    base = PrepConfig()
    assert cache_key(base) == cache_key(replace(base, task=replace(base.task, twin_free=False)))
    assert cache_key(base) != cache_key(replace(base, task=replace(base.task, twin_free=True)))


def test_format_rate_counts_well_formed_answers():
    assert well_formed("12.") and well_formed(" 7. Q: 1+1")
    assert not well_formed("12") and not well_formed("twelve.") and not well_formed(".")
    assert not well_formed("1 2.")


def test_welch_paired_holm_against_scipy_and_by_hand():
    import math

    import pytest
    from scipy import stats as sps

    from toyq.stats import holm, paired, penalty, welch

    x = [0.31, 0.28, 0.40, 0.35, 0.33]
    y = [0.22, 0.30, 0.25, 0.21, 0.27]
    t, df, p = welch(x, y)
    ref = sps.ttest_ind(x, y, equal_var=False)
    assert t == pytest.approx(ref.statistic, rel=1e-12) and p == pytest.approx(ref.pvalue, rel=1e-9)
    vx, vy = np.var(x, ddof=1) / 5, np.var(y, ddof=1) / 5
    assert df == pytest.approx((vx + vy) ** 2 / (vx ** 2 / 4 + vy ** 2 / 4), rel=1e-12)
    t, df, p = paired(x, y)
    ref = sps.ttest_rel(x, y)
    assert t == pytest.approx(ref.statistic, rel=1e-12) and p == pytest.approx(ref.pvalue, rel=1e-9)
    assert df == 4.0
    adj = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.5})
    # sorted 0.01, 0.03, 0.04, 0.5 -> 0.04, 0.09, max(0.09, 0.08) = 0.09, 0.5
    assert adj == pytest.approx({"a": 0.04, "c": 0.09, "b": 0.09, "d": 0.5})
    assert penalty(0.08, 0.10) == pytest.approx(0.2) and math.isnan(penalty(0.1, 0.0))
    with pytest.raises(ValueError):
        welch([0.1], [0.2, 0.3])


def test_control_teacher_is_prepared_only_for_the_same_tokenizer_arms():
    from toyq.prepare import PrepConfig, teacher_size
    from toyq.run import teachers_needed

    assert "teacher_same_big" in teachers_needed(["op_k1_same", "cont_ce"])
    assert "teacher_same_big" not in teachers_needed(["op_k1", "op_bpm", "cont_ce"])
    cfg = PrepConfig()
    assert teacher_size(cfg, "teacher_same_big") == teacher_size(cfg, "teacher_big")
    assert teacher_size(cfg, "teacher_weak") == (cfg.weak_layers, cfg.weak_hidden, cfg.weak_steps)


def test_second_teachers_are_prepared_only_for_their_arms_with_another_seed():
    from toyq.prepare import SAME_TOKENIZER_TEACHERS, PrepConfig, teacher_seed, teacher_size
    from toyq.run import teachers_needed

    assert teachers_needed(["cont_ce", "op_k1_byte_mean_clip_t2"]) == ["teacher_big",
                                                                     "teacher_big_t2"]
    assert teachers_needed(["op_k1_same_mean_clip_t2"]) == ["teacher_big",
                                                           "teacher_same_big_t2"]
    assert not {"teacher_big_t2", "teacher_same_big_t2"} & set(
        teachers_needed(["op_k1_byte_mean_clip", "op_k1_same_mean_clip"]))
    cfg = PrepConfig()
    for name in ("teacher_big_t2", "teacher_same_big_t2"):
        assert teacher_size(cfg, name) == teacher_size(cfg, "teacher_big")
        assert teacher_seed(name) == 1 and teacher_seed(name[:-3]) == 0
    assert "teacher_same_big_t2" in SAME_TOKENIZER_TEACHERS
    assert "teacher_big_t2" not in SAME_TOKENIZER_TEACHERS


def test_budget_teachers_are_the_big_teachers_with_their_own_steps_and_seed():
    """``op_k1_byte_mean_clip_s<steps>[_t<k>]`` reads ``teacher_big_s<steps>[_t<k>]`` (the
    same-tokenizer base ``op_k1_same_mean_clip_s...`` reads ``teacher_same_big_s...``): the big
    teacher's size and tokenizer, ``<steps>`` CE steps, training seed k - 1; a malformed name is
    no arm, and the harness's error says what the pattern is."""
    from toyq.continued import (SAME_BUDGET_BASE, budget_arm, budget_of, is_cont_arm,
                                is_same_arm, k1_teacher)
    from toyq.prepare import (SAME_TOKENIZER_TEACHERS, PrepConfig, budget_teacher,
                              same_tokenizer, teacher_seed, teacher_size)
    from toyq.run import _arg_error, parse, teachers_needed

    cfg = PrepConfig()
    assert budget_arm(750, "_t3") == "op_k1_byte_mean_clip_s750_t3"
    assert budget_of("op_k1_byte_mean_clip_s750_t3") == 750
    assert k1_teacher("op_k1_byte_mean_clip_s750_t3") == "teacher_big_s750_t3"
    assert k1_teacher("op_k1_byte_mean_clip_t2") == "teacher_big_t2"
    for bad in ("op_k1_byte_mean_clip_s0", "op_k1_byte_mean_clip_s750_t5",
                "op_k1_same_mean_clip_s0", "op_k1_byte_mean_clip_s750x"):
        assert budget_of(bad) is None and not is_cont_arm(bad), bad
    assert teachers_needed(["cont_ce", "op_k1_byte_mean_clip_s750_t2",
                            "op_k1_byte_mean_clip_s750"]) == [
        "teacher_big", "teacher_big_s750", "teacher_big_s750_t2"]
    assert teacher_size(cfg, "teacher_big_s750_t4") == (cfg.big_layers, cfg.big_hidden, 750)
    assert [teacher_seed(f"teacher_big_s750{s}") for s in ("", "_t2", "_t3", "_t4")] == [0, 1, 2, 3]
    assert budget_teacher("teacher_big_t2") is None and budget_teacher("teacher_big_s07") is None
    assert "teacher_big_s750" not in SAME_TOKENIZER_TEACHERS and not same_tokenizer("teacher_big_s750")
    # the same-tokenizer kind: the student's tokenizer, the big size, its own steps and seed
    same = budget_arm(1000, "_t2", SAME_BUDGET_BASE)
    assert same == "op_k1_same_mean_clip_s1000_t2" and budget_of(same) == 1000
    assert is_same_arm(same) and not is_same_arm("op_k1_byte_mean_clip_s1000_t2")
    assert k1_teacher(same) == "teacher_same_big_s1000_t2" and same_tokenizer(k1_teacher(same))
    assert k1_teacher("op_k1_same_mean_clip_t3") == "teacher_same_big_t3"
    assert teacher_size(cfg, "teacher_same_big_s1000_t2") == (cfg.big_layers, cfg.big_hidden, 1000)
    assert teacher_seed("teacher_same_big_s1000_t2") == 1
    assert teachers_needed(["cont_ce", same]) == ["teacher_big", "teacher_same_big_s1000_t2"]
    assert budget_of("op_k1_same_mean_clip_g1_s1000") is None
    args = parse(["--arm-lr", "op_k1_byte_mean_clip_s750=1e-4"])
    assert _arg_error(args, ["cont_ce", "op_k1_byte_mean_clip_s750"]) == ""
    err = _arg_error(args, ["op_k1_byte_mean_clip_s750", "op_k1_byte_mean_clip_s0"])
    assert "op_k1_byte_mean_clip_s0" in err and "op_k1_byte_mean_clip_s<teacher steps>" in err


def test_third_and_fourth_teachers_have_their_own_seeds_and_tokenizers():
    from toyq.continued import CONT_ARMS, SAME_ARMS, teacher_suffix
    from toyq.prepare import SAME_TOKENIZER_TEACHERS, teacher_seed
    from toyq.run import teachers_needed

    assert teachers_needed(["cont_ce", "op_k1_byte_mean_clip_t3", "op_k1_same_mean_clip_t4"]) == [
        "teacher_big", "teacher_big_t3", "teacher_same_big_t4"]
    assert [teacher_seed(f"teacher_big{s}") for s in ("", "_t2", "_t3", "_t4")] == [0, 1, 2, 3]
    assert teacher_seed("teacher_same_big_t4") == 3
    assert {"teacher_same_big_t3", "teacher_same_big_t4"} <= set(SAME_TOKENIZER_TEACHERS)
    assert "teacher_big_t4" not in SAME_TOKENIZER_TEACHERS
    assert "op_k1_same_mean_clip_t3" in SAME_ARMS and "op_k1_byte_mean_clip_t4" in CONT_ARMS
    assert teacher_suffix("op_k1_byte_mean_clip_t3") == "_t3"
    assert teacher_suffix("op_k1_byte_mean_clip") == ""


def test_teachers_train_jobs_at_a_time_and_all_reach_the_manifest(monkeypatch, tmp_path):
    """``prepare_all(jobs=2)`` trains two missing teachers at once (their trainer children are
    what takes the time; here a fake that waits until both have started) and writes every one,
    with its own seed and tokenizer, to the manifest."""
    import json
    import threading

    from toyq import prepare

    root = tmp_path / prepare.cache_key(prepare.PrepConfig())
    root.mkdir()
    (root / "assets.json").write_text(json.dumps({
        "tok_student": "S", "tok_teacher": "T", "corpus": {}, "timings": {}, "prep": {}}))
    both_started = threading.Barrier(2, timeout=30)
    seen = []

    def fake_train(out, tok, corpus, layers, hidden, steps, cfg, log, watch, seed, cancel=None):
        seen.append((out.name, tok, seed))
        both_started.wait()                    # fails (BrokenBarrierError) if run one at a time
        return {"model": str(out), "accuracy": 0.5 + seed / 10, "bpb": 1.0}

    monkeypatch.setattr(prepare, "train_teacher", fake_train)
    monkeypatch.setattr(prepare, "reusable_teacher", lambda *a: None)
    assets = prepare.prepare_all(tmp_path, teachers=["teacher_big_t3", "teacher_same_big_t4"],
                                 log=lambda *a: None, jobs=2)
    assert sorted(seen) == [("teacher_big_t3", "T", 2), ("teacher_same_big_t4", "S", 3)]
    saved = json.loads((root / "assets.json").read_text())
    for name, acc in (("teacher_big_t3", 0.7), ("teacher_same_big_t4", 0.8)):
        assert saved[name]["accuracy"] == assets[name]["accuracy"] == pytest.approx(acc)
        assert name in saved["timings"]


def test_corpora_carry_the_validation_split_and_the_harness_scores_the_chosen_one(tmp_path):
    import pytest

    from toyq.harness import eval_split
    from toyq.run import main

    cfg = task.TaskConfig(max_operand=9, n_heldout=20, passes=1, twin_free=True, n_valid=16)
    info = task.build_corpora(tmp_path, cfg)
    train, valid, test = task.split_pairs_protocol(cfg)
    assert info["valid"] == valid.tolist() and info["heldout"] == test.tolist()
    lines = (tmp_path / "teacher.jsonl").read_text()
    for a, b in valid.tolist() + test.tolist():   # neither split reaches a training corpus
        assert f"Q: {a}+{b}=?" not in lines
    assert eval_split({"corpus": info}) == "heldout"
    assert eval_split({"corpus": info, "eval_split": "valid"}) == "valid"
    plain = task.build_corpora(tmp_path / "plain", task.TaskConfig(max_operand=9, n_heldout=20,
                                                                   passes=1))
    with pytest.raises(KeyError, match="valid"):
        eval_split({"corpus": plain, "eval_split": "valid"})
    assert main(["--arms", "cont_ce", "--n-valid", "10", "--no-report",
                 "--out", str(tmp_path / "out")]) == 2      # needs --twin-free


def test_confirmation_table_from_hand_made_runs():
    import pytest
    from scipy import stats as sps

    from toyq.confirm import comparisons, confirmation_lines
    from toyq.report import render
    from toyq.stats import holm

    seeds = [10, 11, 12, 13, 14]
    acc = {"cont_ce": [0.30, 0.32, 0.29, 0.31, 0.30],
           "op_k1": [0.36, 0.39, 0.35, 0.37, 0.38], "op_k1_same": [0.40, 0.41, 0.39, 0.42, 0.40],
           "op_bpm": [0.30, 0.33, 0.28, 0.31, 0.31], "op_bpm_same": [0.35, 0.36, 0.33, 0.36, 0.34],
           "op_k1_byte": [0.38, 0.40, 0.37, 0.39, 0.38]}     # its control: op_k1_same
    fmt = {"op_bpm": 0.85}
    runs = [{"arm": a, "seed": s, "accuracy": x, "bpb": 3.0, "train_s": 1.0,
             "format_rate": fmt.get(a, 0.99)} for a, xs in acc.items() for s, x in zip(seeds, xs)]
    comps = comparisons(runs)
    assert [(c["kind"], c["teacher"]) for c in comps] == [
        ("op_bpm", "cross"), ("op_bpm", "same"), ("op_k1", "cross"), ("op_k1", "same"),
        ("op_k1_byte", "cross")]              # op_k1_same, shared by two kinds: tested once
    assert len({c["arm"] for c in comps}) == len(comps) == 5
    pw = {}
    for c in comps:
        ref = sps.ttest_ind(acc[c["arm"]], acc["cont_ce"], equal_var=False)
        assert c["welch"][2] == pytest.approx(ref.pvalue, rel=1e-9)
        assert c["gain"] == pytest.approx(np.mean(acc[c["arm"]]) - np.mean(acc["cont_ce"]))
        pw[c["kind"], c["teacher"]] = c["welch"][2]
    adj = holm(pw)
    assert all(c["welch_holm"] == pytest.approx(adj[c["kind"], c["teacher"]]) for c in comps)
    k1 = {c["teacher"]: c for c in comps if c["kind"] == "op_k1"}
    assert k1["same"]["passes"] and k1["cross"]["passes"]
    bpm_cross = next(c for c in comps if c["arm"] == "op_bpm")
    assert not bpm_cross["passes"]                      # gain +0.002: nowhere near
    text = "\n".join(confirmation_lines(runs))
    pen = 1 - (np.mean(acc["op_k1"]) - 0.304) / (np.mean(acc["op_k1_same"]) - 0.304)
    assert f"cross-tokenizer penalty of op_k1: {pen:.2f}" in text
    pen_byte = 1 - (np.mean(acc["op_k1_byte"]) - 0.304) / (np.mean(acc["op_k1_same"]) - 0.304)
    assert f"cross-tokenizer penalty of op_k1_byte: {pen_byte:.2f}" in text
    assert "k1 with the same-tokenizer teacher beats continued CE: yes" in text
    assert "collapsed (format rate < 0.9 on a seed): op_bpm" in text
    summary = {a: {"accuracy": 0.3, "accuracy_std": 0.01, "bpb": 3.0, "bpb_std": 0.0,
                   "seeds": 5, "train_s": 1.0} for a in acc}
    assert "Confirmation (issue 24)" in render({"summary": summary, "runs": runs}, {})


def test_a_same_tokenizer_arm_that_is_no_control_is_its_own_row():
    """Ninth protocol: ``op_k1_twin_byte_mean_clip`` (the byte estimator with the same-tokenizer
    teacher under a twin tokenizer) is tested against continued CE in the same Holm family,
    labelled ``twin``, and gets no cross-tokenizer penalty line of its own."""
    from toyq.confirm import comparisons, confirmation_lines, control_arm, is_same, teacher_label
    from toyq.stats import holm
    from scipy import stats as sps

    seeds = [100, 101, 102, 103]
    acc = {"cont_ce": [0.20, 0.22, 0.19, 0.21],
           "op_k1_same_mean_clip": [0.40, 0.41, 0.37, 0.42],
           "op_k1_twin_byte_mean_clip": [0.38, 0.40, 0.36, 0.41],
           "op_k1_byte_mean_clip": [0.35, 0.39, 0.33, 0.38]}
    runs = [{"arm": a, "seed": s, "accuracy": x, "format_rate": 1.0}
            for a, xs in acc.items() for s, x in zip(seeds, xs)]
    assert is_same("op_k1_twin_byte_mean_clip") and is_same("op_k1_mean_same")
    assert not is_same("op_k1_byte_mean_clip")
    assert [teacher_label(a) for a in acc if a != "cont_ce"] == ["same", "twin", "cross"]
    assert control_arm("op_k1_byte_mean_clip") == "op_k1_same_mean_clip"
    comps = comparisons(runs)
    assert [(c["kind"], c["teacher"], c["arm"]) for c in comps] == [
        ("op_k1_byte_mean_clip", "cross", "op_k1_byte_mean_clip"),
        ("op_k1_byte_mean_clip", "same", "op_k1_same_mean_clip"),
        ("op_k1_twin_byte_mean_clip", "twin", "op_k1_twin_byte_mean_clip")]
    pw = {c["arm"]: sps.ttest_ind(acc[c["arm"]], acc["cont_ce"], equal_var=False).pvalue
          for c in comps}
    adj = holm(pw)                                          # one family of three
    assert all(abs(c["welch_holm"] - adj[c["arm"]]) < 1e-12 for c in comps)
    text = "\n".join(confirmation_lines(runs))
    assert "penalty of op_k1_byte_mean_clip" in text
    assert "penalty of op_k1_twin_byte_mean_clip" not in text


def test_student_side_labels_a_prefix_and_keeps_twins_together():
    """Second protocol: the student's labels cover the first ``student_pairs`` training problems
    (rounded up to keep a problem with its swapped twin); the rest is a twin-free prompt pool."""
    cfg = task.TaskConfig(answer_noise=0, twin_free=True, n_valid=150, student_pairs=300)
    train, _, _ = task.split_pairs_protocol(cfg)
    labeled = task.student_side(train, cfg)
    assert len(labeled) in (300, 301) and (labeled == train[:len(labeled)]).all()
    pool = train[len(labeled):]
    assert _twins_in(pool, labeled) == 0.0 and len(pool) + len(labeled) == len(train)
    assert task.student_side(train, replace(cfg, student_pairs=0)) is train


def test_prompt_pools_and_per_arm_rates(tmp_path):
    import json

    import pytest

    from toyq.arms import ArmSettings
    from toyq.prepare import prompts_file
    from toyq.run import parse_arm_lr

    cfg = task.TaskConfig(answer_noise=0, twin_free=True, n_valid=150, student_pairs=300)
    (tmp_path / "corpus").mkdir()
    assets = {"root": str(tmp_path), "prep": {"task": cfg.__dict__}}
    rows = lambda pool: [json.loads(x)["prompt"] for x in  # noqa: E731
                         open(prompts_file(assets, pool), encoding="utf-8")]
    student, everything = rows("student"), rows("train")
    assert len(student) == len(task.student_side(task.split_pairs(cfg)[0], cfg))
    assert len(everything) == 600 and everything[:len(student)] == student
    with pytest.raises(ValueError, match="prompt pool 'valid'"):
        prompts_file(assets, "valid")
    pairs = parse_arm_lr("op_k1_same=1e-4,op_k1=3e-5")
    assert pairs == (("op_k1", 3e-5), ("op_k1_same", 1e-4))
    s = ArmSettings(cont_lr=1e-3, arm_lr=pairs)
    assert s.cont_lr_of("op_k1") == 3e-5 and s.cont_lr_of("cont_ce") == 1e-3
    import argparse
    with pytest.raises(argparse.ArgumentTypeError, match="expected arm=learning_rate"):
        parse_arm_lr("op_k1:1e-4")


def test_table_names_the_split_it_scored():
    from toyq.summary import format_table

    summary = {"ce": {"accuracy": 0.3, "accuracy_std": 0.01, "bpb": 3.0, "bpb_std": 0.0,
                      "seeds": 3, "train_s": 1.0}}
    assert "| arm | validation accuracy |" in format_table(summary, "valid")
    assert "| arm | held-out accuracy |" in format_table(summary)


def test_unlabeled_split_is_the_prompt_pool_the_student_has_no_label_for(tmp_path):
    """Fourth protocol's split: the training problems beyond the student's labels -- disjoint
    from the labeled ones, twin-free against them, absent from the student's corpus, present in
    the teachers'; ``--eval-split unlabeled`` refuses a corpus that labels everything."""
    from toyq.run import main

    cfg = task.TaskConfig(answer_noise=0, twin_free=True, n_valid=150, student_pairs=300)
    train, _, _ = task.split_pairs_protocol(cfg)
    pool = task.unlabeled_pairs(cfg)
    labeled = task.student_side(train, cfg)
    assert len(pool) + len(labeled) == len(train) and len(pool) > 250
    assert not {tuple(p) for p in pool.tolist()} & {tuple(p) for p in labeled.tolist()}
    assert _twins_in(pool, labeled) == 0.0
    small = replace(cfg, max_operand=9, n_heldout=20, n_valid=16, passes=1, student_pairs=10)
    info = task.build_corpora(tmp_path, small)
    student = (tmp_path / "student.jsonl").read_text()
    teacher = (tmp_path / "teacher.jsonl").read_text()
    for a, b in task.unlabeled_pairs(small).tolist():
        assert f"Q: {a}+{b}=?" not in student and f"Q: {a}+{b}=?" in teacher
    assert len(task.unlabeled_pairs(replace(small, student_pairs=0))) == 0
    assert info["heldout"]
    assert main(["--arms", "cont_ce", "--twin-free", "--n-valid", "10", "--eval-split",
                 "unlabeled", "--no-report", "--out", str(tmp_path / "out"),
                 "--cache", str(tmp_path / "cache"), "--steps", "1"]) == 2


def test_unlabeled_halves_partition_the_pool_and_keep_twins_together(tmp_path):
    """Fifth protocol's splits: the unlabeled pool cut in a tuning half and a test half --
    disjoint, together the whole pool, about equal, a problem and its swapped twin in the same
    half; the table names the half it scored; ``run.py`` refuses a half of an empty pool."""
    from toyq.run import main
    from toyq.summary import format_table

    cfg = task.TaskConfig(answer_noise=0, twin_free=True, n_valid=150, student_pairs=300)
    pool = task.unlabeled_pairs(cfg).tolist()
    halves = task.unlabeled_halves(cfg)
    tune, test = (halves[k].tolist() for k in task.UNLABELED_HALVES)
    assert sorted(map(tuple, tune + test)) == sorted(map(tuple, pool))
    assert not {tuple(p) for p in tune} & {tuple(p) for p in test}
    assert abs(len(tune) - len(test)) <= 2 and len(test) > 120
    pool_set, tune_set = {tuple(p) for p in pool}, {tuple(p) for p in tune}
    twins = [(a, b) for a, b in pool_set if a != b and (b, a) in pool_set]
    assert twins                                                   # the pool has twins
    assert all(((a, b) in tune_set) == ((b, a) in tune_set) for a, b in twins)
    again = task.unlabeled_halves(cfg)
    assert all(np.array_equal(halves[k], again[k]) for k in halves)   # deterministic
    summary = {"ce": {"accuracy": 0.3, "accuracy_std": 0.01, "bpb": 3.0, "bpb_std": 0.0,
                      "seeds": 3, "train_s": 1.0}}
    assert "| arm | accuracy on the unlabeled prompts' test half |" in format_table(
        summary, "unlabeled_test")
    assert main(["--arms", "cont_ce", "--twin-free", "--n-valid", "10", "--eval-split",
                 "unlabeled_tune", "--no-report", "--out", str(tmp_path / "out"),
                 "--cache", str(tmp_path / "cache"), "--steps", "1"]) == 2


def test_teacher_per_doc_keeps_the_problems_and_text_of_the_teacher_corpus():
    """``teacher_per_doc`` (the sixteenth protocol): the teachers' documents hold that many
    problems, the same problems (with their multiplicity) and the same text documents as at
    ``per_doc``; at 0 the corpus is the one written before the option existed."""
    from collections import Counter

    cfg = replace(task.TaskConfig(), max_operand=9, n_heldout=20, passes=3)
    train = task.split_pairs(cfg)[0]
    texts = [f"passage {k}" for k in range(7)]
    base = task.documents(train, texts, cfg, 2)
    assert task.documents(train, texts, cfg, 2, per_doc=0) == base
    one = task.documents(train, texts, replace(cfg, teacher_per_doc=1), 2, per_doc=1)

    def split(docs):
        probs = Counter(ln for d in docs if d.startswith("Q:") for ln in d.split("\n"))
        return probs, Counter(d for d in docs if not d.startswith("Q:"))

    assert split(one) == split(base)
    assert all("\n" not in d for d in one if d.startswith("Q:"))
    assert len(one) == 3 * len(train) + sum(split(base)[1].values())
    assert max(d.count("\n") for d in base if d.startswith("Q:")) == cfg.per_doc - 1


def test_teacher_per_doc_gets_its_own_cache_and_teachers():
    from toyq import prepare

    base = prepare.PrepConfig()
    one = replace(base, task=replace(base.task, teacher_per_doc=1))
    assert prepare.cache_key(one) != prepare.cache_key(base)
    # a manifest written before the option existed has no such field: same teacher side as 0
    old = prepare.asdict(base)
    old["task"] = {k: v for k, v in old["task"].items() if k != "teacher_per_doc"}
    assert prepare._teacher_side(old) == prepare._teacher_side(prepare.asdict(base))
    assert prepare._teacher_side(prepare.asdict(one)) != prepare._teacher_side(old)
