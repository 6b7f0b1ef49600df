"""The issue-24 on-policy credit study, fifth protocol: k1's rate tuned on the unlabeled prompts.

The protocol is written in ``benchmarks/quality/RESULTS.md`` ("On-policy credit study, fifth
protocol", committed before its runs); this script runs it without a hand-set number:

    python benchmarks/quality/study_v5.py --out runs/q24v5 --cache runs/q24_prep --jobs 1

The fourth protocol's task (301 labeled training problems, 299 unlabeled ones the teachers
know, warm start = CE for ``WARM_STEPS``, ``CONT_STEPS`` continuation steps, prompts from all
600 training problems), with the 299 unlabeled problems cut in two halves
(:func:`toyq.task.unlabeled_halves`): rates are chosen on the tuning half, the confirmation is
scored once on the test half.

Stages (choices appended to ``<out>/study.json``; runs cached by the harness):

1. ``lr``      seeds 0-2, the tuning half, each rate of ``LR_GRID`` for continued CE and for k1
               with the same-tokenizer teacher; each picks its best mean accuracy (ties: the
               smaller rate). An arm whose best rate is at an end of the grid also runs the next
               rate beyond that end (``EDGE``) and picks again among all.
2. ``confirm`` ``CONFIRM_ARMS`` on fresh seeds 60-69, the test half, scored once; continued CE
               and the oracle at continued CE's rate, the three k1 arms at k1's. The generated
               block ``GENERATED:credit24v5`` holds the decision tests (Welch and paired t, Holm
               over the three k1 arms against continued CE).

Raw per-run results: ``benchmarks/quality/credit24v5/{lr,confirm}.json`` and ``study.json``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import study  # the first protocol's helpers (this script's folder is on the path when it runs)


HERE = Path(__file__).resolve().parent
RECORDS = HERE / "credit24v5"
WARM_STEPS = 1000
CONT_STEPS = 2000
TASK = ["--answer-noise", "0", "--twin-free", "--n-valid", "150", "--eval-every", "500",
        "--student-pairs", "300", "--prompt-pool", "train", "--cont-steps", str(CONT_STEPS)]
LR_GRID = (3e-5, 1e-4, 3e-4)
EDGE = {3e-5: 1e-5, 3e-4: 1e-3}    # a grid end -> the rate beyond it
TUNED = ("cont_ce", "op_k1_same")
K1_ARMS = ("op_k1_same", "op_k1", "op_k1_byte")
CONFIRM_ARMS = ("cont_ce", "cont_ce_oracle", *K1_ARMS)
TUNE_SEEDS = (0, 1, 2)
CONFIRM_SEEDS = tuple(range(60, 70))
STAGES = ("lr", "confirm")
say = study.say


def grid_point(args, lr: float, arms) -> list[dict]:
    """``arms`` continued at rate ``lr`` on the tuning seeds, scored on the tuning half."""
    out = args.out / f"lr_{lr:g}"
    study.share_ce(args, out, TUNE_SEEDS)
    return study.harness(out, args, list(arms), TUNE_SEEDS, WARM_STEPS,
                         ["--eval-split", "unlabeled_tune", "--cont-lr", f"{lr:g}",
                          "--no-report"])


def summarize(runs: list[dict], arm: str) -> dict:
    mine = [r for r in runs if r["arm"] == arm and "error" not in r]
    accs = [r["accuracy"] for r in mine]
    return {"accuracies": accs, "mean": statistics.fmean(accs),
            "min_format_rate": min(r.get("format_rate", 0.0) for r in mine)}


def stage_lr(args, state: dict) -> None:
    table: dict = {arm: {} for arm in TUNED}
    raw: dict = {}
    for lr in LR_GRID:
        raw[f"{lr:g}"] = runs = grid_point(args, lr, TUNED)
        for arm in TUNED:
            table[arm][f"{lr:g}"] = summarize(runs, arm)
    for arm in TUNED:
        edge = study.choose_lr(table[arm])
        if edge in EDGE:
            lr = EDGE[edge]
            say(f"{arm}: best rate {edge:g} is an end of the grid; running {lr:g} too")
            runs = grid_point(args, lr, [arm])
            raw.setdefault(f"{lr:g}", []).extend(runs)
            table[arm][f"{lr:g}"] = summarize(runs, arm)
    RECORDS.mkdir(exist_ok=True)
    (RECORDS / "lr.json").write_text(json.dumps(raw, indent=1))
    chosen = {arm: study.choose_lr(table[arm]) for arm in TUNED}
    state["lr"] = {"grid": table, "chosen": chosen,
                   "rule": "per tuned arm, best mean accuracy on the unlabeled tuning half over "
                           "seeds 0-2 (ties: the smaller rate); a best rate at a grid end also "
                           "runs the rate beyond it"}
    say("learning rates: " + ", ".join(f"{a} {lr:g}" for a, lr in chosen.items()))


def rate_of(arm: str, chosen: dict) -> float:
    """Continued CE and the oracle at continued CE's rate; every k1 arm at k1's."""
    return chosen["op_k1_same"] if arm in K1_ARMS else chosen["cont_ce"]


def stage_confirm(args, state: dict) -> None:
    out, chosen = args.out / "confirm", state["lr"]["chosen"]
    arm_lr = ",".join(f"{a}={rate_of(a, chosen):g}" for a in K1_ARMS)
    study.harness(out, args, list(CONFIRM_ARMS), CONFIRM_SEEDS, WARM_STEPS,
                  ["--eval-split", "unlabeled_test", "--cont-lr", f"{chosen['cont_ce']:g}",
                   "--arm-lr", arm_lr, "--report-dir", str(HERE), "--tag", "credit24v5"])
    study.record(out, "confirm", RECORDS)
    state["confirm"] = {"arms": list(CONFIRM_ARMS), "seeds": list(CONFIRM_SEEDS),
                        "rates": {a: rate_of(a, chosen) for a in CONFIRM_ARMS}}


STAGE_FUNCS = {"lr": stage_lr, "confirm": stage_confirm}


def main(argv=None) -> int:
    args = study.base_parser("runs/q24v5", STAGES, __doc__).parse_args(argv)
    args.task, args.lr_grid = TASK, LR_GRID
    return study.run_stages(args, STAGES, STAGE_FUNCS, RECORDS)


if __name__ == "__main__":
    sys.exit(main())
