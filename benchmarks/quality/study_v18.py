"""The issue-24 on-policy credit study, eighteenth protocol: each cross-tokenizer teacher trained
to its same-tokenizer partner's accuracy.

The protocol is written in ``benchmarks/quality/RESULTS.md`` ("On-policy credit study,
eighteenth protocol", committed before its pilot and runs); this script runs it without a
hand-set number:

    python benchmarks/quality/study_v18.py --out runs/q24v18 --cache runs/q24_prep --jobs 2

The sixteenth protocol's task, teachers' corpus (``--teacher-per-doc 1``), rates and confirmed
estimator (k1, ``mean`` baseline, 2-nat clamp; byte credit with the cross-tokenizer teachers).
Stages:

``pilot``    cross-tokenizer teachers with training seeds 0-3 at each of ``BUDGETS`` CE steps
             (``teacher_big_s<steps>{,_t2,_t3,_t4}``; those already in the cache are reused)
             and the four same-tokenizer teachers, scored greedily on the validation problems.
             Seed k's budget is the one whose accuracy is nearest the same-tokenizer teacher of
             seed k (a tie: the larger); record ``credit24v18/pilot.json`` with (Q).
``confirm``  continued CE, S = the four same-tokenizer arms and M = the four matched arms
             (``op_k1_byte_mean_clip_s<steps of seed k>{,_t2,_t3,_t4}``) on fresh seeds 190-192,
             the unlabeled test half, scored once. ``study.json``: the thirteenth protocol's
             teacher-level analysis of S against M ((A) penalty, (B) tokenizer effect, per
             teacher and per seed), the paired t over the four accuracy-matched pairs
             (reported), (D) the same-tokenizer gains > 0, (E) collapse and (Q).

Raw per-run results: ``benchmarks/quality/credit24v18/pilot.json``, ``confirm.json`` and
``study.json``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import study  # the first protocol's helpers (this script's folder is on the path when it runs)
import study_v13 as v13
import study_v14 as v14
import study_v17 as v17
from toyq.continued import budget_arm, k1_teacher
from toyq.run import update_results_md
from toyq.stats import paired

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "credit24v18"
RESULTS_MD = HERE / "RESULTS.md"
TASK = v17.TASK
SAME, _, TEACHER_OF = v13.design()
SAME_TEACHERS = v17.SAME_TEACHERS
BUDGETS = (750, 875, 1000, 1250, 1500, 2000)
CONFIRM_SEEDS = (190, 191, 192)
PAIR_WITHIN = 0.10
MEAN_WITHIN = 0.05
STAGES = ("pilot", "confirm")
say = study.say


def teacher_name(steps: int, suffix: str) -> str:
    return f"teacher_big_s{steps}{suffix}"


def equal_accuracy(same: list[float], matched: list[float]) -> dict:
    """(Q): every pair within ``PAIR_WITHIN`` and the group means within ``MEAN_WITHIN``."""
    gaps = [m - s for s, m in zip(same, matched)]
    mean_gap = statistics.fmean(matched) - statistics.fmean(same)
    return {"same": same, "matched": matched, "pair_gaps": gaps, "mean_gap": mean_gap,
            "pair_within": PAIR_WITHIN, "mean_within": MEAN_WITHIN,
            "passes": (all(v17.within(g, PAIR_WITHIN) for g in gaps)   # 15/150 is within 0.10
                       and v17.within(mean_gap, MEAN_WITHIN))}


def stage_pilot(args, state: dict) -> None:
    grid = {(n, sfx): teacher_name(n, sfx) for sfx in v13.SUFFIXES for n in BUDGETS}
    assets = v17.prepared(args, [*grid.values(), *SAME_TEACHERS])
    acc = v17.valid_accuracy(assets, [*grid.values(), *SAME_TEACHERS])
    chosen, per_seed = {}, {}
    for sfx, same_teacher in zip(v13.SUFFIXES, SAME_TEACHERS):
        by_steps = {n: acc[grid[n, sfx]] for n in BUDGETS}
        chosen[sfx] = v17.choose_budget(by_steps, acc[same_teacher])
        per_seed[sfx or "_t1"] = {"same_teacher": same_teacher, "target": acc[same_teacher],
                                  "valid_accuracy": {str(n): a for n, a in by_steps.items()},
                                  "chosen_steps": chosen[sfx],
                                  "teacher": teacher_name(chosen[sfx], sfx)}
    q = equal_accuracy([acc[t] for t in SAME_TEACHERS],
                       [acc[teacher_name(chosen[s], s)] for s in v13.SUFFIXES])
    pilot = {"split": "valid", "n": len(assets["corpus"]["valid"]), "seeds": per_seed,
             "rule": "per seed, nearest its same-tokenizer teacher; a tie goes to the larger "
                     "budget", "equal_accuracy": q,
             "matched_arms": [budget_arm(chosen[s], s) for s in v13.SUFFIXES]}
    RECORDS.mkdir(exist_ok=True)
    (RECORDS / "pilot.json").write_text(json.dumps(pilot, indent=1) + "\n")
    state["pilot"] = pilot
    say("pilot (validation accuracy): " + "; ".join(
        f"seed {i}: target {r['target']:.3f}, chosen {r['chosen_steps']} steps "
        f"({r['valid_accuracy'][str(r['chosen_steps'])]:.3f})"
        for i, r in enumerate(per_seed.values())) +
        f"; (Q) {'passes' if q['passes'] else 'FAILS'} (mean gap {q['mean_gap']:+.3f})")


def confirm_pairs(args, seeds, tag: str, records: Path, results_md: Path) -> dict:
    """The confirmation of the pilot's accuracy-matched pairs (this protocol's and the
    nineteenth's) on ``seeds``: runs, raw records to ``records``, the blocks ``<tag>``,
    ``<tag>teachers`` and ``<tag>pairs``; returns ``study.json``'s ``confirm`` record."""
    pilot = json.loads((RECORDS / "pilot.json").read_text())
    matched = tuple(pilot["matched_arms"])
    teacher_of = {**TEACHER_OF, **{a: k1_teacher(a) for a in matched}}
    _, conf = v13.confirm_teachers(args, ("cont_ce", *SAME, *matched), seeds, tag, records,
                                   (SAME, matched, teacher_of), results_md)
    t = paired([conf["gains"][a] for a in SAME], [conf["gains"][a] for a in matched])
    conf["pairs"] = {"same_minus_matched": [conf["gains"][s] - conf["gains"][m]
                                            for s, m in zip(SAME, matched)],
                     "paired_t": t.t, "paired_p": t.p}
    conf["same_positive"] = v14.same_positive(conf["gains"], SAME)
    conf["equal_accuracy"] = pilot["equal_accuracy"]
    update_results_md(render_pairs(conf, matched, tag), results_md, f"{tag}pairs")
    p, q = conf["penalty"], conf["equal_accuracy"]
    say(f"accuracy-matched teachers ((Q) {'passes' if q['passes'] else 'fails'}): penalty "
        f"{p['penalty']:.2f} [{p['interval'][0]:.2f}, {p['interval'][1]:.2f}] (goal <= "
        f"{v13.GOAL}); tokenizer effect {conf['tokenizer_effect']['difference']:+.3f} (Welch p "
        f"{conf['tokenizer_effect']['welch_p']:.3g})")
    return conf


