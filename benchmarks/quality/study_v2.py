"""The issue-24 on-policy credit study, second protocol: a teacher that knows more than the labels.

The protocol is written in ``benchmarks/quality/RESULTS.md`` ("On-policy credit study, second
protocol", committed before its runs); this script runs it stage by stage without a hand-set
number (the first protocol's script, ``study.py``, supplies the shared helpers):

    python benchmarks/quality/study_v2.py --out runs/q24v2 --cache runs/q24_prep --jobs 2

What differs from the first protocol: the student's corpus labels only ``STUDENT_PAIRS`` of the
600 training problems; the teachers trained on all 600, and the on-policy arms' prompts are all
600 (``--prompt-pool train``), so on half of them the teacher is the only source of the answer.
Each method gets its own continuation learning rate, chosen on validation (``FAMILY``).

Stages (choices appended to ``<out>/study.json``; runs cached by the harness):

1. ``warm``    CE on the labeled problems, seed 0, 3,000 steps scored on validation every 100;
               the warm start is the CE arm trained for the step count of the best checkpoint
               (the earliest on a tie).
2. ``lr``      seeds 0-2, validation, every rate of ``LR_GRID`` for continued CE and for each
               tuned method with the same-tokenizer control teacher (``TUNED``); each picks its
               best mean validation accuracy (ties: the smaller rate).
3. ``screen``  continued CE and every cross-tokenizer kind at its family's rate, seeds 0-2,
               validation; ranked; collapsed = final format rate < 0.9 on a seed.
4. ``confirm`` k1 and the two best screened kinds other than k1 (not collapsed), each with its
               same-tokenizer control, plus continued CE; fresh seeds 20-24; the test split,
               scored once; the confirmation table is generated into RESULTS.md
               (``GENERATED:credit24v2``).

Raw per-run results: ``benchmarks/quality/credit24v2/{warm,lr,screen,confirm}.json``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import study  # the first protocol's helpers (this script's folder is on the path when it runs)


HERE = Path(__file__).resolve().parent
RECORDS = HERE / "credit24v2"
STUDENT_PAIRS = 300
TASK = ["--answer-noise", "0", "--twin-free", "--n-valid", "150", "--eval-every", "100",
        "--student-pairs", str(STUDENT_PAIRS), "--prompt-pool", "train"]
LR_GRID = (3e-5, 1e-4, 3e-4)
CONT_STEPS = 500
PILOT_STEPS = 3000
# tuned arm -> the arms that use its rate (a kind's byte-credit variant and its same-tokenizer
# control use the kind's rate; k3 and DPCA are sampled-token estimators like k1; ESCD is BPM plus
# a completion term; strict top-k is reverse KL on exact positions)
FAMILY = {
    "cont_ce": ("cont_ce",),
    "op_k1_same": ("op_k1", "op_k1_byte", "op_k3", "op_k3_byte", "op_dpca", "op_dpca_byte"),
    "op_simple_same": ("op_simple", "op_simple_byte"),
    "op_bpm_same": ("op_bpm", "op_escd"),
    "op_rkl_same": ("op_rkl", "op_strict"),
}
TUNED = tuple(FAMILY)
SCREEN_ARMS = tuple(a for arm in TUNED[1:] for a in FAMILY[arm])
SCREEN_SEEDS = (0, 1, 2)
CONFIRM_SEEDS = (20, 21, 22, 23, 24)
STAGES = ("warm", "lr", "screen", "confirm")
say = study.say


def run(args, out: Path, arms, seeds, steps: int, extra=()) -> list[dict]:
    return study.harness(out, args, arms, seeds, steps,
                         ["--cont-steps", str(CONT_STEPS), *extra])


def best_step(curve: list) -> int:
    """The step of the best checkpoint of ``curve`` (``[step, accuracy]``; earliest on a tie)."""
    if not curve:
        raise SystemExit("[study] the warm-start pilot has no learning curve")
    best = max(acc for _, acc in curve)
    return int(next(step for step, acc in curve if acc == best))


def rate_of(arm: str, chosen: dict) -> float:
    """The continuation rate of ``arm``: its family's chosen rate (module doc)."""
    kind = arm.removesuffix("_same")
    for tuned, members in FAMILY.items():
        if arm == tuned or kind in members:
            return chosen[tuned]
    raise KeyError(f"no learning-rate family for arm {arm!r}")


