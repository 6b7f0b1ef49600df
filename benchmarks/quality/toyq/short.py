"""The shortened harness (``run.py --short``): a cross-tokenizer teacher distilled in minutes.

Same code path as the full harness: the same seeded arithmetic + Shakespeare corpus, the same
tokenizer pair (teacher splits digits in ``▁`` style, student keeps 1-3 digit numbers whole in
``Ġ`` style), a teacher trained by ``xdistill train offpolicy`` in CE-only mode, projections from
``xdistill.projection.build_projection``, and each arm a generated config run through ``xdistill
train offpolicy --config``. Only the budget is smaller: one seed, four arms (CE-only, P-KL, P-KL
+ continuation KL, ALM). (It was ``xdistill demo distill`` before the demo moved to the real
model pair.)

Schedule (2 cores): the CE-only arm needs no teacher, so it trains next to the teacher; the
teacher arms then run two at a time. Every run uses one thread (:mod:`toyq.threads`) and prints
a progress line every 10 s; a run that fails or stalls ends the short run with one message naming
its log. Works from any directory: prepared artifacts (tokenizers, corpora, teacher,
projections) are cached under ``$XDISTILL_ASSETS/quality/<key>``; the arms' runs (configs,
metrics, HF students, scores) go to ``out_dir``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

from xdistill.assets.paths import asset_dir
from toyq import arms as arms_mod
from toyq import harness, prepare
from toyq.runner import Watch, format_duration, say
from toyq.summary import summarize
from toyq.threads import THREADS_PER_RUN

SHORT_ARMS = ("ce", "pkl_multi", "pkl_cont", "alm")
# what each arm is, in words (``run.py --help``)
ARM_LABELS = {"ce": "CE-only on the corpus labels, no teacher",
              "pkl_multi": "P-KL through a multitoken projection",
              "pkl_cont": "P-KL + continuation KL", "alm": "ALM"}
# a checkpoint (scored for held-out accuracy, then pruned) and a held-out bpb every N steps: curves
SHORT_EVAL_EVERY = 100
# what a re-run repeats (measured: benchmarks/quality/RESULTS.md, "Reproducibility")
RUN_TO_RUN_NOTE = (
    "Same machine, install and thread count: a re-run repeats these digits bit for bit. Another",
    "thread count changes the last digits; another machine or install can move one seed's",
    "accuracy as much as the spread between seeds: with the same code, seed 0 of pkl_cont scored",
    "0.313 on one VM and 0.127 on another (benchmarks/quality/RESULTS.md, 'Reproducibility').")


def run(out_dir: str = "runs/quality_short", *, steps: int | None = None, seeds=(0,),
        arms=SHORT_ARMS, cache: str | None = None, prep=None, settings=None, jobs: int = 2,
        log=say, watch: Watch = Watch()) -> dict:
    """Prepare (cached), train each arm (``jobs`` at a time), print and return
    ``{"summary", "runs", "artifacts"}``. ``steps`` defaults to the harness's budget. A failing
    or stalled run raises :class:`~toyq.runner.RunFailed` (``run.py`` prints it)."""
    t0 = time.perf_counter()
    prep = prep or prepare.PrepConfig(threads=THREADS_PER_RUN)
    settings = settings or replace(arms_mod.ArmSettings(), eval_every=SHORT_EVAL_EVERY,
                                   threads=THREADS_PER_RUN)
    if steps:
        settings = replace(settings, steps=steps)
    out, arms, seeds = Path(out_dir), list(arms), list(seeds)
    log(f"[short] {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}: teacher and "
        f"arms on {settings.threads} thread(s) each, {jobs} run(s) at a time; a progress line "
        f"every {watch.report_every:.0f}s")
    root = Path(cache) if cache else asset_dir() / "quality"
    teachers = ["teacher_big"] + (["teacher_weak"] if {"same_kd", "multi"} & set(arms) else [])
    base = prepare.prepare_all(root, prep, log=log, teachers=[], watch=watch)
    early = [a for a in arms if a == "ce"] if jobs > 1 else []
    cancel = threading.Event()
    early_join = _in_background(lambda: harness.run_harness(
        base, early, seeds, settings, out, log=log, jobs=1, watch=watch, fail_fast=True,
        cancel=cancel))
    try:
        assets = prepare.prepare_all(root, prep, log=log, teachers=teachers, watch=watch)
    except BaseException:  # a failed teacher (or Ctrl-C): stop the early arm, report the cause
        cancel.set()
        with contextlib.suppress(Exception):
            early_join()
        raise
    early_runs = early_join()  # waits; re-raises a failure of the early arm
    t_prep = time.perf_counter() - t0
    rest = harness.run_harness(assets, [a for a in arms if a not in early], seeds, settings, out,
                               log=log, jobs=jobs, watch=watch, fail_fast=True)
    runs = early_runs["runs"] + rest["runs"]
    result = {"runs": runs, "summary": summarize(runs, arms), "failed": {}}
    result["artifacts"] = _artifacts(assets, out, arms, seeds)
    log(format_report(result, assets, t_prep, time.perf_counter() - t0))
    return result


def _in_background(fn):
    """Start ``fn`` in a thread; returns a function that waits and returns its result (or raises
    its exception). Nothing to run (an empty arm list) still works."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()

    def join():
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["value"]

    return join


