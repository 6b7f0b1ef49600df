"""The issue-24 on-policy credit study, nineteenth protocol: the eighteenth protocol's
accuracy-matched pairs of teachers on five fresh seeds.

The protocol is written in ``benchmarks/quality/RESULTS.md`` ("On-policy credit study,
nineteenth protocol", committed before its runs); this script runs it without a hand-set number:

    python benchmarks/quality/study_v19.py --out runs/q24v19 --cache runs/q24_prep --jobs 2

One stage, ``confirm``: continued CE, the four same-tokenizer arms and the four accuracy-matched
cross-tokenizer arms that the eighteenth protocol's pilot chose (read from
``credit24v18/pilot.json``; no teacher is trained) on fresh seeds 200-204, the unlabeled test
half, scored once, with the eighteenth protocol's decisions: (A) penalty, (B) tokenizer effect
(Welch over teachers), the paired t over the accuracy-matched pairs (reported), (D) the
same-tokenizer gains > 0, (E) collapse over every run; (Q) as the pilot recorded it.

Raw per-run results: ``benchmarks/quality/credit24v19/confirm.json`` and ``study.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import study  # the first protocol's helpers (this script's folder is on the path when it runs)
import study_v18 as v18

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "credit24v19"
RESULTS_MD = HERE / "RESULTS.md"
TASK = v18.TASK
CONFIRM_SEEDS = (200, 201, 202, 203, 204)
STAGES = ("confirm",)


def stage_confirm(args, state: dict) -> None:
    state["confirm"] = v18.confirm_pairs(args, CONFIRM_SEEDS, "credit24v19", RECORDS, RESULTS_MD)


STAGE_FUNCS = {"confirm": stage_confirm}


def main(argv=None) -> int:
    return study.protocol_main(argv, "runs/q24v19", STAGES, STAGE_FUNCS, RECORDS, TASK, __doc__)


if __name__ == "__main__":
    sys.exit(main())
