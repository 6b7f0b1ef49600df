"""One command for the whole harness: prepare (cached), run every arm x seed, write results.

    python -m benchmarks.quality.run --jobs 2              # full: all arms, 3 seeds
    python -m benchmarks.quality.run --arms ce,pkl_multi,alm --seeds 0 --steps 100
    python -m benchmarks.quality.run --jobs 2 --answer-noise 0 --out runs/quality_clean \
        --tag clean                                        # the clean-answer protocol

Writes ``<out>/results.json``, ``benchmarks/quality/accuracy_bpb.png``, ``curves.png`` (accuracy
and bits per byte vs step, mean +- std over seeds) and the generated section of
``benchmarks/quality/RESULTS.md`` (between the GENERATED markers; the hand-written discussion
around them is kept).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from benchmarks.quality.arms import ARMS, ArmSettings
from benchmarks.quality.harness import run_harness, uncommon_answer_fraction
from benchmarks.quality.prepare import PrepConfig, prepare_all
from benchmarks.quality.report import plot_curves, plot_summary, render, write_results_json

HERE = Path(__file__).resolve().parent


def markers(tag: str = "") -> tuple[str, str]:
    """The generated block's markers; a ``tag`` names a second block (another protocol)."""
    name = f"GENERATED:{tag}" if tag else "GENERATED"
    return f"<!-- {name}:BEGIN -->", f"<!-- {name}:END -->"


def update_results_md(text: str, path: Path = HERE / "RESULTS.md", tag: str = "") -> Path:
    begin, end = markers(tag)
    block = f"{begin}\n{text}\n{end}"
    old = path.read_text(encoding="utf-8") if path.exists() else f"# Quality harness\n\n{begin}\n{end}\n"
    if begin in old and end in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip() + "\n\n" + block + "\n"
    path.write_text(new, encoding="utf-8")
    return path


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/quality", help="runs and results folder")
    p.add_argument("--cache", default="", help="prepared-assets cache (default <out>/prepared)")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=ArmSettings.steps)
    p.add_argument("--teacher-steps", type=int, default=PrepConfig.big_steps,
                   help="CE training steps of the cross-tokenizer teacher")
    p.add_argument("--answer-noise", type=float, default=PrepConfig().task.answer_noise,
                   help="fraction of wrong answers in the student's distillation corpus "
                        "(teachers train on clean answers)")
    p.add_argument("--temperature", type=float, default=ArmSettings.temperature,
                   help="distillation temperature of every teacher loss (both sides)")
    p.add_argument("--eval-every", type=int, default=100,
                   help="held-out bpb, and a checkpoint scored for held-out accuracy, every N "
                        "steps (learning curves, mean accuracy over training); 0 = final only")
    p.add_argument("--threads", type=int, default=1, help="torch threads per training run")
    p.add_argument("--jobs", type=int, default=1, help="training runs at a time")
    p.add_argument("--no-report", action="store_true", help="do not touch RESULTS.md / plots")
    p.add_argument("--tag", default="",
                   help="report under this name: RESULTS.md block GENERATED:<tag>, plots "
                        "accuracy_bpb_<tag>.png and curves_<tag>.png (another protocol's results "
                        "next to the default one's)")
    return p.parse_args(argv)


def _load(avg) -> str:
    return "/".join(f"{x:.1f}" for x in avg)


def main(argv=None) -> int:
    args = parse(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    load_start = os.getloadavg()
    out = Path(args.out)
    need = [t for t, arms_needing in (("teacher_big", set(ARMS) - {"ce", "same_kd"}),
                                      ("teacher_weak", {"same_kd", "multi"}))
            if arms_needing & set(args.arms.split(","))]
    base = PrepConfig()
    prep = replace(base, big_steps=args.teacher_steps,
                   task=replace(base.task, answer_noise=args.answer_noise))
    assets = prepare_all(args.cache or out / "prepared", prep, teachers=need)
    settings = replace(ArmSettings(), steps=args.steps, eval_every=args.eval_every,
                       threads=args.threads, temperature=args.temperature)
    arms = [a for a in args.arms.split(",") if a]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    result = run_harness(assets, arms, seeds, settings, out, jobs=args.jobs)
    meta = {"command": "python -m benchmarks.quality.run " + " ".join(sys.argv[1:] if argv is None else argv),
            "hardware": f"{os.cpu_count()}-core CPU ({platform.processor() or platform.machine()}),"
                        f" no GPU; load average (1/5/15 min) {_load(load_start)} at the start,"
                        f" {_load(os.getloadavg())} at the end; {args.jobs} run(s) at a time",
            "wall_s_this_invocation": round(time.perf_counter() - t0),
            "arm_settings": asdict(settings), "prep": assets["prep"],
            **{t: {k: assets[t][k] for k in ("accuracy", "bpb")} for t in need},
            "prep_timings_s": {k: round(v) for k, v in assets["timings"].items()},
            "gold_uncommon_answer_token_fraction": uncommon_answer_fraction(assets)}
    result["meta"] = meta
    write_results_json(result, out / "results.json")
    print(render(result, meta))
    if not args.no_report:
        suffix = f"_{args.tag}" if args.tag else ""
        plot_summary(result["summary"], HERE / f"accuracy_bpb{suffix}.png")
        plot_curves(out, arms, seeds, HERE / f"curves{suffix}.png")
        update_results_md(render(result, meta), tag=args.tag)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
