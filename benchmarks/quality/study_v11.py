"""The issue-24 on-policy credit study, eleventh protocol: two teachers of each tokenizer, so
that the cross-tokenizer penalty is not read from one teacher of each.

The protocol is written in ``benchmarks/quality/RESULTS.md`` ("On-policy credit study, eleventh
protocol", committed before its runs); this script runs it without a hand-set number:

    python benchmarks/quality/study_v11.py --out runs/q24v11 --cache runs/q24_prep --jobs 2

The fifth protocol's task and rates (read from ``credit24v5/study.json``), the confirmed
estimator (k1, ``mean`` baseline, 2-nat clamp; byte credit with the cross-tokenizer teachers),
one stage:

``confirm``  continued CE and four k1 arms on fresh seeds 130-139, the unlabeled test half,
             scored once: ``op_k1_same_mean_clip`` (A: the same-tokenizer teacher of the earlier
             protocols), ``op_k1_same_mean_clip_t2`` (A2: a second same-tokenizer teacher, the
             same settings and data, training seed 1), ``op_k1_byte_mean_clip`` (C: the
             cross-tokenizer teacher of the earlier protocols) and ``op_k1_byte_mean_clip_t2``
             (C2: a second cross-tokenizer teacher, training seed 1). The generated block
             ``GENERATED:credit24v11`` holds the four arms against continued CE (Holm over
             four); ``study.json`` adds decision (a), the teacher effect within each tokenizer
             (A2 - A, C2 - C: Welch and paired t, Holm over two), (b) the penalty over both
             teachers of each tokenizer with its bootstrap interval (the issue's figure), (c) the
             four one-teacher-each penalties, and (d) the tokenizer effect over both teachers
             ((A + A2)/2 - (C + C2)/2 per seed, paired and Welch t).

Raw per-run results: ``benchmarks/quality/credit24v11/confirm.json`` and ``study.json``.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import study  # the first protocol's helpers (this script's folder is on the path when it runs)
import study_v5 as v5
import study_v6 as v6
from toyq.confirm import accuracy_by_arm, comparisons
from toyq.stats import compare, paired, penalty_interval, welch

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "credit24v11"
SAME, SAME2 = "op_k1_same_mean_clip", "op_k1_same_mean_clip_t2"
CROSS, CROSS2 = "op_k1_byte_mean_clip", "op_k1_byte_mean_clip_t2"
ARMS = ("cont_ce", SAME, SAME2, CROSS, CROSS2)
CONFIRM_SEEDS = tuple(range(130, 140))
STAGES = ("confirm",)
ALPHA = 0.05
GOAL = 0.2
say = study.say


def teacher_effect(acc: dict) -> dict:
    """Decision (a): the second teacher against the first within each tokenizer (A2 - A,
    C2 - C) on their shared seeds, Welch and paired t, Holm over the two; *differs* on the paired
    test (the seed-matched design's), Welch reported."""
    tests = compare(acc, [(SAME2, SAME), (CROSS2, CROSS)], higher_is_better=True,
                    shared_seeds=True)
    return {tok: {"arm": c.arm, "baseline": c.baseline, "difference": c.gain,
                  "welch_p": c.welch.p, "paired_p": c.paired.p, "welch_holm": c.welch_holm,
                  "paired_holm": c.paired_holm, "differs_paired": c.paired_holm < ALPHA}
            for tok, c in zip(("same", "cross"), tests)}


def _gain(acc: dict, arms, seed: int) -> float:
    """The mean gain of ``arms`` over continued CE on ``seed``."""
    return statistics.fmean(acc[a][seed] - acc["cont_ce"][seed] for a in arms)


def penalties(acc: dict, seeds: list[int]) -> dict:
    """(b) the penalty over both teachers of each tokenizer (the issue's figure) and (c) the four
    one-teacher-each penalties, each with its bootstrap interval (seeds resampled)."""
    def one(same_arms, cross_arms) -> dict:
        pen, lo, hi = penalty_interval([[(_gain(acc, same_arms, s), _gain(acc, cross_arms, s))
                                         for s in seeds]])
        return {"penalty": pen, "interval": [lo, hi]}

    both = one((SAME, SAME2), (CROSS, CROSS2))
    pairs = {f"{s}/{c}": one((s,), (c,)) for s in (SAME, SAME2) for c in (CROSS, CROSS2)}
    return {"both_teachers": {**both, "goal": GOAL, "met": both["penalty"] <= GOAL},
            "one_teacher_each": pairs}


def tokenizer_effect(acc: dict, seeds: list[int]) -> dict:
    """(d) per seed, the same-tokenizer teachers' mean gain minus the cross-tokenizer teachers'
    (paired t over seeds; Welch on the two per-seed means)."""
    same = [_gain(acc, (SAME, SAME2), s) for s in seeds]
    cross = [_gain(acc, (CROSS, CROSS2), s) for s in seeds]
    return {"difference": statistics.fmean(same) - statistics.fmean(cross),
            "paired_p": paired(same, cross).p, "welch_p": welch(same, cross).p}


def analyse(runs: list[dict]) -> dict:
    """Decisions (a)-(d) of the protocol (module doc) from the confirmation's runs."""
    acc = accuracy_by_arm(runs)
    seeds = sorted(set.intersection(*(set(acc[a]) for a in ARMS)))
    gains = {a: statistics.fmean(_gain(acc, (a,), s) for s in seeds) for a in ARMS[1:]}
    return {"seeds": seeds, "gains": gains, "teacher_effect": teacher_effect(acc),
            "penalties": penalties(acc, seeds), "tokenizer_effect": tokenizer_effect(acc, seeds)}


def stage_confirm(args, state: dict) -> None:
    chosen = v6.fifth_rates()
    runs = v6.confirm_runs(args, ARMS, CONFIRM_SEEDS, chosen, "credit24v11", RECORDS)
    comps = {c["arm"]: c for c in comparisons(runs)}
    parts = analyse(runs)
    state["confirm"] = {**v6.confirm_state(ARMS, CONFIRM_SEEDS, chosen, comps), **parts}
    g, p = parts["gains"], parts["penalties"]["both_teachers"]
    say(f"gains A {g[SAME]:+.3f}, A2 {g[SAME2]:+.3f}, C {g[CROSS]:+.3f}, C2 {g[CROSS2]:+.3f}; "
        f"penalty over both teachers {p['penalty']:.2f} [{p['interval'][0]:.2f}, "
        f"{p['interval'][1]:.2f}] (goal <= {GOAL})")


STAGE_FUNCS = {"confirm": stage_confirm}


def main(argv=None) -> int:
    return study.protocol_main(argv, "runs/q24v11", STAGES, STAGE_FUNCS, RECORDS, v5.TASK, __doc__)


if __name__ == "__main__":
    sys.exit(main())
