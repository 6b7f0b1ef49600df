"""The harness's command line: prepare (cached), run every arm x seed, write results and report.

    python benchmarks/quality/run.py --jobs 2              # full: all arms, 3 seeds
    python benchmarks/quality/run.py --arms ce,pkl_multi,alm --seeds 0 --steps 100
    python benchmarks/quality/run.py --jobs 2 --answer-noise 0 --tag clean --out runs/quality_clean

    python benchmarks/quality/run.py --short --out runs/quality_short   # minutes: one seed

(``benchmarks/quality/run.py`` calls :func:`main` with ``--report-dir benchmarks/quality``.) Writes
``<out>/results.json`` and, in the report folder, ``accuracy_bpb.png``, ``curves.png`` (accuracy
and bits per byte vs step, mean +- std over seeds) and the generated section of ``RESULTS.md``
(between the GENERATED markers; the hand-written discussion around them is kept). Exit code 1
when a run failed (the report is still written; each failure names its log). ``--short`` is the
shortened harness (:mod:`toyq.short`: one seed, four arms, the CE-only arm next to the teacher,
``--steps``, ``--jobs``, ``--cache``, ``--stall-s`` and ``--out`` apply; it prints its table and
writes no report); a failing or stalled run ends it with one message naming its log (exit 1).
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

from toyq.arms import ARMS, ArmSettings
from toyq.prepare import PROMPT_POOLS, PrepConfig
from toyq.runner import Watch
from toyq.task import UNLABELED_HALVES, unlabeled_halves, unlabeled_pairs


def markers(tag: str = "") -> tuple[str, str]:
    """The generated block's markers; a ``tag`` names a second block (another protocol)."""
    name = f"GENERATED:{tag}" if tag else "GENERATED"
    return f"<!-- {name}:BEGIN -->", f"<!-- {name}:END -->"


def update_results_md(text: str, path: Path, tag: str = "") -> Path:
    """Replace the generated block of ``path`` (``tag``: another block) by ``text``; the rest of
    the file (hand-written discussion) is kept. A missing block is appended."""
    begin, end = markers(tag)
    block = f"{begin}\n{text}\n{end}"
    old = path.read_text(encoding="utf-8") if path.exists() else f"# Quality harness\n\n{begin}\n{end}\n"
    if begin in old and end in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip() + "\n\n" + block + "\n"
    path.write_text(new, encoding="utf-8")
    return path


def record_and_report(record: Path, measure, render, results_md: Path, tag: str) -> str:
    """A diagnostic's tail: ``measure()`` (skipped when None: ``--report``) written to ``record``
    as JSON, then the block ``tag`` of ``results_md`` generated from that file only; the block's
    text is returned (and printed by the caller)."""
    if measure is not None:
        record.write_text(json.dumps(measure(), indent=1) + "\n")
    text = render(json.loads(record.read_text()))
    update_results_md(text, results_md, tag=tag)
    return text


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
    p.add_argument("--twin-free", action="store_true",
                   help="issue-24 protocol: hold out whole unordered pairs {a, b} (no held-out "
                        "problem has its swapped twin in training)")
    p.add_argument("--n-valid", type=int, default=0,
                   help="twin-free validation problems carved from training (needs --twin-free)")
    p.add_argument("--teacher-per-doc", type=int, default=0,
                   help="problems per document of the teachers' corpus (0 = the task's "
                        "per_doc, 4; 1 = each problem its own document, ending like a rollout)")
    p.add_argument("--student-pairs", type=int, default=0,
                   help="label only the first N training problems in the student's corpus (a "
                        "twin is kept with its problem); the rest are prompts without labels "
                        "(see --prompt-pool); 0 = all")
    p.add_argument("--prompt-pool", choices=PROMPT_POOLS, default=ArmSettings.prompt_pool,
                   help="on-policy prompts: the student's labeled problems, or every training "
                        "problem (also the unlabeled ones the teachers trained on)")
    p.add_argument("--eval-split", choices=("heldout", "valid", "unlabeled", *UNLABELED_HALVES),
                   default="heldout",
                   help="score accuracy on the test (held-out) split, the validation split, or "
                        "the training problems without a label in the student's corpus (what only "
                        "a teacher can teach; needs --student-pairs), or one of its two halves "
                        "(unlabeled_tune to choose rates on, unlabeled_test to confirm on)")
    p.add_argument("--cont-steps", type=int, default=ArmSettings.cont_steps,
                   help="continuation protocol (cont_* / op_* arms): steps after the CE "
                        "checkpoint of each seed")
    p.add_argument("--cont-lr", type=float, default=ArmSettings.cont_lr,
                   help="continuation protocol: peak learning rate after the CE checkpoint")
    p.add_argument("--arm-lr", type=parse_arm_lr, default=(),
                   help="per-arm continuation learning rates, e.g. op_k1=1e-4,op_k1_same=1e-4 "
                        "(the other arms use --cont-lr)")
    p.add_argument("--temperature", type=float, default=ArmSettings.temperature,
                   help="distillation temperature of every teacher loss (both sides)")
    p.add_argument("--eval-every", type=int, default=100,
                   help="held-out bpb, and a checkpoint scored for held-out accuracy, every N "
                        "steps (learning curves, mean accuracy over training); 0 = final only")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per training run (1: see "
                        "benchmarks/quality/toyq/threads.py)")
    p.add_argument("--jobs", type=int, default=1, help="training runs at a time")
    p.add_argument("--stall-s", type=float, default=Watch.stall_s,
                   help="kill a training run whose log and metrics have not grown for this many "
                        "seconds")
    p.add_argument("--short", action="store_true",
                   help="the shortened harness (one seed, four arms, minutes on 2 cores; teacher "
                        "cached under $XDISTILL_ASSETS/quality unless --cache): prints its table")
    p.add_argument("--no-report", action="store_true", help="do not touch RESULTS.md / plots")
    p.add_argument("--report-dir", default="",
                   help="folder of RESULTS.md and the plots (default: --out)")
    p.add_argument("--tag", default="",
                   help="report under this name: RESULTS.md block GENERATED:<tag>, plots "
                        "accuracy_bpb_<tag>.png and curves_<tag>.png (another protocol's results "
                        "next to the default one's)")
    return p.parse_args(argv)