def stage_confirm(args, state: dict) -> None:
    state["confirm"] = confirm_pairs(args, CONFIRM_SEEDS, "credit24v18", RECORDS, RESULTS_MD)


def render_pairs(conf: dict, matched, tag: str = "credit24v18") -> str:
    """The block ``GENERATED:<tag>pairs``: the accuracy-matched pairs, (Q), the paired t and (D),
    from the record (``<tag>/study.json``) only."""
    q, pr, d, fmt = conf["equal_accuracy"], conf["pairs"], conf["same_positive"], v13._f
    lines = [f"## Accuracy-matched pairs (generated from `{tag}/study.json`)", "",
             "| seed | same-tokenizer teacher | validation accuracy | gain | matched "
             "cross-tokenizer teacher | validation accuracy | gain |", "|---|---|---|---|---|---|---|"]
    for k, (s, m) in enumerate(zip(SAME, matched)):
        lines.append(f"| {k} | {TEACHER_OF[s]} | {q['same'][k]:.3f} | {conf['gains'][s]:+.3f} | "
                     f"{k1_teacher(m)} | {q['matched'][k]:.3f} | {conf['gains'][m]:+.3f} |")
    lines += ["",
              f"- (Q) pair gaps (matched minus same) "
              f"{', '.join(f'{g:+.3f}' for g in q['pair_gaps'])} (each within "
              f"{q['pair_within']}), mean gap {q['mean_gap']:+.3f} (within {q['mean_within']}): "
              f"**{'passes' if q['passes'] else 'fails'}**",
              f"- paired over the four pairs (reported): same minus matched "
              f"{', '.join(f'{x:+.3f}' for x in pr['same_minus_matched'])}, paired t "
              f"{fmt(pr['paired_t'], '+.2f')}, p {fmt(pr['paired_p'], '.2g')}",
              f"- (D) same-tokenizer gains: mean {d['mean']:+.3f}, one-sample t "
              f"{fmt(d['t'], '+.2f')}, p {fmt(d['p'], '.2g')}; holds: "
              f"**{'yes' if d['holds'] else 'no'}**"]
    return "\n".join(lines)


STAGE_FUNCS = {"pilot": stage_pilot, "confirm": stage_confirm}


def main(argv=None) -> int:
    return study.protocol_main(argv, "runs/q24v18", STAGES, STAGE_FUNCS, RECORDS, TASK, __doc__)


if __name__ == "__main__":
    sys.exit(main())
