"""The issue-24 on-policy credit study, tenth protocol: a baseline that the wrong answers' extreme
log-ratios cannot drag down (``loss.advantage_baseline: clipped_mean``), with both teachers.

The protocol is written in ``benchmarks/quality/RESULTS.md`` ("On-policy credit study, tenth
protocol", committed before its runs); this script runs it without a hand-set number:

    python benchmarks/quality/study_v10.py --out runs/q24v10 --cache runs/q24_prep --jobs 2

The fifth protocol's task and rates (read from ``credit24v5/study.json``), one stage:

``confirm``  continued CE and four k1 arms, all with the 2-nat clamp, on fresh seeds 120-129,
             the unlabeled test half, scored once:
             ``op_k1_same_mean_clip`` (A: same-tokenizer teacher, ``mean`` baseline: the
             confirmed estimator), ``op_k1_byte_mean_clip`` (C: cross-tokenizer teacher, byte
             credit, ``mean``), ``op_k1_same_cmean_clip`` (A') and ``op_k1_byte_cmean_clip``
             (C'): the same with ``clipped_mean``. The generated block ``GENERATED:credit24v10``
             holds the four arms against continued CE (Holm over four); ``study.json`` adds
             decision (a), ``clipped_mean`` against ``mean`` per teacher (A' - A, C' - C: Welch
             and paired t, Holm over two), and (b), each estimator's penalty with a bootstrap
             interval and the penalty of the estimator with the larger same-tokenizer gain.

Raw per-run results: ``benchmarks/quality/credit24v10/confirm.json`` and ``study.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import study  # the first protocol's helpers (this script's folder is on the path when it runs)
import study_v5 as v5
import study_v6 as v6
from toyq.confirm import accuracy_by_arm, comparisons
from toyq.stats import compare, penalty_interval

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "credit24v10"
SAME, CROSS = "op_k1_same_mean_clip", "op_k1_byte_mean_clip"
SAME_C, CROSS_C = "op_k1_same_cmean_clip", "op_k1_byte_cmean_clip"
ARMS = ("cont_ce", SAME, CROSS, SAME_C, CROSS_C)
CONFIRM_SEEDS = tuple(range(120, 130))
STAGES = ("confirm",)
ALPHA = 0.05
say = study.say


def estimator_tests(runs: list[dict]) -> dict:
    """Decision (a): ``clipped_mean`` against ``mean`` per teacher on their shared seeds (Welch
    and paired t, Holm over the two; *passes* on the paired test, the one the seed-matched design
    is for, with Welch reported), and (b): each estimator's penalty with its bootstrap interval,
    and which estimator the issue's penalty is read from (the larger same-tokenizer gain)."""
    acc = accuracy_by_arm(runs)
    tests = compare(acc, [(SAME_C, SAME), (CROSS_C, CROSS)], higher_is_better=True,
                    shared_seeds=True)
    out = {"clipped_vs_mean": {}}
    for teacher, c in zip(("same", "cross"), tests):
        out["clipped_vs_mean"][teacher] = {
            "arm": c.arm, "baseline": c.baseline, "difference": c.gain, "welch_p": c.welch.p,
            "paired_p": c.paired.p, "welch_holm": c.welch_holm, "paired_holm": c.paired_holm,
            "passes_paired": c.gain > 0 and c.paired_holm < ALPHA,
            "passes_both": c.passes(ALPHA)}
    seeds = sorted(set.intersection(*(set(acc[a]) for a in ARMS)))
    gains = {a: sum(acc[a][s] - acc["cont_ce"][s] for s in seeds) / len(seeds) for a in ARMS[1:]}
    pens = {}
    for name, (same, cross) in (("mean", (SAME, CROSS)), ("clipped_mean", (SAME_C, CROSS_C))):
        pen, lo, hi = penalty_interval([[(acc[same][s] - acc["cont_ce"][s],
                                          acc[cross][s] - acc["cont_ce"][s]) for s in seeds]])
        pens[name] = {"penalty": pen, "interval": [lo, hi]}
    chosen = "clipped_mean" if gains[SAME_C] > gains[SAME] else "mean"
    out.update(seeds=seeds, gains=gains, penalties=pens, penalty_estimator=chosen,
               penalty=pens[chosen]["penalty"])
    return out


def stage_confirm(args, state: dict) -> None:
    chosen = v6.fifth_rates()
    runs = v6.confirm_runs(args, ARMS, CONFIRM_SEEDS, chosen, "credit24v10", RECORDS)
    comps = {c["arm"]: c for c in comparisons(runs)}
    parts = estimator_tests(runs)
    state["confirm"] = {**v6.confirm_state(ARMS, CONFIRM_SEEDS, chosen, comps), **parts}
    g, p = parts["gains"], parts["penalties"]
    say(f"gains A {g[SAME]:+.3f}, C {g[CROSS]:+.3f}, A' {g[SAME_C]:+.3f}, C' {g[CROSS_C]:+.3f}; "
        f"penalty mean {p['mean']['penalty']:.2f}, clipped_mean {p['clipped_mean']['penalty']:.2f} "
        f"(issue's figure: {parts['penalty_estimator']})")


STAGE_FUNCS = {"confirm": stage_confirm}


def main(argv=None) -> int:
    return study.protocol_main(argv, "runs/q24v10", STAGES, STAGE_FUNCS, RECORDS, v5.TASK, __doc__)


if __name__ == "__main__":
    sys.exit(main())
