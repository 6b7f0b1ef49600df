"""The issue-24 study driver (``benchmarks/quality/study.py``): its fixed choice rules and the
stage order. The stages themselves run the harness (``tests/quality`` covers it)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_path = Path(__file__).resolve().parents[2] / "benchmarks" / "quality" / "study.py"
_spec = importlib.util.spec_from_file_location("quality_study", _path)
study = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(study)


def test_warm_start_is_the_first_checkpoint_at_the_threshold():
    curve = [[100, 0.0], [200, 0.31], [300, 0.29], [400, 0.5]]
    assert study.warm_steps(curve, 0.30) == 200
    assert study.warm_steps(curve, 0.45) == 400
    with pytest.raises(SystemExit, match="never reached"):
        study.warm_steps(curve, 0.9)


def test_lr_choice_best_mean_and_ties_to_the_smaller_rate():
    table = {"1e-05": {"mean": 0.40}, "0.0001": {"mean": 0.45}, "0.001": {"mean": 0.45}}
    assert study.choose_lr(table) == pytest.approx(1e-4)
    table["0.001"]["mean"] = 0.46
    assert study.choose_lr(table) == pytest.approx(1e-3)


def test_rank_orders_by_accuracy_and_marks_collapse():
    runs = [{"arm": a, "seed": s, "accuracy": acc, "format_rate": fmt}
            for a, acc, fmt in (("op_k1", 0.5, 0.95), ("op_bpm", 0.6, 0.99), ("op_k3", 0.7, 0.5))
            for s in (0, 1)]
    runs.append({"arm": "op_dpca", "seed": 0, "error": "failed"})
    rows = study.rank(runs, ("op_k1", "op_k3", "op_bpm", "op_dpca"))
    assert [r["arm"] for r in rows] == ["op_k3", "op_bpm", "op_k1"]
    assert [r["collapsed"] for r in rows] == [True, False, False]


def test_byte_credit_arms_share_their_kinds_control():
    assert study.control_arm("op_k1") == "op_k1_same"
    assert study.control_arm("op_dpca_byte") == "op_dpca_same"
    assert study.control_arm("op_k1_byte_mean_clip") == "op_k1_same_mean_clip"  # same estimator
    # per-token and per-unit baselines coincide over one tokenizer
    assert study.control_arm("op_k1_byte_tmean_clip") == "op_k1_same_mean_clip"
    assert study.control_arm("op_k1_mean") == "op_k1_mean_same"   # not a byte variant: its own


def test_a_stage_needs_the_stages_before_it(tmp_path, capsys):
    with pytest.raises(SystemExit, match="needs warm, lr first"):
        study.main(["--out", str(tmp_path), "--stage", "screen"])
    (tmp_path / "study.json").write_text(json.dumps({"warm": {"steps": 10}}))
    with pytest.raises(SystemExit, match="needs lr first"):
        study.main(["--out", str(tmp_path), "--stage", "screen"])


def _load_v2(monkeypatch):
    monkeypatch.syspath_prepend(str(_path.parent))     # as when the script runs: its folder
    path = _path.with_name("study_v2.py")
    spec = importlib.util.spec_from_file_location("quality_study_v2", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_second_protocol_rules(monkeypatch):
    """study_v2: the warm start is the pilot's best checkpoint (earliest on a tie); each arm's
    rate is its family's, the same-tokenizer control inheriting its kind's; every screened kind
    belongs to exactly one family."""
    v2 = _load_v2(monkeypatch)
    assert v2.best_step([[100, 0.1], [200, 0.19], [300, 0.19], [400, 0.05]]) == 200
    chosen = {"cont_ce": 3e-4, "op_k1_same": 1e-4, "op_simple_same": 3e-5,
              "op_bpm_same": 3e-4, "op_rkl_same": 1e-4}
    assert v2.rate_of("op_k1", chosen) == 1e-4 and v2.rate_of("op_dpca_byte", chosen) == 1e-4
    assert v2.rate_of("op_escd", chosen) == 3e-4 and v2.rate_of("op_escd_same", chosen) == 3e-4
    assert v2.rate_of("op_strict", chosen) == 1e-4 and v2.rate_of("cont_ce", chosen) == 3e-4
    flag = v2.arm_lr_flag(["cont_ce", "op_k1", "op_k1_same"], chosen)
    assert flag == ["--cont-lr", "0.0003", "--arm-lr", "op_k1=0.0001,op_k1_same=0.0001"]
    members = [a for arms in v2.FAMILY.values() for a in arms]
    assert len(members) == len(set(members)) and set(v2.SCREEN_ARMS) <= set(members)
    assert not set(v2.CONFIRM_SEEDS) & {0, 1, 2, 10, 11, 12, 13, 14}   # never used before


def _load_script(monkeypatch, name: str):
    monkeypatch.syspath_prepend(str(_path.parent))     # as when the script runs: its folder
    spec = importlib.util.spec_from_file_location(f"quality_{name}", _path.with_name(name))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fifth_protocol_rates_extend_past_a_grid_end_and_confirm_uses_them(monkeypatch, tmp_path):
    """study_v5's fixed rules, with the harness (which trains; covered by the harness tests)
    replaced by a table of accuracies: continued CE peaks inside the grid, k1 at its top end, so
    k1 alone also runs the rate beyond (and keeps it: it is better still); the confirmation runs
    on fresh seeds, the test half, continued CE and the oracle at CE's rate, the k1 arms at k1's."""
    v5 = _load_script(monkeypatch, "study_v5.py")
    acc = {"cont_ce": {3e-5: 0.20, 1e-4: 0.24, 3e-4: 0.22},
           "op_k1_same": {3e-5: 0.25, 1e-4: 0.28, 3e-4: 0.31, 1e-3: 0.33}}
    calls = []

    def fake_harness(out, args, arms, seeds, steps, extra=()):
        calls.append((out.name, tuple(arms), tuple(seeds), steps, tuple(extra)))
        if "--eval-split" in extra and extra[extra.index("--eval-split") + 1] == "unlabeled_test":
            (out).mkdir(parents=True, exist_ok=True)
            (out / "results.json").write_text(json.dumps({"runs": []}))
            return []
        lr = float(extra[extra.index("--cont-lr") + 1])
        return [{"arm": a, "seed": s, "accuracy": acc[a][lr], "format_rate": 1.0}
                for a in arms for s in seeds]

    monkeypatch.setattr(v5.study, "harness", fake_harness)
    monkeypatch.setattr(v5, "RECORDS", tmp_path / "records")
    assert v5.main(["--out", str(tmp_path / "out"), "--jobs", "1"]) == 0
    state = json.loads((tmp_path / "out" / "study.json").read_text())
    assert state["lr"]["chosen"] == {"cont_ce": 1e-4, "op_k1_same": 1e-3}
    edge = [c for c in calls if c[0] == "lr_0.001"]
    assert [c[1] for c in edge] == [("op_k1_same",)]              # only the arm at the end
    assert all(c[2] == v5.TUNE_SEEDS and "unlabeled_tune" in c[4] for c in calls[:-1])
    name, arms, seeds, steps, extra = calls[-1]
    assert name == "confirm" and arms == v5.CONFIRM_ARMS and steps == v5.WARM_STEPS
    assert "unlabeled_test" in extra and extra[extra.index("--cont-lr") + 1] == "0.0001"
    assert extra[extra.index("--arm-lr") + 1] == \
        "op_k1_same=0.001,op_k1=0.001,op_k1_byte=0.001"
    used = {0, 1, 2, 3, 4, 10, 11, 12, 13, 14, 20, 21, 22, 23, 24, 40, 41, 42, 43, 44,
            50, 51, 52, 53, 54}                                   # every earlier protocol's seeds
    assert len(seeds) >= 10 and not set(seeds) & used
    assert json.loads((tmp_path / "records" / "lr.json").read_text())["0.001"]


def _table_harness(monkeypatch, driver, accuracy) -> list:
    """``driver.study.harness`` replaced by a table: ``accuracy(arm, seed)`` for every run, the
    runs written to ``<out>/results.json`` as the harness does; the calls, in order."""
    calls = []

    def fake_harness(out, args, arms, seeds, steps, extra=()):
        calls.append((out.name, tuple(arms), tuple(seeds), tuple(extra)))
        runs = [{"arm": a, "seed": s, "accuracy": accuracy(a, s), "format_rate": 1.0}
                for a in arms for s in seeds]
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"runs": runs}))
        return runs

    monkeypatch.setattr(driver.study, "harness", fake_harness)
    return calls


@pytest.mark.parametrize("variant_acc, carried", [(0.30, "op_k1_byte_clip"), (0.20, None)])
def test_sixth_protocol_screen_carries_the_best_variant_only_if_it_beats_byte_credit(
        monkeypatch, tmp_path, variant_acc, carried):
    """study_v6's fixed rules, the harness replaced by a table: the screen runs byte-credit k1
    and its three variants on seeds 0-2 of the tuning half at the fifth protocol's k1 rate; the
    best variant is carried only if it beats op_k1_byte, and then the confirmation runs it with
    continued CE, the same-tokenizer control and op_k1_byte on fresh seeds, the test half, and
    tests it against op_k1_byte (paired and Welch); with none carried, no confirmation runs."""
    v6 = _load_script(monkeypatch, "study_v6.py")
    base = {"op_k1_byte": 0.25, "op_k1_byte_mean": 0.24, "op_k1_byte_mean_clip": 0.22,
            "op_k1_byte_clip": variant_acc, "cont_ce": 0.18, "op_k1_same": 0.29}
    calls = _table_harness(monkeypatch, v6, lambda a, s: base[a] + 0.01 * (s % 3)
                           + 0.002 * (s % 2) * (a == "op_k1_byte_clip"))
    monkeypatch.setattr(v6, "RECORDS", tmp_path / "records")
    assert v6.main(["--out", str(tmp_path / "out")]) == 0
    state = json.loads((tmp_path / "out" / "study.json").read_text())
    assert state["screen"]["carried"] == carried
    name, arms, seeds, extra = calls[0]
    assert name == "screen" and arms == v6.SCREEN_ARMS and seeds == (0, 1, 2)
    assert "unlabeled_tune" in extra
    rates = v6.fifth_rates()                         # the fifth protocol's committed choices
    assert extra[extra.index("--cont-lr") + 1] == f"{rates['cont_ce']:g}"
    assert all(f"{a}={rates['op_k1_same']:g}" in extra[extra.index("--arm-lr") + 1]
               for a in v6.SCREEN_ARMS)
    if carried is None:
        assert len(calls) == 1 and state["confirm"] == {"skipped": "no variant carried"}
        return
    name, arms, seeds, extra = calls[1]
    assert name == "confirm" and arms == ("cont_ce", "op_k1_same", "op_k1_byte", carried)
    assert "unlabeled_test" in extra and seeds == tuple(range(70, 80))
    used = {0, 1, 2, 3, 4, 10, 11, 12, 13, 14, 20, 21, 22, 23, 24, 40, 41, 42, 43, 44,
            50, 51, 52, 53, 54, *range(60, 70)}          # every earlier protocol's seeds
    assert not set(seeds) & used
    test = state["confirm"]["primary"]
    assert test["variant"] == carried and test["gain"] == pytest.approx(0.05 + 0.001)
    assert test["seeds_better"] == 10 and test["paired"] < 0.05 and test["welch"] < 0.05
    assert test["passed"]
    assert json.loads((tmp_path / "records" / "confirm.json").read_text())["runs"]


def test_seventh_protocol_tests_the_variant_against_its_fair_control(monkeypatch, tmp_path):
    """study_v7's fixed rules, the harness replaced by a table: continued CE, the same-tokenizer
    control with the same estimator changes and the byte-credit variant, on fresh seeds 80-89 of
    the test half at the fifth protocol's rates; the penalty is read against that control."""
    v7 = _load_script(monkeypatch, "study_v7.py")
    assert v7.ARMS == ("cont_ce", "op_k1_same_mean_clip", "op_k1_byte_mean_clip")
    base = {"cont_ce": 0.15, "op_k1_same_mean_clip": 0.35, "op_k1_byte_mean_clip": 0.30}
    calls = _table_harness(monkeypatch, v7, lambda a, s: base[a] + 0.1 * (s % 3) + 0.003 * (s % 2))
    monkeypatch.setattr(v7, "RECORDS", tmp_path / "records")
    assert v7.main(["--out", str(tmp_path / "out")]) == 0
    ((_, arms, seeds, extra),) = calls
    used = {0, 1, 2, 3, 4, 10, 11, 12, 13, 14, 20, 21, 22, 23, 24, 40, 41, 42, 43, 44,
            50, 51, 52, 53, 54, *range(60, 80)}          # every earlier protocol's seeds
    assert seeds == tuple(range(80, 90)) and not set(seeds) & used
    rates = v7.v6.fifth_rates()
    assert "unlabeled_test" in extra and extra[extra.index("--cont-lr") + 1] == \
        f"{rates['cont_ce']:g}"
    assert extra[extra.index("--arm-lr") + 1] == (f"op_k1_same_mean_clip={rates['op_k1_same']:g},"
                                                  f"op_k1_byte_mean_clip={rates['op_k1_same']:g}")
    state = json.loads((tmp_path / "out" / "study.json").read_text())["confirm"]
    assert state["penalty"] == pytest.approx(1 - 0.15 / 0.20)
    assert state["tests"]["op_k1_same_mean_clip"]["passes"] is True  # gain 0.2 >> spread 0.08


