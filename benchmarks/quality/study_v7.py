"""The issue-24 on-policy credit study, seventh protocol: the variance-reduced byte credit
against its fair same-tokenizer control.

The protocol is written in ``benchmarks/quality/RESULTS.md`` ("On-policy credit study, seventh
protocol", committed before its runs); this script runs it without a hand-set number:

    python benchmarks/quality/study_v7.py --out runs/q24v7 --cache runs/q24_prep --jobs 1

The fifth protocol's task and rates (read from ``credit24v5/study.json``), one stage:

``confirm``  continued CE, ``op_k1_same_mean_clip`` (k1 with the same-tokenizer teacher, the
             mean baseline and the 2-nat advantage clamp) and ``op_k1_byte_mean_clip`` (the
             same estimator, byte credit from the cross-tokenizer teacher) on fresh seeds 80-89,
             the unlabeled test half, scored once. The generated block ``GENERATED:credit24v7``
             holds both k1 arms against continued CE (Welch and paired t, Holm over the two) and
             the cross-tokenizer penalty of the byte-credit arm against its control.

Raw per-run results: ``benchmarks/quality/credit24v7/confirm.json`` and ``study.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import study  # the first protocol's helpers (this script's folder is on the path when it runs)
import study_v5 as v5
import study_v6 as v6
from toyq.confirm import comparisons, control_arm
from toyq.stats import penalty

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "credit24v7"
CROSS = "op_k1_byte_mean_clip"
ARMS = ("cont_ce", control_arm(CROSS), CROSS)
CONFIRM_SEEDS = tuple(range(80, 90))
STAGES = ("confirm",)
say = study.say


def stage_confirm(args, state: dict) -> None:
    chosen = v6.fifth_rates()
    runs = v6.confirm_runs(args, ARMS, CONFIRM_SEEDS, chosen, "credit24v7", RECORDS)
    comps = {c["arm"]: c for c in comparisons(runs)}
    cross, same = comps[CROSS], comps[control_arm(CROSS)]
    state["confirm"] = {
        **v6.confirm_state(ARMS, CONFIRM_SEEDS, chosen, comps),
        "penalty": penalty(cross["gain"], same["gain"])}
    say(f"control {same['arm']} {same['gain']:+.3f} (passes: {same['passes']}), {CROSS} "
        f"{cross['gain']:+.3f} (passes: {cross['passes']}); penalty "
        f"{state['confirm']['penalty']:.2f}")


STAGE_FUNCS = {"confirm": stage_confirm}


def main(argv=None) -> int:
    return study.protocol_main(argv, "runs/q24v7", STAGES, STAGE_FUNCS, RECORDS, v5.TASK, __doc__)


if __name__ == "__main__":
    sys.exit(main())
