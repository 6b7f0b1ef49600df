"""Held-out bits per byte of real distillation runs under ``dtype: auto`` against float32, same
seeds: does training with bf16 compute (where ``auto`` picks it) land where float32 does?

    .venv/bin/python benchmarks/real/dtype_bpb.py --study-out runs/real_a2 --out runs/dtype_bpb

The jobs are the real-model study's (``PROTOCOL.md``, amendment 2) tuning runs at their chosen
rates, read from the study's ``study.json``: CE-only and P-KL to the adapted Gemma (the study's
teacher, which must exist under ``--study-out``), 60 steps of 4 x 64 SmolLM2 tokens, scored on
the study's validation blocks. Each seed runs twice, back to back: once with every ``auto``
pinned to float32 (``XDISTILL_AUTO_DTYPE=float32``, the study's own setting: the float32 runs of
seeds 0 and 1 repeat the study's recorded runs and are compared with its records), once with
``auto``'s own choice (the variable unset: bfloat16 teacher weights and student compute, float32
master weights and AdamW state, on a CPU whose bf16 units the probe finds fast). An ``auto`` run
is scored twice at the end: by its bf16 forward (the run's own figure) and with its float32
master weights (what a checkpoint or an export holds; ``xdistill.student.mixed.master_weights``).

Writes ``<report-dir>/evidence/dtype_bpb.json`` (every run's figures: the raw results) and the
table ``<report-dir>/dtype_bpb.md`` generated from it alone (``--report-only`` regenerates it).
Runs are cached by configuration under ``--out`` (a killed run restarts where it stopped).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import distill  # this script's folder is on the path when it runs
import splits
import study

HERE = Path(__file__).resolve().parent
DTYPES = ("float32", "auto")
STAGE_OF = {"ce": "ce_lr", "pkl": "pkl_lr"}


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--study-out", type=Path, default=Path("runs/real_a2"),
                   help="the real study's run folder (its data, projection and teacher)")
    p.add_argument("--out", type=Path, default=Path("runs/dtype_bpb"))
    p.add_argument("--arms", default="ce,pkl")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--report-dir", type=Path, default=HERE)
    p.add_argument("--smoke", action="store_true",
                   help="2 steps, 1 evaluation batch: checks the plumbing only (use other "
                        "--out and --report-dir)")
    p.add_argument("--report-only", action="store_true",
                   help="regenerate the table from <report-dir>/evidence/dtype_bpb.json")
    args = p.parse_args(argv)
    base = study.parse(["--out", str(args.study_out), "--scheme", "blocks",  # amendment 2's
                        *(["--smoke"] if args.smoke else [])])
    for k, v in vars(base).items():
        if not hasattr(args, k):          # --out, --arms, --seeds, --report-dir are ours
            setattr(args, k, v)
    args.arm_list, args.seed_list = args.arms.split(","), [int(s) for s in args.seeds.split(",")]
    return args


def figures(res: dict, dtype: str) -> dict:
    row = {"bpb": res["curve"][-1]["bpb"], "seconds": res["seconds"],
           "compute_dtype": res.get("compute_dtype", "float32")}
    if dtype == "auto":
        row["masters_bpb"] = res["masters_bpb"]["eval"]
    return row


def run_all(args) -> dict:
    state = json.loads((args.study_out / "study.json").read_text())
    teacher = state["teacher"]["chosen"]["model"]
    if not Path(teacher).is_dir():
        raise SystemExit(f"[dtype] the study's teacher {teacher} is missing: run "
                         f"benchmarks/real/study.py --out {args.study_out} first (it rebuilds it)")
    data = splits.prepare_splits(args.study_out, args.slice_kb, args.scheme)  # reused, not rewritten
    ev = study.evals(args, data)["valid"]
    at_study = argparse.Namespace(**{**vars(args), "out": args.study_out})  # its projection
    a = {**study.base_assets(at_study, data), "teacher": teacher, "eval": ev}
    rows = []
    for seed in args.seed_list:
        for arm in args.arm_list:
            lr = state[STAGE_OF[arm]]["chosen"]
            for dtype in DTYPES:
                if dtype == "float32":
                    os.environ["XDISTILL_AUTO_DTYPE"] = "float32"
                else:
                    os.environ.pop("XDISTILL_AUTO_DTYPE", None)
                res = distill.run_arm(arm, seed, args, {**a, "lr": lr,
                                                        "score_masters": dtype == "auto"},
                                      args.out / dtype)
                rows.append({"arm": arm, "seed": seed, "dtype": dtype, "lr": lr,
                             **figures(res, dtype)})
    return {"rows": rows, "hardware": study.hardware(), "teacher": teacher,
            "records": recorded(args, state),
            "command": "python benchmarks/real/dtype_bpb.py " + " ".join(sys.argv[1:])}


def recorded(args, state: dict) -> dict:
    """The study's recorded float32 validation bits per byte of these jobs (tuning seeds)."""
    out = {}
    for arm in args.arm_list:
        stage = state[STAGE_OF[arm]]
        bpbs = stage["grid"][f"{stage['chosen']:g}"]["bpb"]
        out[arm] = {str(s): b for s, b in zip(study.TUNE_SEEDS, bpbs)}
    return out