def test_eighth_protocol_reads_both_byte_arms_against_the_same_control(monkeypatch, tmp_path):
    """study_v8's fixed rules, the harness replaced by a table: continued CE, the same-tokenizer
    control, byte credit with the per-unit and with the per-token baseline, on fresh seeds 90-99
    of the test half at the fifth protocol's rates; each byte arm's penalty against the control,
    and the per-token baseline tested directly against the per-unit one."""
    v8 = _load_script(monkeypatch, "study_v8.py")
    assert v8.ARMS == ("cont_ce", "op_k1_same_mean_clip", "op_k1_byte_mean_clip",
                       "op_k1_byte_tmean_clip")
    base = {"cont_ce": 0.15, "op_k1_same_mean_clip": 0.35, "op_k1_byte_mean_clip": 0.30,
            "op_k1_byte_tmean_clip": 0.33}
    calls = _table_harness(monkeypatch, v8, lambda a, s: base[a] + 0.1 * (s % 3)
                           + 0.003 * (s % 2) * (a == "op_k1_byte_tmean_clip"))
    monkeypatch.setattr(v8, "RECORDS", tmp_path / "records")
    assert v8.main(["--out", str(tmp_path / "out")]) == 0
    ((_, arms, seeds, extra),) = calls
    assert seeds == tuple(range(90, 100)) and not set(seeds) & {*range(0, 90)}
    rates = v8.v6.fifth_rates()
    assert "unlabeled_test" in extra
    assert extra[extra.index("--arm-lr") + 1] == ",".join(
        f"{a}={rates['op_k1_same']:g}" for a in v8.ARMS[1:])
    state = json.loads((tmp_path / "out" / "study.json").read_text())["confirm"]
    assert state["penalty"]["op_k1_byte_tmean_clip"] == pytest.approx(1 - (0.18 + 0.0015) / 0.20)
    assert state["penalty"]["op_k1_byte_mean_clip"] == pytest.approx(1 - 0.15 / 0.20)
    direct = state["tmean_vs_mean"]
    assert direct["gain"] == pytest.approx(0.03 + 0.0015)
    # every seed better, but the seeds spread 0.2: the paired test passes, Welch's does not
    assert direct["paired_p"] < 0.05 < direct["welch_p"] and direct["passes"] is False
    assert set(state["tests"]) == {"op_k1_same_mean_clip", "op_k1_byte_mean_clip",
                                   "op_k1_byte_tmean_clip"}