def _load(avg) -> str:
    return "/".join(f"{x:.1f}" for x in avg)


def parse_arm_lr(text: str) -> tuple:
    """``arm=lr,arm=lr`` -> ``((arm, lr), ...)`` (sorted, so the order does not matter)."""
    pairs = []
    for item in filter(None, text.split(",")):
        arm, sep, lr = item.partition("=")
        try:
            pairs.append((arm.strip(), float(lr)))
        except ValueError:
            sep = ""
        if not sep or not arm.strip():
            raise argparse.ArgumentTypeError(f"--arm-lr item {item!r}: expected arm=learning_rate")
    return tuple(sorted(pairs))


def run_phases(assets, arms, seeds, settings, out, jobs, watch) -> dict:
    """All runs; the continuation arms (``benchmarks/quality/toyq/continued.py``) start from each
    seed's ``ce`` run, which therefore runs (or is reused) first, and is reported only when
    asked for."""
    from toyq.continued import is_cont_arm
    from toyq.harness import run_harness
    from toyq.summary import summarize

    cont = [a for a in arms if is_cont_arm(a)]
    base = [a for a in arms if not is_cont_arm(a)]
    if not cont:
        return run_harness(assets, base, seeds, settings, out, jobs=jobs, watch=watch)
    first = run_harness(assets, base if "ce" in base else ["ce"] + base, seeds, settings, out,
                        jobs=jobs, watch=watch)
    if "ce" in first["failed"]:
        return first
    second = run_harness(assets, cont, seeds, settings, out, jobs=jobs, watch=watch)
    runs = [r for r in first["runs"] if r["arm"] in base] + second["runs"]
    return {"runs": runs, "summary": summarize(runs, arms),
            "failed": {**{a: e for a, e in first["failed"].items() if a in base},
                       **second["failed"]}}


def teachers_needed(arms) -> list[str]:
    """The prepared teachers the ``arms`` read (``ce`` none, ``same_kd`` only the weak one)."""
    from toyq.continued import (CONT_ARMS, SAME_ARMS, TEACHER_SUFFIXES, TWIN_ARMS, budget_of,
                                k1_teacher, is_cont_arm, teacher_suffix)

    budgets = sorted({k1_teacher(a) for a in arms if budget_of(a) is not None})
    arms = set(arms) | ({"pkl_cont"} if any(map(is_cont_arm, arms)) else set())
    further = {a for a in CONT_ARMS if teacher_suffix(a)}
    users = [("teacher_big", set(ARMS) - {"ce", "same_kd"}),
             ("teacher_weak", {"same_kd", "multi"}),
             ("teacher_same_big", (set(SAME_ARMS) | set(TWIN_ARMS)) - further)]
    for sfx in TEACHER_SUFFIXES:
        mine = {a for a in further if teacher_suffix(a) == sfx}
        users += [(f"teacher_big{sfx}", mine - set(SAME_ARMS)),
                  (f"teacher_same_big{sfx}", mine & set(SAME_ARMS))]
    return [t for t, readers in users if readers & arms] + budgets


def main(argv=None) -> int:
    """Run the harness; a failing teacher run ends it with one message naming its log (exit 1)."""
    from xdistill.errors import XDistillError

    args = parse(argv)
    try:
        if args.short:
            return _run_short(args)
        return _run(args, sys.argv[1:] if argv is None else argv)
    except XDistillError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _run_short(args) -> int:
    """``--short``: :func:`toyq.short.run` with the options that apply to it."""
    from toyq.short import run as run_short

    try:
        run_short(out_dir=args.out, steps=args.steps, jobs=args.jobs, cache=args.cache or None,
                  watch=Watch(stall_s=args.stall_s))
    except KeyboardInterrupt:
        print("run.py --short: interrupted (training runs stopped)", file=sys.stderr)
        return 130
    return 0