def _ms(xs: list[float]) -> str:
    return f"{statistics.fmean(xs):.4f} ± {statistics.stdev(xs):.4f}" if len(xs) > 1 \
        else f"{xs[0]:.4f}"


def table(raw: dict) -> str:
    rows = raw["rows"]
    lines = ["| arm | seed | float32 | auto (bf16 forward) | auto (float32 masters) | auto dtype "
             "| float32 recorded | s float32 / s auto |", "|---|---|---|---|---|---|---|---|"]
    summary = ["| arm | float32 mean ± sd | auto mean ± sd | auto masters mean ± sd | auto - "
               "float32 (paired mean) | masters - float32 | within one float32 sd | time ratio |",
               "|---|---|---|---|---|---|---|---|"]
    for arm in dict.fromkeys(r["arm"] for r in rows):
        f32 = {r["seed"]: r for r in rows if r["arm"] == arm and r["dtype"] == "float32"}
        aut = {r["seed"]: r for r in rows if r["arm"] == arm and r["dtype"] == "auto"}
        seeds = sorted(set(f32) & set(aut))
        for s in seeds:
            rec = raw["records"].get(arm, {}).get(str(s))
            lines.append(f"| {arm} | {s} | {f32[s]['bpb']:.4f} | {aut[s]['bpb']:.4f} | "
                         f"{aut[s]['masters_bpb']:.4f} | {aut[s]['compute_dtype']} | "
                         f"{'' if rec is None else f'{rec:.4f}'} | "
                         f"{f32[s]['seconds'] / aut[s]['seconds']:.2f} |")
        if len(seeds) < 2:
            continue
        a32 = [f32[s]["bpb"] for s in seeds]
        ab = [aut[s]["bpb"] for s in seeds]
        am = [aut[s]["masters_bpb"] for s in seeds]
        sd = statistics.stdev(a32)
        d, dm = statistics.fmean(ab) - statistics.fmean(a32), statistics.fmean(am) - statistics.fmean(a32)
        ok = "yes" if abs(d) <= sd else "no"
        ratio = sum(f32[s]["seconds"] for s in seeds) / sum(aut[s]["seconds"] for s in seeds)
        summary.append(f"| {arm} | {_ms(a32)} | {_ms(ab)} | {_ms(am)} | {d:+.4f} | {dm:+.4f} | "
                       f"{ok} (sd {sd:.4f}) | {ratio:.2f} |")
    return "\n".join([f"Hardware: {raw['hardware']}. Teacher: `{raw['teacher']}`. Command: "
                      f"`{raw['command']}`. Validation bits per byte after 60 steps (lower is "
                      "better); time ratio = whole-run seconds float32 / auto (training and its "
                      "evaluations; other jobs may share the cores).", "", *summary, "",
                      *lines])


def main(argv=None) -> int:
    args = parse(argv)
    raw_path = args.report_dir / "evidence" / "dtype_bpb.json"
    if args.report_only:
        raw = json.loads(raw_path.read_text())
    else:
        raw = run_all(args)
        raw_path.parent.mkdir(parents=True, exist_ok=True)
        raw_path.write_text(json.dumps(raw, indent=1))
    md = args.report_dir / "dtype_bpb.md"
    head = "# Held-out bits per byte: `dtype: auto` vs float32, same seeds\n\n"
    keep = md.read_text().split("<!-- generated -->")[-1] if md.exists() else ""
    md.write_text(head + "<!-- generated: dtype_bpb.py from evidence/dtype_bpb.json -->\n" +
                  table(raw) + "\n<!-- generated -->" + keep)
    distill.say(table(raw))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