def test_ninth_protocol_splits_the_penalty_into_credit_and_model(monkeypatch, tmp_path):
    """study_v9's fixed rules, the harness replaced by a table: continued CE and the three k1
    arms (A same teacher + token credit, B same teacher + byte credit, C cross teacher + byte
    credit) on fresh seeds 100-119 of the test half at the fifth protocol's rates; B - A and
    C - B tested (Holm over two), their shares of A's gain add up to C's penalty."""
    v9 = _load_script(monkeypatch, "study_v9.py")
    A, B, C = v9.SAME, v9.TWIN, v9.CROSS
    assert v9.ARMS == ("cont_ce", "op_k1_same_mean_clip", "op_k1_twin_byte_mean_clip",
                       "op_k1_byte_mean_clip")
    base = {"cont_ce": 0.15, A: 0.35, B: 0.34, C: 0.31}
    # B - A: -0.01 on every seed but one (a clear paired difference); C - B alternates
    calls = _table_harness(monkeypatch, v9, lambda a, s: base[a] + 0.1 * (s % 3)
                           + (0.01 if a == B and s == 100 else 0)
                           + (0.04 * (s % 2) if a == C else 0))
    monkeypatch.setattr(v9, "RECORDS", tmp_path / "records")
    assert v9.main(["--out", str(tmp_path / "out")]) == 0
    ((_, arms, seeds, extra),) = calls
    assert arms == v9.ARMS and seeds == tuple(range(100, 120))
    assert not set(seeds) & {*range(0, 100)}                # no seed of an earlier protocol
    assert "unlabeled_test" in extra
    state = json.loads((tmp_path / "out" / "study.json").read_text())["confirm"]
    assert set(state["tests"]) == {A, B, C}
    d = state["decomposition"]
    gA, gB, gC = (d["gains"][a] for a in (A, B, C))
    assert gA == pytest.approx(0.20) and gB == pytest.approx(0.19 + 0.01 / 20)
    assert gC == pytest.approx(0.16 + 0.02)
    assert d["credit"]["difference"] == pytest.approx(gB - gA)
    assert d["model"]["difference"] == pytest.approx(gC - gB)
    shares = d["credit"]["share_of_penalty_points"] + d["model"]["share_of_penalty_points"]
    assert shares == pytest.approx(d["penalty"]) and d["penalty"] == pytest.approx(1 - gC / gA)
    assert d["penalty_interval"][0] <= d["penalty"] <= d["penalty_interval"][1]
    assert d["credit"]["paired_holm"] < 0.05 and d["credit"]["passes"] is False  # a loss
    assert state["penalty_point"] == pytest.approx(d["penalty"])


def test_pooled_penalty_from_raw_confirmations(monkeypatch, tmp_path):
    """penalty_pool: the per-protocol and pooled penalties from raw confirmation runs (seeds
    missing an arm left out), a bootstrap interval around the pooled value, the generated block
    written between its markers; equal gains give a penalty of exactly 0."""
    from toyq.stats import penalty_interval

    pool = _load_script(monkeypatch, "penalty_pool.py")
    acc = {"cont_ce": 0.1, pool.SAME: 0.3, pool.CROSS: 0.25}
    for k, name in enumerate(("pa", "pb")):
        runs = [{"arm": a, "seed": 10 * k + s, "accuracy": v + 0.01 * s + (0.02 * k if a == pool.CROSS else 0)}
                for a, v in acc.items() for s in range(4)]
        runs.append({"arm": pool.CROSS, "seed": 99, "error": "boom"})
        (tmp_path / name).mkdir()
        (tmp_path / name / "confirm.json").write_text(json.dumps({"runs": runs}))
    monkeypatch.setattr(pool, "HERE", tmp_path)
    monkeypatch.setattr(pool, "SOURCES", ("pa", "pb"))
    results = tmp_path / "RESULTS.md"
    results.write_text("# notes\n")
    assert pool.main(["--results", str(results)]) == 0
    text = results.read_text()
    assert "<!-- GENERATED:penalty24:BEGIN -->" in text and text.startswith("# notes")
    assert "| pa | 0-3 (4) | +0.200 | +0.150 | 0.25 |" in text
    assert "| pb | 10-13 (4) | +0.200 | +0.170 | 0.15 |" in text
    assert "penalty **0.200**" in text                   # 1 - 0.16 / 0.2
    pen, lo, hi = penalty_interval([[(0.2, 0.15)] * 3 + [(0.3, 0.1)], [(0.1, 0.1)] * 4], draws=500)
    assert lo <= pen <= hi and lo < hi
    assert penalty_interval([[(0.2, 0.2), (0.3, 0.3)]], draws=50) == (0.0, 0.0, 0.0)


def test_tenth_protocol_tests_clipped_mean_against_mean_per_teacher(monkeypatch, tmp_path):
    """study_v10's fixed rules, the harness replaced by a table: continued CE and four k1 arms
    (each teacher with the mean and the clipped_mean baseline) on fresh seeds 120-129 of the test
    half; clipped_mean against mean per teacher (Holm over two, decided on the paired test), each
    estimator's penalty, and the issue's penalty read from the larger same-tokenizer gain."""
    v10 = _load_script(monkeypatch, "study_v10.py")
    A, C, A2, C2 = v10.SAME, v10.CROSS, v10.SAME_C, v10.CROSS_C
    assert v10.ARMS == ("cont_ce", "op_k1_same_mean_clip", "op_k1_byte_mean_clip",
                        "op_k1_same_cmean_clip", "op_k1_byte_cmean_clip")
    base = {"cont_ce": 0.15, A: 0.35, C: 0.30, A2: 0.37, C2: 0.34}
    # the clipped arms gain on every seed, with seed-to-seed spread (paired clear, Welch not)
    calls = _table_harness(monkeypatch, v10, lambda a, s: base[a] + 0.1 * (s % 3)
                           + (0.005 * (s % 2) if a in (A2, C2) else 0))
    monkeypatch.setattr(v10, "RECORDS", tmp_path / "records")
    assert v10.main(["--out", str(tmp_path / "out")]) == 0
    ((_, arms, seeds, extra),) = calls
    assert arms == v10.ARMS and seeds == tuple(range(120, 130))
    assert not set(seeds) & {*range(0, 120)}                # no seed of an earlier protocol
    assert "unlabeled_test" in extra
    state = json.loads((tmp_path / "out" / "study.json").read_text())["confirm"]
    assert set(state["tests"]) == {A, C, A2, C2}
    tests = state["clipped_vs_mean"]
    assert tests["same"]["difference"] == pytest.approx(0.02 + 0.0025)
    assert tests["cross"]["difference"] == pytest.approx(0.04 + 0.0025)
    for t in tests.values():
        assert t["passes_paired"] and not t["passes_both"] and t["welch_holm"] > 0.05
    g = state["gains"]
    assert state["penalty_estimator"] == "clipped_mean"     # A' gains more than A
    assert state["penalties"]["mean"]["penalty"] == pytest.approx(1 - g[C] / g[A])
    assert state["penalty"] == pytest.approx(1 - g[C2] / g[A2])
    lo, hi = state["penalties"]["clipped_mean"]["interval"]
    assert lo <= state["penalty"] <= hi


