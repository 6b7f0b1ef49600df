"""The issue-24 on-policy credit study, eighth protocol: the advantage baseline taken per student
token, so that it does not depend on how the teacher's tokenization groups the student's tokens.

The protocol is written in ``benchmarks/quality/RESULTS.md`` ("On-policy credit study, eighth
protocol", committed before its runs); this script runs it without a hand-set number:

    python benchmarks/quality/study_v8.py --out runs/q24v8 --cache runs/q24_prep --jobs 2

The fifth protocol's task and rates (read from ``credit24v5/study.json``), one stage:

``confirm``  continued CE, ``op_k1_same_mean_clip`` (the same-tokenizer control),
             ``op_k1_byte_mean_clip`` (the seventh protocol's cross-tokenizer arm: the baseline
             is the mean over units) and ``op_k1_byte_tmean_clip`` (the baseline per student
             token, ``loss.advantage_baseline: token_mean``) on fresh seeds 90-99, the unlabeled
             test half, scored once. The generated block ``GENERATED:credit24v8`` holds the three
             k1 arms against continued CE (Welch and paired t, Holm over the three) and each
             byte-credit arm's cross-tokenizer penalty; ``study.json`` adds the direct
             comparison ``tmean`` vs ``mean`` (a family of one).

Raw per-run results: ``benchmarks/quality/credit24v8/confirm.json`` and ``study.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import study  # the first protocol's helpers (this script's folder is on the path when it runs)
import study_v5 as v5
import study_v6 as v6
from toyq.confirm import accuracy_by_arm, comparisons, control_arm
from toyq.stats import compare, penalty

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "credit24v8"
NEW, OLD = "op_k1_byte_tmean_clip", "op_k1_byte_mean_clip"
ARMS = ("cont_ce", control_arm(NEW), OLD, NEW)
CONFIRM_SEEDS = tuple(range(90, 100))
STAGES = ("confirm",)
say = study.say


def direct(runs: list[dict]) -> dict:
    """``NEW`` vs ``OLD`` on their shared seeds (Welch and paired t; one comparison)."""
    per_seed = accuracy_by_arm(runs, (NEW, OLD))
    (c,) = compare(per_seed, [(NEW, OLD)], higher_is_better=True, shared_seeds=True)
    return {"gain": c.gain, "welch_p": c.welch.p, "paired_p": c.paired.p,
            "passes": c.passes(0.05)}


def stage_confirm(args, state: dict) -> None:
    chosen = v6.fifth_rates()
    runs = v6.confirm_runs(args, ARMS, CONFIRM_SEEDS, chosen, "credit24v8", RECORDS)
    comps = {c["arm"]: c for c in comparisons(runs)}
    same = comps[control_arm(NEW)]
    state["confirm"] = {
        **v6.confirm_state(ARMS, CONFIRM_SEEDS, chosen, comps),
        "penalty": {a: penalty(comps[a]["gain"], same["gain"]) for a in (NEW, OLD)},
        "tmean_vs_mean": direct(runs)}
    pen = state["confirm"]["penalty"]
    say(f"control {same['arm']} {same['gain']:+.3f}; {NEW} {comps[NEW]['gain']:+.3f} "
        f"(penalty {pen[NEW]:.2f}); {OLD} {comps[OLD]['gain']:+.3f} (penalty {pen[OLD]:.2f}); "
        f"tmean - mean {state['confirm']['tmean_vs_mean']['gain']:+.3f}")


STAGE_FUNCS = {"confirm": stage_confirm}


def main(argv=None) -> int:
    return study.protocol_main(argv, "runs/q24v8", STAGES, STAGE_FUNCS, RECORDS, v5.TASK, __doc__)


if __name__ == "__main__":
    sys.exit(main())
