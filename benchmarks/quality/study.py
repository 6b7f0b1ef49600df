"""The issue-24 on-policy credit study, run stage by stage as its protocol fixes it.

The protocol is written in ``benchmarks/quality/RESULTS.md`` ("On-policy credit study: protocol,
written before any run"); this script runs it without a hand-set number:

    python benchmarks/quality/study.py --out runs/q24 --jobs 2             # every stage in order
    python benchmarks/quality/study.py --out runs/q24 --stage screen       # one stage (the ones it
                                                                            # needs must be done)

Stages (each one's choices are appended to ``<out>/study.json`` and reused when it runs again;
every training run is cached by the harness, so the study can span several sessions):

1. ``warm``    CE on clean answers, seed 0, ``--pilot-steps`` steps scored on the validation
               split every 100 steps; the warm-start step count is the first checkpoint whose
               validation accuracy is >= ``--warm-accuracy`` (0.30). The warm student of every
               later run is the CE arm trained for that many steps (its own schedule).
2. ``lr``      continued CE only, seeds 0-2, each learning rate of ``--lr-grid``; the study's
               continuation learning rate is the one with the best mean validation accuracy
               (ties: the smaller rate). Every arm uses it.
3. ``screen``  continued CE and every on-policy kind (``SCREEN_ARMS``), seeds 0-2, validation
               split; kinds ranked by mean validation accuracy; a kind whose final format rate is
               below 0.9 on any seed is marked collapsed.
4. ``confirm`` k1 and the two best screened kinds other than k1 (collapsed kinds are not
               eligible), each with the cross-tokenizer teacher and its same-tokenizer control
               (``op_<kind>_same``; the control of a byte-credit kind is the same kind's control,
               since over one tokenizer byte credit and token credit coincide), plus continued CE;
               fresh seeds 10-14; the **test** split, scored once. The confirmation table
               (Welch and paired t, Holm over its comparisons, the penalty) is generated into
               ``RESULTS.md`` (block ``GENERATED:credit24``).

Raw per-run results: ``benchmarks/quality/credit24/{lr,screen,confirm}.json`` (copies of each
stage's ``results.json``) and ``study.json`` (the choices and their inputs); the tables are
generated from them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from toyq.confirm import MIN_FORMAT_RATE, control_arm

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "credit24"
TASK = ["--answer-noise", "0", "--twin-free", "--n-valid", "150", "--eval-every", "100"]
LR_GRID = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3)
SCREEN_ARMS = ("op_k1", "op_k1_byte", "op_k3", "op_k3_byte", "op_dpca", "op_dpca_byte",
               "op_simple", "op_simple_byte", "op_rkl", "op_strict", "op_bpm", "op_escd")
SCREEN_SEEDS = (0, 1, 2)
CONFIRM_SEEDS = (10, 11, 12, 13, 14)
STAGES = ("warm", "lr", "screen", "confirm")


def say(msg: str) -> None:
    print(f"[study] {msg}", flush=True)


def harness(out: Path, args, arms, seeds, steps: int, extra=()) -> list[dict]:
    """One harness invocation (its own process, as a user runs it); its ``results.json`` runs."""
    cmd = [sys.executable, str(HERE / "run.py"), "--out", str(out), "--cache",
           str(args.cache or args.out / "prepared"), "--arms", ",".join(arms),
           "--seeds", ",".join(map(str, seeds)), "--steps", str(steps), "--jobs",
           str(args.jobs), *getattr(args, "task", TASK), *extra]
    say("$ " + " ".join(cmd[1:]))
    rc = subprocess.call(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    results = json.loads((out / "results.json").read_text())
    if rc != 0:
        bad = [f"{r['arm']} seed {r['seed']}" for r in results["runs"] if "error" in r]
        raise SystemExit(f"[study] the harness failed in {out} ({', '.join(bad) or f'exit {rc}'});"
                         f" fix it and run this stage again (finished runs are reused)")
    return results["runs"]


def share_ce(args, stage: Path, seeds) -> None:
    """Reuse the warm-start CE runs of the first grid point in ``stage`` (a link per seed; the
    harness compares their config with the one it would generate, so a mismatch is still
    caught)."""
    base = args.out / f"lr_{args.lr_grid[0]:g}"
    for s in seeds:
        src, dst = base / "runs" / "ce" / f"seed{s}", stage / "runs" / "ce" / f"seed{s}"
        if src.is_dir() and not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.symlink_to(src.resolve(), target_is_directory=True)


def load_state(out: Path) -> dict:
    path = out / "study.json"
    return json.loads(path.read_text()) if path.exists() else {}


def save_state(out: Path, state: dict, records: Path = RECORDS) -> None:
    (out / "study.json").write_text(json.dumps(state, indent=1))
    records.mkdir(exist_ok=True)
    (records / "study.json").write_text(json.dumps(state, indent=1))


def record(stage_out: Path, name: str, records: Path = RECORDS) -> None:
    records.mkdir(exist_ok=True)
    shutil.copyfile(stage_out / "results.json", records / f"{name}.json")


def stage_warm(args, state: dict) -> None:
    out = args.out / "warm_pilot"
    runs = harness(out, args, ["ce"], [0], args.pilot_steps,
                   ["--eval-split", "valid", "--no-report"])
    curve = runs[0]["curve"]
    steps = warm_steps(curve, args.warm_accuracy)
    state["warm"] = {"rule": f"first checkpoint with validation accuracy >= {args.warm_accuracy}",
                     "pilot_steps": args.pilot_steps, "pilot_curve": curve, "steps": steps}
    say(f"warm start: CE for {steps} steps")


def warm_steps(curve: list, threshold: float) -> int:
    """The first checkpoint step of ``curve`` (``[step, accuracy]`` pairs) at ``threshold``."""
    hit = [step for step, acc in curve if acc >= threshold]
    if not hit:
        raise SystemExit(f"[study] CE never reached validation accuracy {threshold} (curve "
                         f"{curve}); raise --pilot-steps")
    return int(hit[0])


def choose_lr(table: dict) -> float:
    """The grid rate with the best mean accuracy; a tie goes to the smaller rate."""
    return min((float(k) for k in table), key=lambda lr: (-table[f"{lr:g}"]["mean"], lr))


def stage_lr(args, state: dict) -> None:
    steps, table = state["warm"]["steps"], {}
    for lr in args.lr_grid:
        out = args.out / f"lr_{lr:g}"
        share_ce(args, out, SCREEN_SEEDS)
        runs = harness(out, args, ["cont_ce"], SCREEN_SEEDS, steps,
                       ["--eval-split", "valid", "--cont-lr", f"{lr:g}", "--no-report"])
        accs = [r["accuracy"] for r in runs if r["arm"] == "cont_ce"]
        table[f"{lr:g}"] = {"accuracies": accs, "mean": statistics.fmean(accs)}
    record_lr(args)
    best = choose_lr(table)
    state["lr"] = {"grid": table, "chosen": best,
                   "rule": "best mean validation accuracy of continued CE, seeds 0-2"}
    say(f"continuation learning rate: {best:g} ({table[f'{best:g}']['mean']:.3f})")


def rank(runs: list[dict], arms) -> list[dict]:
    """Screened kinds, best first: mean validation accuracy, lowest format rate, collapsed."""
    rows = []
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm and "error" not in r]
        if not mine:
            continue
        fmt = min(r.get("format_rate", 0.0) for r in mine)
        rows.append({"arm": arm, "seeds": len(mine),
                     "mean_accuracy": statistics.fmean(r["accuracy"] for r in mine),
                     "min_format_rate": fmt, "collapsed": fmt < MIN_FORMAT_RATE})
    return sorted(rows, key=lambda r: -r["mean_accuracy"])


def stage_screen(args, state: dict) -> None:
    out, lr = args.out / "screen", state["lr"]["chosen"]
    share_ce(args, out, SCREEN_SEEDS)
    runs = harness(out, args, ["cont_ce", *SCREEN_ARMS], SCREEN_SEEDS, state["warm"]["steps"],
                   ["--eval-split", "valid", "--cont-lr", f"{lr:g}",
                    "--report-dir", str(HERE), "--tag", "screen24"])
    record(out, "screen")
    state["screen"] = screen_choice(runs, SCREEN_ARMS)


def screen_choice(runs: list[dict], arms) -> dict:
    """The screening record: ranking, continued CE's mean, and the two best kinds other than k1
    that did not collapse (they go to the confirmation)."""
    ranking = rank(runs, arms)
    eligible = [r["arm"] for r in ranking if not r["collapsed"] and r["arm"] != "op_k1"]
    say(f"screening: confirm op_k1 and {', '.join(eligible[:2])}")
    return {"ranking": ranking, "cont_ce": statistics.fmean(
        r["accuracy"] for r in runs if r["arm"] == "cont_ce"), "confirm": eligible[:2]}


def confirm_arms(state: dict) -> list[str]:
    """Continued CE, then k1 and the screened kinds, each followed by its same-tokenizer
    control (a shared control once)."""
    kinds = ["op_k1", *state["screen"]["confirm"]]
    return list(dict.fromkeys(["cont_ce"] + [a for k in kinds for a in (k, control_arm(k))]))


def stage_confirm(args, state: dict) -> None:
    out, lr = args.out / "confirm", state["lr"]["chosen"]
    arms = confirm_arms(state)
    harness(out, args, arms, CONFIRM_SEEDS, state["warm"]["steps"],
            ["--eval-split", "heldout", "--cont-lr", f"{lr:g}",
             "--report-dir", str(HERE), "--tag", "credit24"])
    record(out, "confirm")
    state["confirm"] = {"arms": arms, "seeds": list(CONFIRM_SEEDS)}


def base_parser(default_out: str, stages, doc: str = __doc__) -> argparse.ArgumentParser:
    """The options every study script has (its own ``--out`` default, stages and help text)."""
    p = argparse.ArgumentParser(description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path(default_out))
    p.add_argument("--cache", type=Path, default=None,
                   help="prepared-assets cache (default <out>/prepared)")
    p.add_argument("--stage", choices=tuple(stages) + ("all",), default="all")
    p.add_argument("--jobs", type=int, default=2)
    return p


def parse(argv=None):
    p = base_parser("runs/q24", STAGES)
    p.add_argument("--pilot-steps", type=int, default=3000)
    p.add_argument("--warm-accuracy", type=float, default=0.30)
    p.add_argument("--lr-grid", type=lambda s: tuple(float(x) for x in s.split(",")),
                   default=LR_GRID)
    return p.parse_args(argv)


def run_stages(args, stages, funcs: dict, records: Path = RECORDS) -> int:
    """Run ``args.stage`` (or all ``stages`` in order), each only after the ones before it
    are recorded in ``<out>/study.json``; the state is saved after every stage."""
    args.out.mkdir(parents=True, exist_ok=True)
    state = load_state(args.out)
    for name in stages if args.stage == "all" else (args.stage,):
        missing = [s for s in stages[:stages.index(name)] if s not in state]
        if missing:
            raise SystemExit(f"[study] stage {name!r} needs {', '.join(missing)} first "
                             f"({args.out / 'study.json'} has no record of it)")
        funcs[name](args, state)
        save_state(args.out, state, records)
    return 0


def protocol_main(argv, default_out: str, stages, funcs: dict, records: Path, task,
                  doc: str, extend=None) -> int:
    """A later protocol's driver: the shared options (``--out`` defaulting to ``default_out``),
    its task flags, its stages in order; ``extend(parser)`` adds a protocol's own options."""
    parser = base_parser(default_out, stages, doc)
    if extend is not None:
        extend(parser)
    args = parser.parse_args(argv)
    args.task = task
    return run_stages(args, stages, funcs, records)


def main(argv=None) -> int:
    return run_stages(parse(argv), STAGES, STAGE_FUNCS)


def record_lr(args) -> None:
    """The lr grid's raw runs, one file (each grid point's results.json, by rate)."""
    RECORDS.mkdir(exist_ok=True)
    raw = {f"{lr:g}": json.loads((args.out / f"lr_{lr:g}" / "results.json").read_text())["runs"]
           for lr in args.lr_grid}
    (RECORDS / "lr.json").write_text(json.dumps(raw, indent=1))


STAGE_FUNCS = {"warm": stage_warm, "lr": stage_lr, "screen": stage_screen,
               "confirm": stage_confirm}

if __name__ == "__main__":
    sys.exit(main())