def test_eleventh_protocol_reads_the_penalty_over_two_teachers_of_each_tokenizer(monkeypatch,
                                                                                  tmp_path):
    """study_v11's fixed rules, the harness replaced by a table: continued CE and four k1 arms
    (two teachers of each tokenizer) on fresh seeds 130-139 of the test half; the teacher effect
    within each tokenizer (Holm over two, paired), the penalty over both teachers against the
    0.2 goal, the four one-teacher-each penalties and the tokenizer effect."""
    v11 = _load_script(monkeypatch, "study_v11.py")
    A, A2, C, C2 = v11.SAME, v11.SAME2, v11.CROSS, v11.CROSS2
    assert v11.ARMS == ("cont_ce", "op_k1_same_mean_clip", "op_k1_same_mean_clip_t2",
                        "op_k1_byte_mean_clip", "op_k1_byte_mean_clip_t2")
    base = {"cont_ce": 0.15, A: 0.35, A2: 0.31, C: 0.32, C2: 0.30}
    # the second same-tokenizer teacher is worse on every seed by 0.04 (+ a little spread)
    calls = _table_harness(monkeypatch, v11, lambda a, s: base[a] + 0.1 * (s % 3)
                           + (0.005 * (s % 2) if a == A2 else 0))
    monkeypatch.setattr(v11, "RECORDS", tmp_path / "records")
    assert v11.main(["--out", str(tmp_path / "out")]) == 0
    ((_, arms, seeds, extra),) = calls
    assert arms == v11.ARMS and seeds == tuple(range(130, 140))
    assert not set(seeds) & {*range(0, 130)}                # no seed of an earlier protocol
    assert "unlabeled_test" in extra
    state = json.loads((tmp_path / "out" / "study.json").read_text())["confirm"]
    assert set(state["tests"]) == {A, A2, C, C2}
    effect = state["teacher_effect"]
    assert effect["same"]["difference"] == pytest.approx(-0.04 + 0.0025)
    assert effect["same"]["differs_paired"] and effect["same"]["welch_holm"] > 0.05
    assert effect["cross"]["difference"] == pytest.approx(-0.02)
    g = state["gains"]
    both = state["penalties"]["both_teachers"]
    assert both["penalty"] == pytest.approx(1 - (g[C] + g[C2]) / (g[A] + g[A2]))
    assert both["met"] == (both["penalty"] <= 0.2) and both["goal"] == 0.2
    lo, hi = both["interval"]
    assert lo <= both["penalty"] <= hi
    pairs = state["penalties"]["one_teacher_each"]
    assert set(pairs) == {f"{s}/{c}" for s in (A, A2) for c in (C, C2)}
    assert pairs[f"{A}/{C}"]["penalty"] == pytest.approx(1 - g[C] / g[A])
    tok = state["tokenizer_effect"]
    assert tok["difference"] == pytest.approx((g[A] + g[A2] - g[C] - g[C2]) / 2)


def test_twelfth_protocol_tests_student_token_units_against_chunk_units(monkeypatch, tmp_path):
    """study_v12's fixed rules, the harness replaced by a table: the eleventh protocol's five
    arms reused (their finished folders linked from ``--reuse``) next to two new arms (byte
    credit on student-token units, each cross teacher) on seeds 130-139 of the test half; the
    unit effect per cross teacher (Holm over two, paired), over both, the penalty with token
    units, and the reuse check (one reused run retrained must equal its record exactly)."""
    v12 = _load_script(monkeypatch, "study_v12.py")
    A, A2, C, C2, D, D2 = v12.SAME, v12.SAME2, v12.CROSS, v12.CROSS2, v12.TOK, v12.TOK2
    assert v12.ARMS == ("cont_ce", A, A2, C, C2, "op_k1_byte_tok_mean_clip",
                        "op_k1_byte_tok_mean_clip_t2")
    base = {"cont_ce": 0.15, A: 0.35, A2: 0.37, C: 0.27, C2: 0.31, D: 0.30, D2: 0.33}
    calls = _table_harness(monkeypatch, v12, lambda a, s: base[a] + 0.1 * (s % 3)
                           + (0.005 * (s % 2) if a == D else 0))
    monkeypatch.setattr(v12, "RECORDS", tmp_path / "records")
    reuse = tmp_path / "v11runs"
    for arm in ("ce", "cont_ce", A):
        (reuse / arm / "seed130").mkdir(parents=True)
    eleventh = {"runs": [{"arm": C, "seed": 130, "accuracy": base[C] + 0.1 * (130 % 3),
                          "format_rate": 1.0}]}
    monkeypatch.setattr(v12, "ELEVENTH", tmp_path / "eleventh.json")
    (tmp_path / "eleventh.json").write_text(json.dumps(eleventh))
    out = tmp_path / "out"
    assert v12.main(["--out", str(out), "--reuse", str(reuse)]) == 0
    (_, arms, seeds, extra), (repro_out, r_arms, r_seeds, _) = calls
    assert arms == v12.ARMS and seeds == tuple(range(130, 140)) and "unlabeled_test" in extra
    assert (r_arms, r_seeds) == ((C,), (130,)) and repro_out == "repro"
    r_extra = calls[1][3]
    assert r_extra[r_extra.index("--report-dir") + 1] == str(out / "repro" / "report")
    linked = out / "confirm" / "runs" / A / "seed130"
    assert linked.is_symlink() and linked.resolve() == (reuse / A / "seed130").resolve()
    # a later invocation finds the same links (and counts them)
    assert v12.link_runs(reuse, out / "confirm" / "runs", v12.REUSED, v12.SEEDS) == 3
    state = json.loads((out / "study.json").read_text())
    conf = state["confirm"]
    assert conf["linked_runs"] == 3 and set(conf["tests"]) == {A, A2, C, C2, D, D2}
    per = conf["unit_effect"]["per_teacher"]
    assert per["first"]["difference"] == pytest.approx(0.03 + 0.0025)
    assert per["second"]["difference"] == pytest.approx(0.02)
    assert per["first"]["raises_paired"] and per["first"]["welch_holm"] > 0.05
    g = conf["gains"]
    assert conf["unit_effect"]["both_teachers"]["difference"] == pytest.approx(
        (g[D] + g[D2] - g[C] - g[C2]) / 2)
    tok = conf["penalties"]["token_units"]
    assert tok["penalty"] == pytest.approx(1 - (g[D] + g[D2]) / (g[A] + g[A2]))
    assert tok["met"] == (tok["penalty"] <= 0.2) and tok["interval"][0] <= tok["penalty"]
    assert conf["penalties"]["chunk_units"]["penalty"] == pytest.approx(
        1 - (g[C] + g[C2]) / (g[A] + g[A2]))
    assert set(conf["penalties"]["one_teacher_each"]) == {f"{s}/{c}" for s in (A, A2)
                                                          for c in (D, D2)}
    assert state["repro"]["identical"] and state["repro"]["fields"]["accuracy"]
    assert not v12.repro_check({"arm": C, "seed": 1, "accuracy": 0.5, "bpb": 2.0},
                               {"accuracy": 0.5, "bpb": 2.0000001})["identical"]
    assert v12.repro_check({"arm": C, "seed": 1, "accuracy": 0.5, "bpb": 2.0},
                           {"accuracy": 0.5, "bpb": 2.0})["identical"]