def arm_lr_flag(arms, chosen: dict) -> list[str]:
    pairs = [f"{a}={rate_of(a, chosen):g}" for a in arms if a != "cont_ce"]
    return ["--cont-lr", f"{chosen['cont_ce']:g}", "--arm-lr", ",".join(pairs)] if pairs else \
        ["--cont-lr", f"{chosen['cont_ce']:g}"]


def stage_warm(args, state: dict) -> None:
    out = args.out / "warm_pilot"
    runs = study.harness(out, args, ["ce"], [0], PILOT_STEPS,
                         ["--eval-split", "valid", "--no-report"])
    study.record(out, "warm", RECORDS)
    curve = runs[0]["curve"]
    state["warm"] = {"rule": "step of the pilot's best validation checkpoint (earliest on a tie)",
                     "pilot_steps": PILOT_STEPS, "pilot_curve": curve,
                     "steps": best_step(curve)}
    say(f"warm start: CE for {state['warm']['steps']} steps")


def stage_lr(args, state: dict) -> None:
    steps, table = state["warm"]["steps"], {arm: {} for arm in TUNED}
    raw = {}
    for lr in LR_GRID:
        out = args.out / f"lr_{lr:g}"
        study.share_ce(args, out, SCREEN_SEEDS)
        runs = run(args, out, list(TUNED), SCREEN_SEEDS, steps,
                   ["--eval-split", "valid", "--cont-lr", f"{lr:g}", "--no-report"])
        raw[f"{lr:g}"] = runs
        for arm in TUNED:
            accs = [r["accuracy"] for r in runs if r["arm"] == arm and "error" not in r]
            table[arm][f"{lr:g}"] = {"accuracies": accs, "mean": statistics.fmean(accs),
                                     "min_format_rate": min(r.get("format_rate", 0.0) for r in runs
                                                            if r["arm"] == arm)}
    RECORDS.mkdir(exist_ok=True)
    (RECORDS / "lr.json").write_text(json.dumps(raw, indent=1))
    chosen = {arm: study.choose_lr(table[arm]) for arm in TUNED}
    state["lr"] = {"grid": table, "chosen": chosen, "families": FAMILY,
                   "rule": "per tuned arm, best mean validation accuracy over seeds 0-2"}
    say("learning rates: " + ", ".join(f"{a} {lr:g}" for a, lr in chosen.items()))


def stage_screen(args, state: dict) -> None:
    out, chosen = args.out / "screen", state["lr"]["chosen"]
    study.share_ce(args, out, SCREEN_SEEDS)
    arms = ["cont_ce", *SCREEN_ARMS]
    runs = run(args, out, arms, SCREEN_SEEDS, state["warm"]["steps"],
               ["--eval-split", "valid", *arm_lr_flag(arms, chosen),
                "--report-dir", str(HERE), "--tag", "screen24v2"])
    study.record(out, "screen", RECORDS)
    state["screen"] = study.screen_choice(runs, SCREEN_ARMS)


def stage_confirm(args, state: dict) -> None:
    out, chosen = args.out / "confirm", state["lr"]["chosen"]
    arms = study.confirm_arms(state)
    run(args, out, arms, CONFIRM_SEEDS, state["warm"]["steps"],
        ["--eval-split", "heldout", *arm_lr_flag(arms, chosen),
         "--report-dir", str(HERE), "--tag", "credit24v2"])
    study.record(out, "confirm", RECORDS)
    state["confirm"] = {"arms": arms, "seeds": list(CONFIRM_SEEDS),
                        "rates": {a: rate_of(a, chosen) for a in arms}}


STAGE_FUNCS = {"warm": stage_warm, "lr": stage_lr, "screen": stage_screen,
               "confirm": stage_confirm}


def main(argv=None) -> int:
    args = study.base_parser("runs/q24v2", STAGES, __doc__).parse_args(argv)
    args.task, args.lr_grid = TASK, LR_GRID
    return study.run_stages(args, STAGES, STAGE_FUNCS, RECORDS)


if __name__ == "__main__":
    sys.exit(main())