def _arg_error(args, arms: list[str]) -> str:
    """What is wrong with ``--arms`` / ``--arm-lr`` / the split options ("" when nothing)."""
    from toyq.continued import BUDGET_BASE, CONT_ARMS, SAME_BUDGET_BASE, is_cont_arm

    unknown = [a for a in arms if a not in ARMS and not is_cont_arm(a)]
    if unknown:
        return (f"unknown arm(s) {', '.join(unknown)}; choose from "
                f"{', '.join(ARMS + CONT_ARMS)}, or {BUDGET_BASE}_s<teacher steps>[_t2|_t3|_t4]"
                f" (or {SAME_BUDGET_BASE}_s...)")
    stray = [a for a, _ in args.arm_lr if a not in arms or not is_cont_arm(a)]
    if stray:
        return f"--arm-lr names {', '.join(stray)}, not a continuation arm of --arms"
    if (args.n_valid or args.eval_split == "valid") and not (args.twin_free and args.n_valid):
        return "--n-valid and --eval-split valid need --twin-free and --n-valid > 0"
    return ""


def _unlabeled(args, prep) -> list | None:
    """The unlabeled training prompts scored by ``--eval-split unlabeled*`` (None for another
    split); an empty list when every training problem is labeled."""
    if not args.eval_split.startswith("unlabeled"):
        return None
    pool = (unlabeled_pairs(prep.task) if args.eval_split == "unlabeled"
            else unlabeled_halves(prep.task)[args.eval_split])
    return pool.tolist()


def prep_config(args) -> PrepConfig:
    """The preparation (cache key, teachers' corpus) that the parsed options ask for."""
    base = PrepConfig()
    return replace(base, big_steps=args.teacher_steps,
                   task=replace(base.task, answer_noise=args.answer_noise,
                                twin_free=args.twin_free, n_valid=args.n_valid,
                                student_pairs=args.student_pairs,
                                teacher_per_doc=args.teacher_per_doc))


def _run(args, shown: list[str]) -> int:
    from toyq.harness import uncommon_answer_fraction
    from toyq.prepare import prepare_all
    from toyq.report import render, write_results_json

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    load_start = os.getloadavg()
    out = Path(args.out)
    arms = [a for a in args.arms.split(",") if a]
    error = _arg_error(args, arms)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    seeds = [int(s) for s in args.seeds.split(",") if s]
    need = teachers_needed(arms)
    watch = Watch(stall_s=args.stall_s)
    prep = prep_config(args)
    unlabeled = _unlabeled(args, prep)    # training prompts without a label (4th, 5th)
    if unlabeled == []:
        print(f"error: --eval-split {args.eval_split} needs --student-pairs below the "
              "training problems (every training problem is labeled)", file=sys.stderr)
        return 2
    assets = prepare_all(args.cache or out / "prepared", prep, teachers=need, watch=watch,
                         jobs=args.jobs)
    assets = {**assets, "eval_split": args.eval_split}
    if unlabeled is not None:
        assets["corpus"] = {**assets["corpus"], args.eval_split: unlabeled}
    settings = replace(ArmSettings(), steps=args.steps, eval_every=args.eval_every,
                       threads=args.threads, temperature=args.temperature,
                       cont_steps=args.cont_steps, cont_lr=args.cont_lr,
                       prompt_pool=args.prompt_pool, arm_lr=args.arm_lr)
    result = run_phases(assets, arms, seeds, settings, out, args.jobs, watch)
    meta = {"command": "python benchmarks/quality/run.py " + " ".join(shown),
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
        _report(result, meta, out, arms, seeds, Path(args.report_dir or out), args.tag)
    failed = [r for r in result["runs"] if "error" in r]
    for r in failed:
        print(f"FAILED {r['arm']} seed {r['seed']}: {r['error']}", file=sys.stderr)
    return 1 if failed else 0


def _report(result, meta, out: Path, arms, seeds, report_dir: Path, tag: str) -> None:
    """The plots and the RESULTS.md block of one harness run (``--tag``: its own names)."""
    from toyq.report import plot_curves, plot_summary, render

    report_dir.mkdir(parents=True, exist_ok=True)
    suffix = f"_{tag}" if tag else ""
    plot_summary(result["summary"], report_dir / f"accuracy_bpb{suffix}.png")
    plot_curves(out, arms, seeds, report_dir / f"curves{suffix}.png")
    update_results_md(render(result, meta), report_dir / "RESULTS.md", tag=tag)

if __name__ == "__main__":
    raise SystemExit(main())