def test_thirteenth_protocol_takes_the_teacher_as_the_unit(monkeypatch, tmp_path):
    """study_v13's fixed rules, the harness replaced by a table: continued CE and eight k1 arms
    (four teachers of each tokenizer) on fresh seeds 140-142 of the test half; the teacher-level
    Welch test of the tokenizer effect (with its exact permutation p), the penalty over the four
    teachers of each tokenizer with a teachers-and-seeds interval, and per-teacher rows."""
    v13 = _load_script(monkeypatch, "study_v13.py")
    assert v13.ARMS[0] == "cont_ce" and len(v13.SAME) == len(v13.CROSS) == 4
    assert v13.TEACHER_OF["op_k1_byte_mean_clip_t3"] == "teacher_big_t3"
    assert v13.TEACHER_OF["op_k1_same_mean_clip"] == "teacher_same_big"
    same_gain = dict(zip(v13.SAME, (0.20, 0.24, 0.22, 0.26)))
    cross_gain = dict(zip(v13.CROSS, (0.10, 0.12, 0.14, 0.16)))
    gain = {"cont_ce": 0.0, **same_gain, **cross_gain}
    calls = _table_harness(monkeypatch, v13, lambda a, s: 0.15 + gain[a] + 0.05 * (s % 3))
    monkeypatch.setattr(v13, "RECORDS", tmp_path / "records")
    monkeypatch.setattr(v13, "RESULTS_MD", tmp_path / "RESULTS.md")
    assert v13.main(["--out", str(tmp_path / "out")]) == 0
    block = (tmp_path / "RESULTS.md").read_text()
    assert "GENERATED:credit24v13teachers:BEGIN" in block
    assert "| op_k1_byte_mean_clip_t4 | teacher_big_t4 | cross | - | +0.160 |" in block
    assert "holds (p < 0.05): **yes**" in block and "goal <= 0.2: **not met**" in block
    ((_, arms, seeds, extra),) = calls
    assert arms == v13.ARMS and seeds == (140, 141, 142)
    assert not set(seeds) & {*range(0, 140)}                # no seed of an earlier protocol
    assert "unlabeled_test" in extra
    state = json.loads((tmp_path / "out" / "study.json").read_text())["confirm"]
    te = state["tokenizer_effect"]
    assert te["difference"] == pytest.approx(0.23 - 0.13)
    assert te["holds"] and te["welch_p"] < 0.01
    assert te["permutation_p"] == pytest.approx(2 / 70)    # the two most extreme splits of 70
    pen = state["penalty"]
    assert pen["penalty"] == pytest.approx(1 - 0.13 / 0.23)
    assert pen["met"] is False and pen["goal"] == 0.2
    lo, hi = pen["interval"]
    assert lo <= pen["penalty"] <= hi and hi - lo > 0.05   # teachers resampled: not a point
    rows = state["per_teacher"]["teachers"]
    assert rows["op_k1_byte_mean_clip_t4"]["gain"] == pytest.approx(0.16)
    assert rows["op_k1_byte_mean_clip_t4"]["teacher"] == "teacher_big_t4"
    assert state["seed_effect"]["per_seed"] == pytest.approx([0.10] * 3)
    assert state["collapsed"] == []


def test_thirteenth_protocol_permutation_p_against_enumeration(monkeypatch):
    """The exact permutation p: identical groups give 1, fully separated groups of four 2/70,
    and one overlap is counted split by split."""
    v13 = _load_script(monkeypatch, "study_v13.py")
    assert v13.permutation_p([0.1] * 4, [0.1] * 4) == 1.0
    assert v13.permutation_p([5, 6, 7, 8], [1, 2, 3, 4]) == pytest.approx(2 / 70)
    # observed |mean diff| 3.5: a split is as extreme when its first group sums to >= 25 or <= 11
    # (of 36): {5,6,7,8}, {4,6,7,8} and their mirrors {1,2,3,4}, {1,2,3,5}
    assert v13.permutation_p([4, 6, 7, 8], [1, 2, 3, 5]) == pytest.approx(4 / 70)


def test_fourteenth_protocol_discount_against_per_unit_k1(monkeypatch, tmp_path):
    """study_v14's fixed rules, the harness replaced by a table: continued CE, the eight
    discounted k1 arms and the thirteenth protocol's eight per-unit arms (same teachers) on fresh
    seeds 150-152 of the test half; the thirteenth protocol's teacher-level analysis of the
    discounted arms, (C) each teacher's discounted gain against its per-unit gain on the same
    seeds, (D) the same-tokenizer gains > 0."""
    v14 = _load_script(monkeypatch, "study_v14.py")
    v13 = v14.v13
    assert v14.ARMS[:9] == ("cont_ce", *v14.SAME, *v14.CROSS)
    assert set(v14.ARMS[9:]) == set(v13.SAME + v13.CROSS) and len(v14.SAME) == 4
    assert v14.BEFORE["op_k1_byte_mean_clip_g1_t3"] == "op_k1_byte_mean_clip_t3"
    assert v14.TEACHER_OF["op_k1_same_mean_clip_g1_t2"] == "teacher_same_big_t2"
    # per-unit: same gains 0.20-0.26, cross 0.10-0.16 (penalty 1 - 0.13 / 0.23); discounted:
    # same gains unchanged, cross gains +0.08 each (penalty 1 - 0.21 / 0.23)
    same = (0.20, 0.24, 0.22, 0.26)
    gain = {"cont_ce": 0.0, **dict(zip(v13.SAME, same)), **dict(zip(v14.SAME, same)),
            **dict(zip(v13.CROSS, (0.10, 0.12, 0.14, 0.16))),
            **dict(zip(v14.CROSS, (0.18, 0.20, 0.22, 0.24)))}
    calls = _table_harness(monkeypatch, v14, lambda a, s: 0.15 + gain[a] + 0.05 * (s % 3))
    monkeypatch.setattr(v14, "RECORDS", tmp_path / "records")
    monkeypatch.setattr(v14, "RESULTS_MD", tmp_path / "RESULTS.md")
    assert v14.main(["--out", str(tmp_path / "out")]) == 0
    ((_, arms, seeds, extra),) = calls
    assert arms == v14.ARMS and seeds == (150, 151, 152) and "unlabeled_test" in extra
    assert not set(seeds) & {*range(0, 150)}                # no seed of an earlier protocol
    state = json.loads((tmp_path / "out" / "study.json").read_text())["confirm"]
    assert state["penalty"]["penalty"] == pytest.approx(1 - 0.21 / 0.23)
    c = state["against_per_unit"]
    assert c["seeds"] == [150, 151, 152]
    assert c["tests"]["cross"]["change"] == pytest.approx([0.08] * 4)
    assert c["tests"]["same"]["change"] == pytest.approx([0.0] * 4, abs=1e-12)
    assert c["tests"]["cross"]["paired_p"] < 1e-6
    assert c["penalty_per_unit"] == pytest.approx(1 - 0.13 / 0.23)
    assert c["penalty_change"] == pytest.approx((1 - 0.21 / 0.23) - (1 - 0.13 / 0.23))
    lo, hi = c["penalty_change_interval"]
    assert lo <= c["penalty_change"] <= hi and hi < 0
    assert state["same_positive"]["holds"] and state["same_positive"]["mean"] == pytest.approx(0.23)
    block = (tmp_path / "RESULTS.md").read_text()
    assert "GENERATED:credit24v14teachers:BEGIN" in block
    assert "GENERATED:credit24v14change:BEGIN" in block
    assert "| cross-tokenizer | +0.080, +0.080, +0.080, +0.080 | +0.080 |" in block
    assert "| op_k1_byte_mean_clip_g1_t4 | teacher_big_t4 | cross | - | +0.240 |" in block


def _fourteenth_record(monkeypatch, tmp_path, v13, v14) -> None:
    """The fourteenth protocol's per-unit record (same 0.20-0.26, cross 0.10-0.16 over continued
    CE on seeds 150-152), in place of ``v14.RECORDS``."""
    old = {"cont_ce": 0.0, **dict(zip(v13.SAME, (0.20, 0.24, 0.22, 0.26))),
           **dict(zip(v13.CROSS, (0.10, 0.12, 0.14, 0.16)))}
    records = tmp_path / "v14records"
    records.mkdir()
    (records / "confirm.json").write_text(json.dumps({"runs": [
        {"arm": a, "seed": s, "accuracy": 0.15 + g, "format_rate": 1.0}
        for a, g in old.items() for s in (150, 151, 152)]}))
    monkeypatch.setattr(v14, "RECORDS", records)


