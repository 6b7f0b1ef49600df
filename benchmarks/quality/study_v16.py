"""The issue-24 on-policy credit study, sixteenth protocol: teachers whose documents end where the
rollouts do (one problem per document), four of each tokenizer, the teacher as the unit.

The protocol is written in ``benchmarks/quality/RESULTS.md`` ("On-policy credit study, sixteenth
protocol", committed before its runs); this script runs it without a hand-set number:

    python benchmarks/quality/study_v16.py --out runs/q24v16 --cache runs/q24_prep --jobs 2

The fifth protocol's task and rates (read from ``credit24v5/study.json``) with one change on the
teachers' side only: their corpus has one problem per document (``--teacher-per-doc 1``: the same
problems and text documents; the student's corpus, warm start and rates are unchanged), so eight
new teachers are trained (the thirteenth protocol's settings and training seeds 0-3). The
confirmed estimator (k1, ``mean`` baseline, 2-nat clamp; byte credit with the cross-tokenizer
teachers). Stages:

``confirm``  continued CE and the thirteenth protocol's eight arms on fresh seeds 170-172, the
             unlabeled test half, scored once: ``op_k1_same_mean_clip{,_t2,_t3,_t4}`` and
             ``op_k1_byte_mean_clip{,_t2,_t3,_t4}``. ``study.json`` holds the thirteenth
             protocol's teacher-level analysis ((A) penalty, (B) tokenizer effect, per teacher
             and per seed), (C) the group means against per-unit k1 with the old teachers in the
             fourteenth protocol (other seeds and teachers; reported), (D) the same-tokenizer
             gains > 0, (E) collapse, and each arm's stop fraction at the end (reported).
``stops``    (M) the manipulation check: ``stop_units.py --protocol v16`` scores each seed's CE
             student's rollouts with every teacher (block ``stops24v16``); it passes when, for
             each of the eight teachers, the stopped answers' summed log-ratio of the units after
             the answer (mean over seeds) is above ``STOP_FLOOR`` nats.

Raw per-run results: ``benchmarks/quality/credit24v16/confirm.json``, ``stop_units.json`` and
``study.json``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import stop_units
import study  # the first protocol's helpers (this script's folder is on the path when it runs)
import study_v5 as v5
import study_v13 as v13
import study_v15 as v15
from toyq.run import update_results_md

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "credit24v16"
RESULTS_MD = HERE / "RESULTS.md"
TASK = [*v5.TASK, "--teacher-per-doc", "1"]
SAME, CROSS, TEACHER_OF = v13.design()
ARMS = ("cont_ce", *SAME, *CROSS)
CONFIRM_SEEDS = (170, 171, 172)
STAGES = ("confirm", "stops")
# (M): no teacher may find the end after a stopped answer e times less likely than the student
STOP_FLOOR = -1.0
say = study.say


def stage_confirm(args, state: dict) -> None:
    _, conf = v13.confirm_teachers(args, ARMS, CONFIRM_SEEDS, "credit24v16", RECORDS,
                                   (SAME, CROSS, TEACHER_OF), RESULTS_MD)
    same_arm = {a: a for a in SAME + CROSS}          # the same arm, with the old teachers
    conf["against_old_teachers"], conf["same_positive"], conf["stop_fraction_end"] = \
        v15.change_parts(args, conf, same_arm, SAME, CROSS)
    state["confirm"] = conf
    update_results_md(render_change(conf), RESULTS_MD, "credit24v16change")
    te, p = conf["tokenizer_effect"], conf["penalty"]
    say(f"one problem per teacher document: penalty over four teachers each {p['penalty']:.2f} "
        f"[{p['interval'][0]:.2f}, {p['interval'][1]:.2f}] (goal <= {v13.GOAL}); tokenizer "
        f"effect {te['difference']:+.3f} (Welch p {te['welch_p']:.3g})")


def render_change(conf: dict) -> str:
    """The block ``GENERATED:credit24v16change``: (C), (D) and the stop fractions."""
    c = conf["against_old_teachers"]
    intro = (f"Per arm: its gain here (seeds {', '.join(map(str, conf['seeds']))}) minus the same "
             f"arm's gain with the four-problem teachers in the fourteenth protocol (seeds "
             f"{', '.join(map(str, c['seeds_before']))}; other seeds and other teachers of the "
             "same settings: reported, no test); stop fraction of the training rollouts at the "
             "end (mean over seeds).")
    return v15.change_table(conf, c, "## Teachers of one problem per document, against the old "
                            "teachers (generated from `credit24v16/study.json`)", intro,
                            "penalty with the old teachers", SAME + CROSS)


def manipulation_check(record: dict, floor: float = STOP_FLOOR) -> dict:
    """(M) per teacher (arm label), the mean over seeds of the stopped answers' summed log-ratio
    after the answer (``stop_units`` record); passes when every one is above ``floor``."""
    per = {}
    for arm in record["arms"]:
        vals = [r["start"]["stop"]["rest_r"] for r in record["rows"]
                if r["arm"] == arm and "stop" in r["start"]]
        per[arm] = statistics.fmean(vals) if vals else None
    ok = all(v is not None and v > floor for v in per.values())
    return {"stop_rest_r": per, "floor": floor, "passes": ok}


def stage_stops(args, state: dict) -> None:
    stop_units.main(["--protocol", "v16", "--runs", str(args.out)])
    record = json.loads(stop_units.record_path("v16").read_text())
    state["stops"] = manipulation_check(record)
    m = state["stops"]
    say("(M) stopped answers' summed r after the answer: "
        + ", ".join(f"{a} {v13._f(v, '+.2f')}" for a, v in m["stop_rest_r"].items())
        + f"; every teacher above {m['floor']}: {'yes' if m['passes'] else 'NO'}")


STAGE_FUNCS = {"confirm": stage_confirm, "stops": stage_stops}


def main(argv=None) -> int:
    return study.protocol_main(argv, "runs/q24v16", STAGES, STAGE_FUNCS, RECORDS, TASK, __doc__)


if __name__ == "__main__":
    sys.exit(main())
