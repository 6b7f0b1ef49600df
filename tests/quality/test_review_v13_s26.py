"""Review of the thirteenth issue-24 protocol's driver (``benchmarks/quality/study_v13.py``) and of
the parallel teacher training in ``toyq/prepare.py``: failing tests, one per defect found."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

_quality = Path(__file__).resolve().parents[2] / "benchmarks" / "quality"
SEEDS = [140, 141, 142]


def _load_script(monkeypatch, name: str):
    monkeypatch.syspath_prepend(str(_quality))          # as when the script runs: its folder
    spec = importlib.util.spec_from_file_location(f"quality_review_{name}", _quality / name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _table(v13, same_gains, cross_gains, spread=0.01):
    """``{arm: {seed: accuracy}}``: continued CE at 0.3, each teacher arm at its gain above it
    (plus a small per-seed spread on the teacher arms)."""
    gain = {"cont_ce": 0.0, **dict(zip(v13.SAME, same_gains)),
            **dict(zip(v13.CROSS, cross_gains))}
    return {a: {s: 0.3 + gain[a] + spread * (s % 3) * (a != "cont_ce") for s in SEEDS}
            for a in v13.ARMS}


def test_penalty_interval_is_scrambled_when_some_draws_have_no_positive_same_gain(monkeypatch):
    """(b) The teachers-and-seeds bootstrap of the penalty.

    Four same-tokenizer teachers with gains 0.20, -0.15, 0.10, 0.10 and four cross-tokenizer
    teachers around 0.05 (each plus 0.01 on average from the per-seed spread: mean same gain
    0.0725 > 0, so the point penalty is defined, 1 - 0.06 / 0.0725 ~ 0.17).
    About 15% of the bootstrap draws resample the negative teacher often enough that the
    resampled mean same gain is <= 0, where ``toyq.stats.penalty`` returns nan.

    Expected: a percentile interval whose ends are ordered (low <= high), or an interval marked
    undefined; the draws with an undefined penalty handled explicitly.
    Actual: ``penalty_over_teachers`` sorts the 20,000 draws with the nan values in the list;
    nan compares false with everything, so ``sorted`` leaves the list in an arbitrary order and
    the "percentiles" are arbitrary draws: the interval comes out as about [0.55, 0.39]
    (low > high, and it excludes the point estimate 0.17, which is read as meeting the goal).
    Suggested fix: count the draws whose same gain is not positive, drop them from (or order
    them explicitly in) the sorted list, and report their share next to the interval (or report
    the interval as undefined when more than 2.5% of the draws are undefined); the same sort
    is in ``toyq.stats.penalty_interval``.
    """
    v13 = _load_script(monkeypatch, "study_v13.py")
    acc = _table(v13, (0.20, -0.15, 0.10, 0.10), (0.05, 0.04, 0.06, 0.05))
    out = v13.penalty_over_teachers(acc, SEEDS)
    assert out["penalty"] == pytest.approx(1 - 0.06 / 0.0725)      # defined: 0.17 <= goal
    lo, hi = out["interval"]
    undefined = all(x is None or (isinstance(x, float) and math.isnan(x)) for x in (lo, hi))
    assert undefined or lo <= hi, f"interval {out['interval']}: low end above the high end"
    assert undefined or lo <= out["penalty"], (
        f"interval {out['interval']} does not reach down to the point estimate {out['penalty']}")


def test_a_run_without_a_format_rate_marks_its_arm_collapsed(monkeypatch):
    """(e) Collapse: "any arm with a final format rate below 0.9 on any seed".

    Every run has format rate 0.95, except one run of ``op_k1_byte_mean_clip_t2`` whose score
    has no format rate (``format_rate: None``: unknown, as with scores written before the rate
    existed, which ``toyq.summary`` allows for).
    Expected: no arm reported collapsed (no rate below 0.9 is known), in agreement with the
    record's own ``lowest_format_rate`` (0.95) and with ``toyq.confirm.comparisons`` (the
    generated block ``credit24v13``: ``min_format_rate`` None, not collapsed).
    Actual: ``analyse`` computes ``(r.get("format_rate") or 0) < 0.9``: the unknown rate counts as
    0, so study.json says ``collapsed: ["op_k1_byte_mean_clip_t2"]`` next to
    ``lowest_format_rate: 0.95``, while the generated block says none collapsed.
    Suggested fix: skip runs whose format rate is None in ``collapsed`` (as ``lowest_format_rate``
    and ``toyq.confirm`` do), or report them separately as "format rate unknown".
    """
    v13 = _load_script(monkeypatch, "study_v13.py")
    from toyq.confirm import comparisons

    acc = _table(v13, (0.20, 0.24, 0.22, 0.26), (0.10, 0.12, 0.14, 0.16))
    runs = [{"arm": a, "seed": s, "accuracy": acc[a][s], "format_rate": 0.95}
            for a in v13.ARMS for s in SEEDS]
    next(r for r in runs if r["arm"] == "op_k1_byte_mean_clip_t2")["format_rate"] = None
    parts = v13.analyse(runs, {})
    assert parts["lowest_format_rate"] == pytest.approx(0.95)
    block = [c["arm"] for c in comparisons(runs)
             if c["min_format_rate"] is not None and c["min_format_rate"] < 0.9]
    assert block == []
    assert parts["collapsed"] == block, (
        f"study.json collapsed {parts['collapsed']} with lowest_format_rate "
        f"{parts['lowest_format_rate']}; the generated block: {block}")


def test_a_failing_teacher_does_not_stop_the_queued_teachers(monkeypatch, tmp_path):
    """``prepare_all(..., jobs=)``: a teacher whose trainer run fails.

    Three missing teachers, one at a time (``jobs=1``); the first one's run fails (RunFailed).
    Expected: the failure is raised at once and the teachers still queued are not started (the
    sequential code before this change stopped at the first failure; ``toyq.harness`` cancels
    the runs in flight and the queued ones when a run fails).
    Actual: ``prepare_all`` calls ``future.result()`` inside ``with ThreadPoolExecutor(...)``; the
    exception leaves the block, whose ``shutdown(wait=True)`` keeps running every queued teacher
    before the error is reported: in the protocol's command (eight teachers, two at a time, ~6
    min each) a teacher failing first is reported ~20 minutes later, after the other seven have
    trained. (Also, on Ctrl-C the children started after the interrupt do not get the SIGINT and
    train on.) The teachers that did finish are not written to ``assets.json`` either.
    Suggested fix: as ``toyq.harness.run_harness`` does, share a ``threading.Event`` among the
    workers: the worker whose teacher fails sets it (in the worker, so that no queued teacher
    can start in between), a worker finds it set before starting a teacher and skips it, and it
    goes to ``run_config(cancel=...)`` so the trainer child in flight is stopped; also
    ``shutdown(cancel_futures=True)``, and the finished teachers written to the manifest before
    the failure is raised.
    """
    from toyq import prepare
    from toyq.runner import RunFailed

    root = tmp_path / prepare.cache_key(prepare.PrepConfig())
    root.mkdir()
    (root / "assets.json").write_text(json.dumps({
        "tok_student": "S", "tok_teacher": "T", "corpus": {}, "timings": {}, "prep": {}}))
    started = []

    def fake_train(out, tok, corpus, layers, hidden, steps, cfg, log, watch, seed, cancel=None):
        started.append(out.name)
        if out.name == "teacher_big_t2":
            raise RunFailed("teacher_big_t2: failed (exit 1)", out / "config.log")
        return {"model": str(out), "accuracy": 0.5, "bpb": 1.0}

    monkeypatch.setattr(prepare, "train_teacher", fake_train)
    monkeypatch.setattr(prepare, "reusable_teacher", lambda *a: None)
    with pytest.raises(RunFailed, match="teacher_big_t2"):
        prepare.prepare_all(tmp_path, teachers=["teacher_big_t2", "teacher_big_t3",
                                                "teacher_big_t4"], log=lambda *a: None, jobs=1)
    assert started == ["teacher_big_t2"], (
        f"teachers trained after the first one failed: {started[1:]}")