def test_fifteenth_protocol_takes_the_stop_advantage_out(monkeypatch, tmp_path):
    """study_v15's fixed rules, the harness replaced by a table: continued CE and eight k1 arms
    with ``loss.stop_advantage: zero`` on fresh seeds 160-162 of the test half; the teacher-level
    analysis, each teacher's change against its per-unit gain read from the fourteenth
    protocol's record, the same-tokenizer gains > 0, and each arm's final stop fraction read from
    its metrics."""
    v15 = _load_script(monkeypatch, "study_v15.py")
    v13, v14 = v15.v13, v15.v14
    assert v15.ARMS[0] == "cont_ce" and len(v15.SAME) == len(v15.CROSS) == 4
    assert v15.BEFORE["op_k1_byte_mean_clip_zstop_t4"] == "op_k1_byte_mean_clip_t4"
    from toyq.continued import loss_options
    assert loss_options("op_k1_byte_mean_clip_zstop_t2")["stop_advantage"] == "zero"
    _fourteenth_record(monkeypatch, tmp_path, v13, v14)
    new = {"cont_ce": 0.0, **dict(zip(v15.SAME, (0.20, 0.24, 0.22, 0.26))),
           **dict(zip(v15.CROSS, (0.20, 0.22, 0.24, 0.26)))}
    calls = _table_harness(monkeypatch, v15, lambda a, s: 0.15 + new[a] + 0.05 * (s % 3))
    out = tmp_path / "out"
    metrics = out / "confirm" / "runs" / "op_k1_byte_mean_clip_zstop_t3" / "seed160"
    metrics.mkdir(parents=True)
    (metrics / "metrics.jsonl").write_text('{"step": 10, "stop_fraction": 0.3}\n'
                                           '{"step": 20, "stop_fraction": 0.25}\n')
    monkeypatch.setattr(v15, "RECORDS", tmp_path / "records")
    monkeypatch.setattr(v15, "RESULTS_MD", tmp_path / "RESULTS.md")
    assert v15.main(["--out", str(out)]) == 0
    ((_, arms, seeds, extra),) = calls
    assert arms == v15.ARMS and seeds == (160, 161, 162) and "unlabeled_test" in extra
    assert not set(seeds) & {*range(0, 160)}                # no seed of an earlier protocol
    state = json.loads((out / "study.json").read_text())["confirm"]
    assert state["penalty"]["penalty"] == pytest.approx(1 - 0.23 / 0.23, abs=1e-9)
    c = state["against_per_unit"]
    assert c["seeds_before"] == [150, 151, 152]
    assert c["change"]["op_k1_byte_mean_clip_zstop_t2"] == pytest.approx(0.10)
    assert c["mean_change"]["same"] == pytest.approx(0.0, abs=1e-12)
    assert c["penalty_per_unit"] == pytest.approx(1 - 0.13 / 0.23)
    assert state["same_positive"]["holds"]
    assert state["stop_fraction_end"]["op_k1_byte_mean_clip_zstop_t3"] == 0.25
    assert state["stop_fraction_end"]["op_k1_byte_mean_clip_zstop"] is None
    block = (tmp_path / "RESULTS.md").read_text()
    assert "GENERATED:credit24v15teachers:BEGIN" in block and "credit24v15change:BEGIN" in block
    assert "| op_k1_byte_mean_clip_zstop_t3 | +0.100 | 0.25 |" in block


def test_sixteenth_protocol_retrains_teachers_on_one_problem_per_document(monkeypatch, tmp_path):
    """study_v16's fixed rules, the harness and the stop diagnostic replaced by tables: the task
    flags ask for one problem per teacher document; continued CE and the thirteenth protocol's
    eight arms on fresh seeds 170-172 of the test half; each arm's change against the same arm in
    the fourteenth protocol's record; then (M), which fails when one teacher finds the end after a
    stopped answer e times less likely than the student."""
    v16 = _load_script(monkeypatch, "study_v16.py")
    v13, v14 = v16.v13, v16.v15.v14
    i = v16.TASK.index("--teacher-per-doc")
    assert v16.TASK[i + 1] == "1" and v16.TASK[:i] == v16.v5.TASK
    assert (v16.SAME, v16.CROSS) == (v13.SAME, v13.CROSS) and v16.ARMS[0] == "cont_ce"
    _fourteenth_record(monkeypatch, tmp_path, v13, v14)
    new = {"cont_ce": 0.0, **dict(zip(v13.SAME, (0.20, 0.24, 0.22, 0.26))),
           **dict(zip(v13.CROSS, (0.18, 0.22, 0.22, 0.22)))}
    calls = _table_harness(monkeypatch, v16, lambda a, s: 0.15 + new[a] + 0.05 * (s % 3))
    monkeypatch.setattr(v16, "RECORDS", tmp_path / "records")
    monkeypatch.setattr(v16, "RESULTS_MD", tmp_path / "RESULTS.md")
    out = tmp_path / "out"
    assert v16.main(["--out", str(out), "--stage", "confirm"]) == 0
    ((_, arms, seeds, extra),) = calls
    assert arms == v16.ARMS and seeds == (170, 171, 172) and "unlabeled_test" in extra
    state = json.loads((out / "study.json").read_text())["confirm"]
    assert state["penalty"]["penalty"] == pytest.approx(1 - 0.21 / 0.23)
    c = state["against_old_teachers"]
    assert c["seeds_before"] == [150, 151, 152]
    assert c["change"]["op_k1_byte_mean_clip_t2"] == pytest.approx(0.10)
    assert c["mean_change"]["same"] == pytest.approx(0.0, abs=1e-12)
    assert state["same_positive"]["holds"]
    block = (tmp_path / "RESULTS.md").read_text()
    assert "GENERATED:credit24v16teachers:BEGIN" in block and "credit24v16change:BEGIN" in block
    assert "| op_k1_byte_mean_clip_t2 | +0.100 | - |" in block

    record_file = tmp_path / "stop_units.json"
    rows = [{"seed": s, "arm": arm, "start": {"stop": {"n": 3, "rest_r": 0.4 - 2.0 * (arm == "X2")
                                                       + 0.1 * (s % 2)}}}
            for s in (170, 171) for arm in v16.stop_units.ARMS]
    ran = []
    monkeypatch.setattr(v16.stop_units, "main", lambda argv: ran.append(argv) or
                        record_file.write_text(json.dumps({"arms": v16.stop_units.ARMS,
                                                           "rows": rows})) and 0)
    monkeypatch.setattr(v16.stop_units, "record_path", lambda protocol: record_file)
    assert v16.main(["--out", str(out), "--stage", "stops"]) == 0
    assert ran == [["--protocol", "v16", "--runs", str(out)]]
    m = json.loads((out / "study.json").read_text())["stops"]
    assert m["stop_rest_r"]["X1"] == pytest.approx(0.45) and m["stop_rest_r"]["X2"] == pytest.approx(-1.55)
    assert not m["passes"]
    rows = [r for r in rows if r["arm"] != "X2"]                   # a teacher without a stop
    assert not v16.manipulation_check({"arms": v16.stop_units.ARMS, "rows": rows})["passes"]
    rows = [r for r in rows if r["arm"] == "X1"]
    assert v16.manipulation_check({"arms": {"X1": "a"}, "rows": rows})["passes"]


