"""CI-sized quality harness: prepare -> teachers (CE-only trainer runs) -> arms -> scores -> report.

A few steps each, tiny models, a 10x10 addition table: this checks the harness path end to end
(tokenizer invariants, teacher training through ``xdistill train offpolicy``, projections, the
generated arm configs for every loss family, greedy scoring, bits per byte, checkpoints scored
into accuracy curves, the report), not quality. The real numbers come from
``python benchmarks/quality/run.py``.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from quality_helpers import TINY_ARMS, TINY_PREP, TINY_TASK
from toyq import task
from toyq.arms import ARMS, arm_config


pytestmark = pytest.mark.integration  # starts processes

def test_task_is_deterministic_and_heldout_is_disjoint():
    tr1, held1 = task.split_pairs(TINY_TASK)
    tr2, held2 = task.split_pairs(TINY_TASK)
    assert (tr1 == tr2).all() and (held1 == held2).all()
    assert not {tuple(p) for p in tr1.tolist()} & {tuple(p) for p in held1.tolist()}
    assert len(tr1) + len(held1) == 100
    docs = task.documents(tr1, ["some text"], TINY_TASK, salt=3)
    assert docs == task.documents(tr1, ["some text"], TINY_TASK, salt=3)
    held_lines = {task.problem(a, b) for a, b in held1.tolist()}
    assert not any(line in held_lines for d in docs for line in d.split("\n"))


def test_answer_noise_corrupts_only_the_student_corpus_answers():
    from dataclasses import replace

    from toyq.prepare import cache_key

    noisy_cfg = replace(TINY_TASK, answer_noise=0.5, passes=20)
    clean_cfg = replace(noisy_cfg, answer_noise=0.0)
    train = task.split_pairs(noisy_cfg)[0]
    noisy = task.documents(train, [], noisy_cfg, salt=3, noisy=True)
    clean = task.documents(train, [], clean_cfg, salt=3, noisy=True)
    assert clean == task.documents(train, [], noisy_cfg, salt=3)  # noisy=False: clean answers
    n_wrong = n = 0
    for d_noisy, d_clean in zip(noisy, clean):  # same order, same problems, only answers differ
        for ln, lc in zip(d_noisy.split("\n"), d_clean.split("\n")):
            q, ans = ln[:-1].split("A:")
            assert lc.startswith(q) and lc.endswith(".")
            a, b = map(int, q[3:].split("=")[0].split("+"))
            assert 0 <= int(ans) <= 2 * noisy_cfg.max_operand
            n_wrong += int(ans) != a + b
            n += 1
    assert n == 20 * len(train) and abs(n_wrong / n - 0.5) < 0.05
    # a noisy preparation gets its own cache; a clean one keeps the key it had before the
    # option existed (the hash of the config without the field)
    import hashlib
    import json
    from dataclasses import asdict

    assert cache_key(replace(TINY_PREP, task=clean_cfg)) != cache_key(replace(TINY_PREP, task=noisy_cfg))
    clean_prep = replace(TINY_PREP, task=clean_cfg)
    old = asdict(clean_prep)
    for opt in ("answer_noise", "twin_free", "n_valid", "teacher_per_doc"):  # the fields added
        del old["task"][opt]                                                  # since, at defaults
    old_key = hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:12]
    assert cache_key(clean_prep) == old_key


def test_every_arm_config_is_valid(assets, tmp_path):
    from xdistill.config import load_config
    from xdistill.train.config import OffPolicyConfig, validate_offpolicy
    from xdistill.train.setup import build_plan

    from toyq.runner import write_config

    from xdistill.train.onpolicy_config import OnPolicyConfig, validate_onpolicy

    for arm in ARMS:
        path = write_config(arm_config(arm, 0, assets, TINY_ARMS, str(tmp_path / arm)),
                            tmp_path / f"{arm}.yaml")
        if arm == "onpolicy":
            cfg = validate_onpolicy(load_config(OnPolicyConfig, str(path)))
            assert cfg.loss.offpolicy_lambda == 0.5 and cfg.teachers[0].loss.kind == "k1"
            continue
        cfg = validate_offpolicy(load_config(OffPolicyConfig, str(path)))
        plan = build_plan(cfg)  # tokenizers, projection pairs, loss kinds vs tokenizer pairs
        assert len(plan.loss_specs) == len(cfg.teachers)


def test_harness_end_to_end(assets, tmp_path):
    from xdistill.tokenization import load_tokenizer

    from toyq.harness import run_harness, uncommon_answer_fraction

    assert load_tokenizer(assets["tok_student"]).family == "byte_bpe"
    assert load_tokenizer(assets["tok_teacher"]).family == "spm"
    for name in ("teacher_big", "teacher_weak"):
        assert 0.0 <= assets[name]["accuracy"] <= 1.0 and math.isfinite(assets[name]["bpb"])
    arms = ["ce", "multi", "onpolicy"]
    result = run_harness(assets, arms, [0], TINY_ARMS, tmp_path, log=lambda *_: None, jobs=2)
    assert set(result["summary"]) == set(arms)
    for r in result["runs"]:
        run_dir = tmp_path / "runs" / r["arm"] / "seed0"
        assert (run_dir / "export" / "config.json").exists()
        metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert metrics[-1]["step"] == TINY_ARMS.steps
        assert r["n"] == TINY_TASK.n_heldout and 0.0 <= r["accuracy"] <= 1.0
        assert math.isfinite(r["bpb"]) and r["bpb"] > 0
        # every checkpoint scored (the last one is the exported student), then deleted
        assert [st for st, _ in r["curve"]] == [2, 4]
        assert all(0.0 <= acc <= 1.0 for _, acc in r["curve"])
        assert r["curve"][-1][1] == pytest.approx(r["accuracy"])
        assert not (run_dir / "checkpoints").exists()
        if r["arm"] != "onpolicy":  # held-out bpb curve from the trainer's evaluation
            assert [m["step"] for m in metrics if "eval/bpb" in m] == [2, 4]
    metrics = [json.loads(x) for x in
               (tmp_path / "runs" / "multi" / "seed0" / "metrics.jsonl").read_text().splitlines()]
    teacher_terms = [k for k in metrics[0] if k.endswith("/loss")]  # "multi": both teachers
    assert {"cross/loss", "weak/loss"} <= set(teacher_terms)
    # answers are numbers 0..18: all but the one-digit ones are uncommon for GOLD
    assert 0.4 < uncommon_answer_fraction(assets) < 1.0
    _check_report(result, arms, tmp_path)
    # a second call reuses every finished run
    again = run_harness(assets, arms, [0], TINY_ARMS, tmp_path, log=lambda *_: None)
    assert again["runs"] == result["runs"]
    # ... but never one made under another config (here: another step budget)
    from dataclasses import replace

    with pytest.raises(RuntimeError, match=r"runs/ce/seed0 holds a finished run .*differs in train"):
        run_harness(assets, ["ce"], [0], replace(TINY_ARMS, steps=6), tmp_path, log=lambda *_: None)


def _check_report(result: dict, arms: list[str], tmp_path: Path) -> None:
    """Table (with the learning-speed column), significance lines and both plots render."""
    from toyq.summary import acc_auc
    from toyq.report import plot_curves, plot_summary, render

    for arm in arms:
        s = result["summary"][arm]
        assert s["auc_seeds"] == 1 and 0.0 <= s["acc_auc"] <= 1.0
        run = next(r for r in result["runs"] if r["arm"] == arm)
        assert s["acc_auc"] == pytest.approx(acc_auc(run))
    md = render(result, {"note": "smoke"})
    assert "| mean accuracy over training |" in md
    for arm in arms:
        row = next(x for x in md.splitlines() if x.startswith(f"| {arm} |"))
        assert row.split("|")[3].strip() != "-"  # the acc_auc column is filled
    assert "- multi: final accuracy" in md and "(1 seed, no std)" in md
    assert plot_summary(result["summary"], tmp_path / "a.png").stat().st_size > 0
    assert plot_curves(tmp_path, arms, [0], tmp_path / "c.png").stat().st_size > 0


def test_learning_speed_and_paired_significance_from_scores(tmp_path):
    """summarize/format_table/paired_significance on hand-made scores (3 seeds, CE vs one arm,
    plus an old score.json without a curve), checked against values computed by hand."""
    from toyq.summary import format_table, summarize
    from toyq.report import mean_band, paired_diffs, paired_significance

    def run(arm, seed, acc, curve=None):
        r = {"arm": arm, "seed": seed, "accuracy": acc, "bpb": 3.0, "train_s": 1.0}
        return {**r, "curve": curve} if curve is not None else r

    runs = [run("ce", 0, 0.5, [[10, 0.1], [20, 0.5]]), run("ce", 1, 0.2, [[10, 0.0], [20, 0.2]]),
            run("ce", 2, 0.3, [[10, 0.1], [20, 0.3]]),
            run("kd", 0, 0.6, [[10, 0.3], [20, 0.6]]), run("kd", 1, 0.4, [[10, 0.2], [20, 0.4]]),
            run("kd", 2, 0.4, [[10, 0.2], [20, 0.4]]), run("old", 0, 0.1),
            {"arm": "kd", "seed": 3, "error": "boom"}]
    summary = summarize(runs, ["ce", "kd", "old"])
    assert summary["ce"]["acc_auc"] == pytest.approx((0.3 + 0.1 + 0.2) / 3)
    assert summary["kd"]["acc_auc"] == pytest.approx((0.45 + 0.3 + 0.3) / 3)
    assert summary["kd"]["acc_auc_std"] == pytest.approx(statistics.stdev([0.45, 0.3, 0.3]))
    assert summary["old"]["auc_seeds"] == 0 and summary["old"]["acc_auc"] is None
    table = format_table(summary)
    assert "| old | 0.100 ± 0.000 | - | - |" in table       # no format rate, no curve
    assert "| kd | 0.467 ± 0.115 | - | 0.350 ± 0.087 |" in table
    # paired: kd - ce per seed = +0.1, +0.2, +0.1 (accuracy); +0.15, +0.2, +0.1 (acc_auc)
    p = paired_diffs(runs, "kd")
    assert p["seeds"] == [0, 1, 2] and p["accuracy"] == pytest.approx([0.1, 0.2, 0.1])
    assert p["acc_auc"] == pytest.approx([0.15, 0.2, 0.1])
    t = 0.4 / 3 / (statistics.stdev([0.1, 0.2, 0.1]) / math.sqrt(3))
    lines = paired_significance(runs, ["ce", "kd", "old"])
    assert "|t| > 4.30 at n = 3" in lines[0]
    kd = next(x for x in lines if x.startswith("- kd:"))
    assert f"+0.133 ± 0.058 (t = {t:+.1f})" in kd and "better on 3/3" in kd
    assert "mean accuracy over training +0.150 ± 0.050 (t = +5.2)" in kd
    old = next(x for x in lines if x.startswith("- old:"))
    assert "(1 seed, no std)" in old and "over training" not in old
    steps, mean, std = mean_band([[[10, 0.1], [20, 0.5]], [[10, 0.3], [20, 0.5], [30, 0.9]]])
    assert steps == [10, 20] and mean == pytest.approx([0.2, 0.5])
    assert std == pytest.approx([statistics.stdev([0.1, 0.3]), 0.0])


def test_acceptance_line_and_identical_paired_differences():
    """The criterion line names the best cross-tokenizer-only arm (``multi`` and ``same_kd`` have a
    same-tokenizer teacher and do not count) and divides its gain by the larger std; per-seed
    differences that are all equal print no (infinite) t."""
    from toyq.summary import summarize
    from toyq.report import _paired_text, acceptance

    def run(arm, seed, acc):
        return {"arm": arm, "seed": seed, "accuracy": acc, "bpb": 3.0, "train_s": 1.0}

    runs = [run("ce", 0, 0.0), run("ce", 1, 0.1), run("ce", 2, 0.05),
            run("alm", 0, 0.3), run("alm", 1, 0.5), run("alm", 2, 0.4),
            run("multi", 0, 0.9), run("multi", 1, 0.9), run("multi", 2, 0.9),
            run("gold", 0, 0.1), run("gold", 1, 0.1), run("gold", 2, 0.1)]
    summary = summarize(runs, ["ce", "alm", "multi", "gold"])
    line = acceptance(summary)
    assert line.startswith("Best cross-tokenizer arm: alm, +0.350")
    assert "= 3.5 x the larger std (0.100)" in line and line.endswith("met.")
    runs[4], runs[5] = run("alm", 1, 0.25), run("alm", 2, 0.05)  # mean 0.2, std 0.132: 1.1 std
    assert acceptance(summarize(runs, ["ce", "alm", "gold"])).endswith("NOT met.")
    assert acceptance(summarize(runs[:3], ["ce"])) == ""
    assert _paired_text([0.1 + 1e-17, 0.1, 0.1]) == "+0.100 ± 0.000 (identical on every seed)"


def test_results_md_keeps_hand_written_text_and_tagged_blocks(tmp_path):
    from toyq.run import update_results_md

    path = tmp_path / "RESULTS.md"
    update_results_md("first", path)
    path.write_text(path.read_text() + "\nhand-written\n")
    update_results_md("clean table", path, tag="clean")
    update_results_md("second", path)
    update_results_md("clean table 2", path, tag="clean")
    out = path.read_text()
    assert "first" not in out and "clean table\n" not in out and "hand-written" in out
    assert out.count("<!-- GENERATED:BEGIN -->\nsecond\n<!-- GENERATED:END -->") == 1
    assert "<!-- GENERATED:clean:BEGIN -->\nclean table 2\n<!-- GENERATED:clean:END -->" in out


def test_short_arms_need_only_the_cross_teacher(assets, tmp_path):
    """`run.py --short` prepares only teacher_big: its arms must not touch teacher_weak."""
    from toyq.short import SHORT_ARMS

    only_big = {k: v for k, v in assets.items() if k != "teacher_weak"}
    for arm in (*SHORT_ARMS, "onpolicy"):
        cfg = arm_config(arm, 0, only_big, TINY_ARMS, str(tmp_path / arm))
        assert all(t["worker"]["model"] == assets["teacher_big"]["model"] for t in cfg["teachers"])
    with pytest.raises(KeyError):
        arm_config("same_kd", 0, only_big, TINY_ARMS, str(tmp_path / "same_kd"))


def test_short_run_prints_the_table_and_artifacts(tiny_cache, tmp_path, monkeypatch):
    """`run.py --short`'s run(), from a directory that is not the checkout: the harness
    path at a tiny budget (CE-only next to the teacher step, the other arm after); the printed
    table holds each arm's measured accuracy and gain over CE-only, names the noisy-corpus setup,
    says one seed is a hint and what a re-run repeats; progress lines name
    each run."""
    from toyq.short import run

    monkeypatch.chdir(tmp_path)
    printed = []
    result = run("demo", arms=("ce", "pkl_cont"), cache=str(tiny_cache), prep=TINY_PREP,
                 settings=TINY_ARMS, jobs=2, log=printed.append)
    report = printed[-1]
    s = result["summary"]
    gain = s["pkl_cont"]["accuracy"] - s["ce"]["accuracy"]
    assert "pkl_cont" in report and f"({gain:+.3f} vs CE-only)" in report
    assert "50% of its answers wrong" in report and "a hint, not evidence" in report
    assert "repeats these digits bit for bit" in report and "another machine" in report
    for path in result["artifacts"].values():
        assert Path(path).exists()
    assert (tmp_path / "demo" / "runs" / "pkl_cont" / "seed0" / "export" / "config.json").exists()
    for label in ("ce seed 0", "pkl_cont seed 0"):
        assert any(line.startswith(f"[{label}] training: 4 steps") for line in printed)
        assert any(line.startswith(f"[{label}] accuracy") for line in printed)


def test_short_failure_is_one_message_naming_the_log(tiny_cache, tmp_path):
    """A trainer child that fails (here: a generated config the trainer rejects) ends the short
    run with one RunFailed naming the run, the trainer's own error line and the log to read;
    ``run.py`` prints it as one ``error:`` message (no traceback) and exits 1."""
    from dataclasses import replace

    from toyq.runner import RunFailed
    from toyq.short import run
    from xdistill.errors import XDistillError

    bad = replace(TINY_ARMS, eval_batches=0)  # the trainer rejects it: eval.batches must be >= 1
    with pytest.raises(RunFailed) as info:
        run(str(tmp_path / "demo"), arms=("ce", "pkl_cont"), cache=str(tiny_cache),
            prep=TINY_PREP, settings=bad, jobs=2, log=lambda *_: None)
    msg = str(info.value)
    log_path = tmp_path / "demo" / "runs" / "ce" / "seed0" / "config.log"
    assert msg.startswith("ce seed 0: `xdistill train offpolicy --config ")
    assert "xdistill: error: eval.batches must be >= 1, got 0" in msg
    assert msg.endswith(f"Read the log: {log_path}") and log_path.exists()
    assert "Traceback" not in msg and not info.value.cancelled
    assert not (tmp_path / "demo" / "runs" / "pkl_cont" / "seed0" / "score.json").exists()
    assert isinstance(info.value, XDistillError)  # run.py prints it as `error: ...`


def test_continuation_criterion_never_names_a_same_tokenizer_control():
    """In a continuation report the best *cross-tokenizer* on-policy arm is judged: an
    ``op_*_same`` arm (the same-tokenizer control) is not a candidate even when it scores best."""
    from toyq.report import _protocol_lines
    from toyq.summary import summarize

    def run(arm, seed, acc):
        return {"arm": arm, "seed": seed, "accuracy": acc, "bpb": 3.0, "train_s": 1.0}

    for control in ("op_k1_same", "op_k1_same_mean_clip_t2"):   # a flag after `same` too
        accs = {"cont_ce": (0.1, 0.2), "op_k1": (0.15, 0.2), control: (0.5, 0.6)}
        runs = [run(a, s, x) for a, xs in accs.items() for s, x in enumerate(xs)]
        base, lines = _protocol_lines(summarize(runs, list(accs)))
        assert base == "cont_ce"
        assert lines[-1].startswith("Best cross-tokenizer arm: op_k1, +0.025 held-out accuracy "
                                    "over continued CE"), (control, lines[-1])
