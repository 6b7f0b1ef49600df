"""The issue-24 on-policy credit study, twentieth protocol: tokenizer by training length, teachers
of both tokenizers at 1000 and at 3000 steps.

The protocol is written in ``benchmarks/quality/RESULTS.md`` ("On-policy credit study,
twentieth protocol", committed before its runs); this script runs it without a hand-set number:

    python benchmarks/quality/study_v20.py --out runs/q24v20 --cache runs/q24_prep --jobs 2

The sixteenth protocol's task, teachers' corpus (``--teacher-per-doc 1``), rates and confirmed
estimator (k1, ``mean`` baseline, 2-nat clamp; byte credit with the cross-tokenizer teachers).
One stage:

``confirm``  continued CE and four groups of four k1 arms (training seeds 0-3 each) on fresh
             seeds 210-212, the unlabeled test half, scored once: S3 / X3 the sixteenth
             protocol's same- / cross-tokenizer teachers (3000 steps), S1 / X1 the same
             settings at ``SHORT`` steps (``op_k1_same_mean_clip_s1000{,_t2,_t3,_t4}``, new;
             ``op_k1_byte_mean_clip_s1000{,...}``, the seventeenth protocol's). ``study.json``:
             the thirteenth protocol's teacher-level analysis of S1 against X1 ((A) penalty,
             (B) tokenizer effect), (I) the interaction (per training seed, the 1000-step
             teacher's gain minus the 3000-step one's, cross against same: Welch), Holm over
             (B) and (I); reported: the penalty at 3000 steps, the length effect within each
             tokenizer and every teacher's validation accuracy; (D) the four S1 gains > 0; (E)
             collapse over every run.

Raw per-run results: ``benchmarks/quality/credit24v20/confirm.json`` and ``study.json``.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import study  # the first protocol's helpers (this script's folder is on the path when it runs)
import study_v13 as v13
import study_v14 as v14
import study_v17 as v17
from toyq.confirm import accuracy_by_arm
from toyq.continued import SAME_BUDGET_BASE, budget_arm, k1_teacher
from toyq.run import update_results_md
from toyq.stats import holm, welch

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "credit24v20"
RESULTS_MD = HERE / "RESULTS.md"
TASK = v17.TASK
SHORT = 1000
S3, X3, _ = v13.design()
S1 = tuple(budget_arm(SHORT, sfx, SAME_BUDGET_BASE) for sfx in v13.SUFFIXES)
X1 = tuple(budget_arm(SHORT, sfx) for sfx in v13.SUFFIXES)
ARMS = ("cont_ce", *S1, *X1, *S3, *X3)
TEACHER_OF = {a: k1_teacher(a) for a in ARMS[1:]}
CONFIRM_SEEDS = (210, 211, 212)
STAGES = ("confirm",)
say = study.say


def _welch(a: list[float], b: list[float]) -> dict:
    w = welch(a, b)
    return {"a": a, "b": b, "difference": statistics.fmean(a) - statistics.fmean(b),
            "welch_t": w.t, "welch_p": w.p}


def factorial(gains: dict) -> dict:
    """(I) and the reported length effects from the teachers' gains: per training seed k, the
    ``SHORT``-step teacher's gain minus the 3000-step one's, within each tokenizer."""
    d_same = [gains[a] - gains[b] for a, b in zip(S1, S3)]
    d_cross = [gains[a] - gains[b] for a, b in zip(X1, X3)]
    return {"interaction": _welch(d_cross, d_same),
            "length_same": _welch([gains[a] for a in S1], [gains[a] for a in S3]),
            "length_cross": _welch([gains[a] for a in X1], [gains[a] for a in X3])}


def stage_confirm(args, state: dict) -> None:
    runs, conf = v13.confirm_teachers(args, ARMS, CONFIRM_SEEDS, "credit24v20", RECORDS,
                                      (S1, X1, TEACHER_OF), RESULTS_MD)
    acc = accuracy_by_arm(runs)
    gains = v13.teacher_gains(acc, conf["seeds"], S1 + S3, X1 + X3)
    conf["gains"] = gains
    conf.update(factorial(gains))
    conf["penalty_3000"] = v13.penalty_over_teachers(acc, conf["seeds"], same=S3, cross=X3)
    conf["same_positive"] = v14.same_positive(gains, S1)
    conf["holm"] = dict(zip(("tokenizer_effect", "interaction"),
                            holm([conf["tokenizer_effect"]["welch_p"],
                                  conf["interaction"]["welch_p"]])))
    names = [TEACHER_OF[a] for a in ARMS[1:]]
    conf["valid_accuracy"] = v17.valid_accuracy(v17.prepared(args, names), names)
    state["confirm"] = conf
    update_results_md(render_factorial(conf), RESULTS_MD, "credit24v20factorial")
    p = conf["penalty"]
    say(f"teachers at {SHORT} steps: penalty {p['penalty']:.2f} [{p['interval'][0]:.2f}, "
        f"{p['interval'][1]:.2f}] (goal <= {v13.GOAL}); at 3000 steps "
        f"{conf['penalty_3000']['penalty']:.2f}; interaction "
        f"{conf['interaction']['difference']:+.3f} (Welch p {conf['interaction']['welch_p']:.3g})")


def render_factorial(conf: dict) -> str:
    """The block ``GENERATED:credit24v20factorial``: every teacher's gain and validation accuracy
    by tokenizer and length, then (I), the length effects, the 3000-step penalty, Holm and (D),
    from the record only."""
    g, va, fmt = conf["gains"], conf["valid_accuracy"], v13._f
    lines = ["## Tokenizer by training length (generated from `credit24v20/study.json`)", "",
             "Per training seed: each teacher's gain over continued CE (validation accuracy).", "",
             f"| seed | same, {SHORT} steps | same, 3000 | cross, {SHORT} steps | cross, 3000 |",
             "|---|---|---|---|---|"]
    for k, arms in enumerate(zip(S1, S3, X1, X3)):
        cells = " | ".join(f"{g[a]:+.3f} ({va[TEACHER_OF[a]]:.3f})" for a in arms)
        lines.append(f"| {k} | {cells} |")
    i, ls, lc, p3 = (conf["interaction"], conf["length_same"], conf["length_cross"],
                     conf["penalty_3000"])
    d = conf["same_positive"]
    lines += ["",
              f"- (I) interaction ({SHORT}-step minus 3000-step gain, cross against same): "
              f"{i['difference']:+.3f}, Welch t {fmt(i['welch_t'], '+.2f')}, p "
              f"{fmt(i['welch_p'], '.2g')}",
              f"- Holm over (B) and (I): (B) p {fmt(conf['holm']['tokenizer_effect'], '.2g')}, "
              f"(I) p {fmt(conf['holm']['interaction'], '.2g')}",
              f"- length effect ({SHORT} minus 3000 steps; reported): same tokenizer "
              f"{ls['difference']:+.3f} (Welch p {fmt(ls['welch_p'], '.2g')}), cross "
              f"{lc['difference']:+.3f} (Welch p {fmt(lc['welch_p'], '.2g')})",
              f"- penalty at 3000 steps (reported): {p3['penalty']:.2f} [{p3['interval'][0]:.2f}, "
              f"{p3['interval'][1]:.2f}]",
              f"- (D) same-tokenizer gains at {SHORT} steps: mean {d['mean']:+.3f}, one-sample t "
              f"{fmt(d['t'], '+.2f')}, p {fmt(d['p'], '.2g')}; holds: "
              f"**{'yes' if d['holds'] else 'no'}**"]
    return "\n".join(lines)


STAGE_FUNCS = {"confirm": stage_confirm}


def main(argv=None) -> int:
    return study.protocol_main(argv, "runs/q24v20", STAGES, STAGE_FUNCS, RECORDS, TASK, __doc__)


if __name__ == "__main__":
    sys.exit(main())