def test_seventeenth_protocol_matches_the_cross_teachers_accuracy(monkeypatch, tmp_path):
    """study_v17's fixed rules, the teachers' preparation and scoring and the harness replaced by
    tables: the pilot asks for the seed-0 cross-tokenizer teacher at every budget and the four
    same-tokenizer teachers, and picks the budget whose validation accuracy is nearest their mean
    (a tie: the larger); the confirmation runs continued CE, S, X and the matched arms M on fresh
    seeds 180-182 of the test half; (A)/(B) compare S with M, (F) X with M, (R) S with X, with
    Holm over (B) and (F), and (Q) checks the matched teachers' validation accuracy."""
    v17 = _load_script(monkeypatch, "study_v17.py")
    v13 = v17.v13
    assert v17.TASK == v17.v16.TASK and (v17.SAME, v17.CROSS) == (v13.SAME, v13.CROSS)
    assert v17.choose_budget({500: 0.60, 750: 0.70, 1000: 0.80}, 0.75) == 1000   # tie: larger
    assert v17.choose_budget({500: 0.60, 750: 0.70, 1000: 0.80}, 0.74) == 750
    valid = {**{t: a for t, a in zip(v17.SAME_TEACHERS, (0.60, 0.66, 0.80, 0.78))},
             **{f"teacher_big_s{n}": a for n, a in zip(v17.BUDGETS,
                                                      (0.05, 0.30, 0.55, 0.72, 0.86, 0.90))},
             **{f"teacher_big_s1000{s}": a for s, a in (("_t2", 0.70), ("_t3", 0.74),
                                                        ("_t4", 0.66))}}
    asked = []

    def fake_prepared(args, teachers):
        asked.append(list(teachers))
        return {"corpus": {"valid": [[1, 2]] * 150},
                **{t: {"model": t, "accuracy": valid[t] - 0.01} for t in teachers}}

    monkeypatch.setattr(v17, "prepared", fake_prepared)
    monkeypatch.setattr(v17, "valid_accuracy", lambda assets, names: {n: valid[n] for n in names})
    monkeypatch.setattr(v17, "RECORDS", tmp_path / "records")
    monkeypatch.setattr(v17, "RESULTS_MD", tmp_path / "RESULTS.md")
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match="needs pilot"):
        v17.main(["--out", str(out), "--stage", "confirm"])
    assert v17.main(["--out", str(out), "--stage", "pilot"]) == 0
    assert asked[0] == [*(f"teacher_big_s{n}" for n in v17.BUDGETS), *v17.SAME_TEACHERS]
    pilot = json.loads((tmp_path / "records" / "pilot.json").read_text())
    assert pilot["target"] == pytest.approx(0.71) and pilot["chosen_steps"] == 1000
    assert pilot["budgets"]["1000"]["test_accuracy"] == pytest.approx(0.71)

    matched = v17.matched_arms(1000)
    assert matched[3] == "op_k1_byte_mean_clip_s1000_t4"
    gain = {"cont_ce": 0.0, **dict(zip(v13.SAME, (0.20, 0.24, 0.22, 0.26))),
            **dict(zip(v13.CROSS, (0.10, 0.12, 0.14, 0.16))),
            **dict(zip(matched, (0.20, 0.22, 0.24, 0.26)))}
    calls = _table_harness(monkeypatch, v17, lambda a, s: 0.15 + gain[a] + 0.05 * (s % 3))
    assert v17.main(["--out", str(out), "--stage", "confirm"]) == 0
    ((_, arms, seeds, extra),) = calls
    assert arms == ("cont_ce", *v13.SAME, *v13.CROSS, *matched)
    assert seeds == (180, 181, 182) and "unlabeled_test" in extra
    assert asked[1] == [f"teacher_big_s1000{s}" for s in ("", "_t2", "_t3", "_t4")]
    state = json.loads((out / "study.json").read_text())["confirm"]
    assert state["penalty"]["penalty"] == pytest.approx(1 - 0.23 / 0.23, abs=1e-9)
    assert state["penalty_full"]["penalty"] == pytest.approx(1 - 0.13 / 0.23)
    f = state["length_effect"]
    assert f["difference"] == pytest.approx(0.13 - 0.23)
    assert f["full_gains"] == pytest.approx([0.10, 0.12, 0.14, 0.16])
    from toyq.stats import holm
    assert [state["holm"]["tokenizer_effect"], state["holm"]["length_effect"]] == pytest.approx(
        holm([state["tokenizer_effect"]["welch_p"], f["welch_p"]]))
    q = state["equal_accuracy"]
    assert q["matched_mean"] == pytest.approx((0.72 + 0.70 + 0.74 + 0.66) / 4) and q["passes"]
    assert state["same_positive"]["holds"]
    block = (tmp_path / "RESULTS.md").read_text()
    assert "GENERATED:credit24v17teachers:BEGIN" in block and "credit24v17budget:BEGIN" in block
    assert "| teacher_big_s1000_t3 | 0.740 | +0.240 | teacher_big_t3 | +0.140 |" in block
    assert "(Q) matched teachers' mean validation accuracy 0.705" in block


def test_eighteenth_protocol_matches_each_cross_teacher_to_its_partner(monkeypatch, tmp_path):
    """study_v18's fixed rules, the teachers' preparation and scoring and the harness replaced by
    tables: the pilot asks for every seed at every budget and picks, per seed, the budget nearest
    that seed's same-tokenizer teacher (a tie: the larger); (Q) needs every pair within 0.10 and
    the means within 0.05; the confirmation runs continued CE, S and the matched arms on fresh
    seeds 190-192 of the test half, and pairs the teachers by seed."""
    v18 = _load_script(monkeypatch, "study_v18.py")
    v13 = v18.v13
    targets = dict(zip(v18.SAME_TEACHERS, (0.60, 0.70, 0.80, 0.84)))
    curve = {750: 0.30, 875: 0.55, 1000: 0.70, 1250: 0.80, 1500: 0.88, 2000: 0.90}
    valid = {**targets, **{f"teacher_big_s{n}{sfx}": a + 0.02 * k
                           for k, sfx in enumerate(v13.SUFFIXES) for n, a in curve.items()}}
    asked = []

    def fake_prepared(args, teachers):
        asked.append(list(teachers))
        return {"corpus": {"valid": [[1, 2]] * 150}, **{t: {"model": t} for t in teachers}}

    monkeypatch.setattr(v18.v17, "prepared", fake_prepared)
    monkeypatch.setattr(v18.v17, "valid_accuracy",
                        lambda assets, names: {n: valid[n] for n in names})
    monkeypatch.setattr(v18, "RECORDS", tmp_path / "records")
    monkeypatch.setattr(v18, "RESULTS_MD", tmp_path / "RESULTS.md")
    out = tmp_path / "out"
    assert v18.main(["--out", str(out), "--stage", "pilot"]) == 0
    assert len(asked[0]) == 4 * len(v18.BUDGETS) + 4 and "teacher_big_s875_t4" in asked[0]
    pilot = json.loads((tmp_path / "records" / "pilot.json").read_text())
    # seed k reads curve + 0.02 k: seed 0 (target 0.60) 875 (0.55) over 1000 (0.70); seed 1
    # (0.70) 1000 (0.72); seed 2 (0.80) 1250 (0.84) over 1000 (0.74); seed 3 (0.84) 1250 (0.86)
    assert [r["chosen_steps"] for r in pilot["seeds"].values()] == [875, 1000, 1250, 1250]
    assert pilot["matched_arms"] == ["op_k1_byte_mean_clip_s875", "op_k1_byte_mean_clip_s1000_t2",
                                     "op_k1_byte_mean_clip_s1250_t3",
                                     "op_k1_byte_mean_clip_s1250_t4"]
    q = pilot["equal_accuracy"]
    assert q["pair_gaps"] == pytest.approx([-0.05, 0.02, 0.04, 0.02]) and q["passes"]
    assert not v18.equal_accuracy([0.6, 0.7], [0.6, 0.85])["passes"]          # one pair off
    assert not v18.equal_accuracy([0.6, 0.7], [0.69, 0.79])["passes"]         # means off
    # a gap of exactly 15 of 150 problems is within 0.10 (in floating point it reads 0.1 + 3e-17)
    assert v18.equal_accuracy([89 / 150, 0.7], [74 / 150, 0.7])["passes"]
    assert not v18.equal_accuracy([90 / 150, 0.7], [74 / 150, 0.7])["passes"]

    matched = tuple(pilot["matched_arms"])
    gain = {"cont_ce": 0.0, **dict(zip(v13.SAME, (0.20, 0.24, 0.22, 0.26))),
            **dict(zip(matched, (0.10, 0.16, 0.12, 0.20)))}
    calls = _table_harness(monkeypatch, v18, lambda a, s: 0.15 + gain[a] + 0.05 * (s % 3))
    assert v18.main(["--out", str(out), "--stage", "confirm"]) == 0
    ((_, arms, seeds, extra),) = calls
    assert arms == ("cont_ce", *v13.SAME, *matched) and seeds == (190, 191, 192)
    assert "unlabeled_test" in extra
    state = json.loads((out / "study.json").read_text())["confirm"]
    assert state["penalty"]["penalty"] == pytest.approx(1 - 0.145 / 0.23)
    assert state["pairs"]["same_minus_matched"] == pytest.approx([0.10, 0.08, 0.10, 0.06])
    assert state["pairs"]["paired_p"] < 0.05 and state["same_positive"]["holds"]
    block = (tmp_path / "RESULTS.md").read_text()
    assert "GENERATED:credit24v18teachers:BEGIN" in block and "credit24v18pairs:BEGIN" in block
    assert "| 2 | teacher_same_big_t3 | 0.800 | +0.220 | teacher_big_s1250_t3 | 0.840 | +0.120 |" \
        in block


