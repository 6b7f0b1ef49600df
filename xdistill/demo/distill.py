"""``xdistill demo distill``: distil a cross-tokenizer teacher into a student, in minutes on CPU.

The shortened quality harness (``benchmarks/quality``), same code path: the same seeded arithmetic
+ Shakespeare corpus, the same tokenizer pair (teacher splits digits in ``▁`` style, student keeps
1-3 digit numbers whole in ``Ġ`` style), teachers trained by ``xdistill train offpolicy`` in CE-only
mode, projections from ``xdistill.projection.build_projection``, and each arm a generated config
run through ``xdistill train offpolicy --config``. Only the budget is smaller (one seed, four
arms: CE-only, P-KL, P-KL + continuation KL, ALM).

Prepared artifacts (tokenizers, corpora, teachers, projections) are cached under
``$XDISTILL_ASSETS/quality/<key>`` and reused by later runs; the arms' runs (configs, metrics,
HF students, scores) go to ``out_dir``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

DEMO_ARMS = ("ce", "pkl_multi", "pkl_cont", "alm")
# teacher training is the demo's longest phase and nothing else runs then: use both cores
DEMO_PREP_THREADS = 2
# a checkpoint (scored for held-out accuracy, then pruned) and a held-out bpb every N steps: curves
DEMO_EVAL_EVERY = 100


def _import_harness():
    """``benchmarks.quality`` lives in the repository next to the package (not installed)."""
    try:
        import benchmarks.quality.harness  # noqa: F401
    except ImportError:
        repo = Path(__file__).resolve().parents[2]
        if not (repo / "benchmarks" / "quality").is_dir():
            from xdistill.errors import XDistillError

            raise XDistillError(f"the distillation demo needs the repository checkout "
                                f"(benchmarks/quality not found under {repo})") from None
        sys.path.insert(0, str(repo))
    from benchmarks.quality import arms, harness, prepare

    return arms, harness, prepare


def run(out_dir: str = "runs/demo_distill", *, steps: int | None = None, seeds=(0,),
        arms=DEMO_ARMS, cache: str | None = None, prep=None, settings=None, jobs: int = 2,
        log=print) -> dict:
    """Prepare (cached), train each arm (``jobs`` at a time), print and return
    ``{"summary", "runs", "artifacts"}``. ``steps`` defaults to the harness's budget."""
    arms_mod, harness, prepare = _import_harness()
    from xdistill.assets import asset_dir

    t0 = time.perf_counter()
    prep = prep or prepare.PrepConfig(threads=DEMO_PREP_THREADS)
    teachers = ["teacher_big"] + (["teacher_weak"] if {"same_kd", "multi"} & set(arms) else [])
    assets = prepare.prepare_all(Path(cache) if cache else asset_dir() / "quality", prep, log=log,
                                 teachers=teachers)
    t_prep = time.perf_counter() - t0
    settings = settings or replace(arms_mod.ArmSettings(), eval_every=DEMO_EVAL_EVERY)
    if steps:
        settings = replace(settings, steps=steps)
    result = harness.run_harness(assets, list(arms), list(seeds), settings, Path(out_dir), log=log,
                                 jobs=jobs)
    from benchmarks.quality.report import plot_curves

    curves = plot_curves(Path(out_dir), list(arms), list(seeds), Path(out_dir) / "curves.png")
    artifacts = {
        "prepared (tokenizers, corpora, teachers)": assets["root"],
        "projection (multitoken)": assets["projections"]["multitoken"],
        "projection (corpus)": assets["projections"]["corpus"],
        "runs (config.yaml, metrics.jsonl, export/ = HF student, score.json)":
            str(Path(out_dir) / "runs"),
        "learning curves (held-out accuracy of checkpoints every eval_every steps, then pruned;"
        " bits per byte)": str(curves),
    }
    result["artifacts"] = artifacts
    log(format_report(result, assets, t_prep, time.perf_counter() - t0))
    return result


def format_report(result: dict, assets: dict, prep_s: float, total_s: float) -> str:
    rows = [f"teacher (digit-split tokenizer): held-out accuracy "
            f"{assets['teacher_big']['accuracy']:.3f}, bits/byte {assets['teacher_big']['bpb']:.3f}",
            "", "student after distillation (greedy exact match on held-out problems; "
            "bits per byte on a held-out play):", ""]
    rows.append(f"{'arm':<12} {'accuracy':>10} {'bits/byte':>10}")
    base = result["summary"].get("ce")
    for arm, s in result["summary"].items():
        gain = f"  ({s['accuracy'] - base['accuracy']:+.3f} vs CE-only)" if base and arm != "ce" else ""
        rows.append(f"{arm:<12} {s['accuracy']:>10.3f} {s['bpb']:>10.3f}{gain}")
    for arm, err in result.get("failed", {}).items():
        rows.append(f"{arm:<12} FAILED: {err}")
    noise = assets["prep"]["task"].get("answer_noise", 0.0)
    if noise:
        rows += ["", f"The student's corpus has {noise:.0%} of its answers wrong (the teachers "
                     "trained on clean ones):", "CE-only learns from those labels; the "
                     "distillation arms also get the teacher's distributions."]
    rows += ["", "One seed only: one seed's gap between arms is not evidence. See",
             "benchmarks/quality/RESULTS.md for 3 seeds x 11 arms (mean +- std) in this protocol",
             "and with clean answers:", "  python -m benchmarks.quality.run --jobs 2",
             "  python -m benchmarks.quality.run --jobs 2 --answer-noise 0 --out "
             "runs/quality_clean --tag clean",
             "", f"time: {prep_s:.0f}s preparation (cached afterwards), {total_s:.0f}s total", "",
             "artifacts:"] + [f"  {k}: {v}" for k, v in result["artifacts"].items()]
    return "\n".join(rows)
