"""The issue-24 on-policy credit study, ninth protocol: one model scored two ways, so that the
cross-tokenizer penalty splits into what the byte credit costs and what the other model costs.

The protocol is written in ``benchmarks/quality/RESULTS.md`` ("On-policy credit study, ninth
protocol", committed before its runs); this script runs it without a hand-set number:

    python benchmarks/quality/study_v9.py --out runs/q24v9 --cache runs/q24_prep --jobs 2

The fifth protocol's task and rates (read from ``credit24v5/study.json``), one stage:

``confirm``  continued CE and three k1 arms with the seventh protocol's estimator (mean
             baseline, 2-nat clamp) on fresh seeds 100-119, the unlabeled test half, scored once:
             ``op_k1_same_mean_clip`` (A: same-tokenizer teacher, token credit),
             ``op_k1_twin_byte_mean_clip`` (B: the same teacher under a twin of the student's
             tokenizer, so through the cross-tokenizer pipeline: units, byte credit; amendment 1)
             and
             ``op_k1_byte_mean_clip`` (C: the cross-tokenizer teacher, byte credit). The
             generated block ``GENERATED:credit24v9`` holds the three arms against continued CE
             (Holm over three); ``study.json`` adds the decomposition (B - A: the credit with the
             model held fixed; C - B: the model and its tokenization's units with the credit held
             fixed; Welch and paired t, Holm over two) and C's penalty against A with a bootstrap
             interval.

Raw per-run results: ``benchmarks/quality/credit24v9/confirm.json`` and ``study.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import study  # the first protocol's helpers (this script's folder is on the path when it runs)
import study_v5 as v5
import study_v6 as v6
from toyq.confirm import accuracy_by_arm, comparisons
from toyq.stats import compare, penalty, penalty_interval

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "credit24v9"
SAME, TWIN, CROSS = "op_k1_same_mean_clip", "op_k1_twin_byte_mean_clip", "op_k1_byte_mean_clip"
ARMS = ("cont_ce", SAME, TWIN, CROSS)
CONFIRM_SEEDS = tuple(range(100, 120))
STAGES = ("confirm",)
say = study.say


def decomposition(runs: list[dict]) -> dict:
    """B - A and C - B on their shared seeds (Welch and paired t, Holm over the two), each as a
    share of A's gain over continued CE, and C's penalty against A with its bootstrap interval."""
    acc = accuracy_by_arm(runs)
    steps = compare(acc, [(TWIN, SAME), (CROSS, TWIN)], higher_is_better=True,
                    shared_seeds=True)
    seeds = sorted(set(acc["cont_ce"]) & set(acc[SAME]) & set(acc[TWIN]) & set(acc[CROSS]))
    gain = {a: sum(acc[a][s] - acc["cont_ce"][s] for s in seeds) / len(seeds)
            for a in (SAME, TWIN, CROSS)}
    pen, lo, hi = penalty_interval([[(acc[SAME][s] - acc["cont_ce"][s],
                                      acc[CROSS][s] - acc["cont_ce"][s]) for s in seeds]])
    out = {"seeds": seeds, "gains": gain, "penalty": pen, "penalty_interval": [lo, hi]}
    for name, c in zip(("credit", "model"), steps):
        out[name] = {"arm": c.arm, "baseline": c.baseline, "difference": c.gain,
                     "share_of_penalty_points": -c.gain / gain[SAME],
                     "welch_p": c.welch.p, "paired_p": c.paired.p, "welch_holm": c.welch_holm,
                     "paired_holm": c.paired_holm, "passes": c.passes(0.05)}
    return out


def stage_confirm(args, state: dict) -> None:
    chosen = v6.fifth_rates()
    runs = v6.confirm_runs(args, ARMS, CONFIRM_SEEDS, chosen, "credit24v9", RECORDS)
    comps = {c["arm"]: c for c in comparisons(runs)}
    parts = decomposition(runs)
    state["confirm"] = {**v6.confirm_state(ARMS, CONFIRM_SEEDS, chosen, comps),
                        "decomposition": parts,
                        "penalty_point": penalty(comps[CROSS]["gain"], comps[SAME]["gain"])}
    cr, mo = parts["credit"], parts["model"]
    say(f"gains A {parts['gains'][SAME]:+.3f}, B {parts['gains'][TWIN]:+.3f}, "
        f"C {parts['gains'][CROSS]:+.3f}; penalty {parts['penalty']:.2f} "
        f"[{parts['penalty_interval'][0]:.2f}, {parts['penalty_interval'][1]:.2f}]; "
        f"B - A {cr['difference']:+.3f} (paired Holm p {cr['paired_holm']:.3g}); "
        f"C - B {mo['difference']:+.3f} (paired Holm p {mo['paired_holm']:.3g})")


STAGE_FUNCS = {"confirm": stage_confirm}


def main(argv=None) -> int:
    return study.protocol_main(argv, "runs/q24v9", STAGES, STAGE_FUNCS, RECORDS, v5.TASK, __doc__)


if __name__ == "__main__":
    sys.exit(main())