def test_collapse_and_lowest_format_rate_count_every_run(monkeypatch):
    """A protocol that runs arms beyond its design's two groups (the seventeenth's 3000-step
    teachers) reports their collapse and their format rate in the same line: both read every
    run, not only the design's arms."""
    v13 = _load_script(monkeypatch, "study_v13.py")
    extra = "op_k1_byte_mean_clip_s1000"
    runs = [{"arm": a, "seed": s, "accuracy": 0.2 + 0.01 * s,
             "format_rate": 0.85 if (a, s) == (extra, 1) else 1.0}
            for a in ("cont_ce", *v13.SAME, *v13.CROSS, extra) for s in (0, 1, 2)]
    conf = v13.analyse(runs, {})
    assert conf["collapsed"] == [extra] and conf["lowest_format_rate"] == 0.85


def test_twentieth_protocol_crosses_tokenizer_and_training_length(monkeypatch, tmp_path):
    """study_v20's fixed rules, the harness and the teachers' scoring replaced by tables: continued
    CE and four groups of four k1 arms (same/cross tokenizer, 1000/3000 steps) on fresh seeds
    210-212 of the test half; (A)/(B) compare the 1000-step groups, (I) the per-seed length
    effect across tokenizers, Holm over (B) and (I); the 3000-step penalty and the validation
    accuracy of every teacher are reported."""
    v20 = _load_script(monkeypatch, "study_v20.py")
    assert v20.S1[1] == "op_k1_same_mean_clip_s1000_t2" and v20.X1[3] == "op_k1_byte_mean_clip_s1000_t4"
    assert v20.TEACHER_OF[v20.S1[1]] == "teacher_same_big_s1000_t2"
    assert v20.TEACHER_OF[v20.X3[0]] == "teacher_big" and v20.TEACHER_OF[v20.S3[2]] == "teacher_same_big_t3"
    gain = {"cont_ce": 0.0, **dict(zip(v20.S1, (0.22, 0.24, 0.26, 0.28))),
            **dict(zip(v20.X1, (0.21, 0.25, 0.25, 0.27))),
            **dict(zip(v20.S3, (0.20, 0.22, 0.22, 0.24))),
            **dict(zip(v20.X3, (0.10, 0.12, 0.14, 0.12)))}
    calls = _table_harness(monkeypatch, v20, lambda a, s: 0.15 + gain[a] + 0.05 * (s % 3))
    asked = []
    monkeypatch.setattr(v20.v17, "prepared", lambda args, teachers: asked.append(teachers) or {})
    monkeypatch.setattr(v20.v17, "valid_accuracy",
                        lambda assets, names: {n: 0.5 + 0.01 * i for i, n in enumerate(names)})
    monkeypatch.setattr(v20, "RECORDS", tmp_path / "records")
    monkeypatch.setattr(v20, "RESULTS_MD", tmp_path / "RESULTS.md")
    out = tmp_path / "out"
    assert v20.main(["--out", str(out)]) == 0
    ((_, arms, seeds, extra),) = calls
    assert arms == v20.ARMS and len(arms) == 17 and seeds == (210, 211, 212)
    assert "unlabeled_test" in extra and len(asked[0]) == 16
    state = json.loads((out / "study.json").read_text())["confirm"]
    assert state["penalty"]["penalty"] == pytest.approx(1 - 0.245 / 0.25)
    assert state["penalty_3000"]["penalty"] == pytest.approx(1 - 0.12 / 0.22)
    i = state["interaction"]
    assert i["a"] == pytest.approx([0.11, 0.13, 0.11, 0.15]) and i["b"] == pytest.approx([0.02, 0.02, 0.04, 0.04])
    assert i["difference"] == pytest.approx(0.095)
    from toyq.stats import holm
    assert [state["holm"]["tokenizer_effect"], state["holm"]["interaction"]] == pytest.approx(
        holm([state["tokenizer_effect"]["welch_p"], i["welch_p"]]))
    assert state["length_same"]["difference"] == pytest.approx(0.03)
    assert state["same_positive"]["holds"]
    block = (tmp_path / "RESULTS.md").read_text()
    assert "GENERATED:credit24v20teachers:BEGIN" in block and "credit24v20factorial:BEGIN" in block
    assert "| 1 | +0.240 (0.510) | +0.220 (0.590) | +0.250 (0.550) | +0.120 (0.630) |" in block


def test_nineteenth_protocol_repeats_the_matched_pairs_on_five_fresh_seeds(monkeypatch, tmp_path):
    """study_v19's fixed rules, the harness replaced by a table: the eighteenth protocol's
    matched arms, read from its pilot record, with continued CE and the same-tokenizer arms on
    fresh seeds 200-204 of the test half; no teacher is prepared or scored; its own blocks."""
    v19 = _load_script(monkeypatch, "study_v19.py")
    v18, v13 = v19.v18, v19.v18.v13
    pilot_dir = tmp_path / "v18records"
    pilot_dir.mkdir()
    matched = ["op_k1_byte_mean_clip_s875", "op_k1_byte_mean_clip_s2000_t2",
               "op_k1_byte_mean_clip_s1500_t3", "op_k1_byte_mean_clip_s1250_t4"]
    q = v18.equal_accuracy([0.6, 0.7, 0.8, 0.84], [0.5, 0.62, 0.85, 0.82])
    (pilot_dir / "pilot.json").write_text(json.dumps({"matched_arms": matched,
                                                      "equal_accuracy": q}))
    monkeypatch.setattr(v18, "RECORDS", pilot_dir)
    monkeypatch.setattr(v18.v17, "prepared", lambda *a: pytest.fail("no teacher is prepared"))
    gain = {"cont_ce": 0.0, **dict(zip(v13.SAME, (0.10, 0.17, 0.18, 0.14))),
            **dict(zip(matched, (0.22, 0.17, 0.13, 0.15)))}
    calls = _table_harness(monkeypatch, v19, lambda a, s: 0.15 + gain[a] + 0.02 * (s % 5))
    monkeypatch.setattr(v19, "RECORDS", tmp_path / "records")
    monkeypatch.setattr(v19, "RESULTS_MD", tmp_path / "RESULTS.md")
    out = tmp_path / "out"
    assert v19.main(["--out", str(out)]) == 0
    ((_, arms, seeds, extra),) = calls
    assert arms == ("cont_ce", *v13.SAME, *matched) and seeds == (200, 201, 202, 203, 204)
    assert "unlabeled_test" in extra and not set(seeds) & {*range(0, 200)}
    state = json.loads((out / "study.json").read_text())["confirm"]
    assert state["seeds"] == [200, 201, 202, 203, 204]
    assert state["penalty"]["penalty"] == pytest.approx(1 - 0.1675 / 0.1475)
    assert state["pairs"]["same_minus_matched"] == pytest.approx([-0.12, 0.0, 0.05, -0.01])
    assert state["equal_accuracy"]["passes"]
    block = (tmp_path / "RESULTS.md").read_text()
    assert "GENERATED:credit24v19teachers:BEGIN" in block and "credit24v19pairs:BEGIN" in block
    assert "generated from `credit24v19/study.json`" in block