def _artifacts(assets: dict, out: Path, arms: list, seeds: list) -> dict:
    from toyq.report import plot_curves

    curves = plot_curves(out, arms, seeds, out / "curves.png")
    return {
        "prepared (tokenizers, corpora, teachers)": assets["root"],
        "projection (multitoken)": assets["projections"]["multitoken"],
        "projection (corpus)": assets["projections"]["corpus"],
        "runs (config.yaml, config.log, metrics.jsonl, export/ = HF student, score.json)":
            str(out / "runs"),
        "learning curves (held-out accuracy of checkpoints every eval_every steps, then pruned;"
        " bits per byte)": str(curves),
    }


def format_report(result: dict, assets: dict, prep_s: float, total_s: float) -> str:
    teacher = assets["teacher_big"]
    rows = [f"teacher (digit-split tokenizer): held-out accuracy {teacher['accuracy']:.3f}, "
            f"bits/byte {teacher['bpb']:.3f}",
            "", "student after distillation (greedy exact match on held-out problems; "
            "bits per byte on a held-out play):", ""]
    rows.append(f"{'arm':<12} {'accuracy':>10} {'bits/byte':>10}")
    base = result["summary"].get("ce")
    for arm, s in result["summary"].items():
        gain = (f"  ({s['accuracy'] - base['accuracy']:+.3f} vs CE-only)"
                if base and arm != "ce" else "")
        rows.append(f"{arm:<12} {s['accuracy']:>10.3f} {s['bpb']:>10.3f}{gain}")
    noise = assets["prep"]["task"].get("answer_noise", 0.0)
    if noise:
        rows += ["", f"The student's corpus has {noise:.0%} of its answers wrong (the teachers "
                     "trained on clean ones):", "CE-only learns from those labels; the "
                     "distillation arms also get the teacher's distributions."]
    rows += ["", "One seed only: a hint, not evidence. One seed's gap between arms can be as "
                 "large as", "the spread between seeds.", *RUN_TO_RUN_NOTE,
             "benchmarks/quality/RESULTS.md has several seeds per arm (mean +- std), run by:",
             "  python benchmarks/quality/run.py --jobs 2",
             "", f"time: {format_duration(prep_s)} preparation (teacher cached afterwards; the "
                 f"CE-only arm trains alongside), {format_duration(total_s)} total", "",
             "artifacts:"] + [f"  {k}: {v}" for k, v in result["artifacts"].items()]
    return "\n".join(rows)
