"""The issue-24 on-policy credit study, seventeenth protocol: cross-tokenizer teachers trained to
the same-tokenizer teachers' accuracy.

The protocol is written in ``benchmarks/quality/RESULTS.md`` ("On-policy credit study,
seventeenth protocol", committed before its pilot and runs); this script runs it without a
hand-set number:

    python benchmarks/quality/study_v17.py --out runs/q24v17 --cache runs/q24_prep --jobs 2

The sixteenth protocol's task, teachers' corpus (``--teacher-per-doc 1``), rates and confirmed
estimator (k1, ``mean`` baseline, 2-nat clamp; byte credit with the cross-tokenizer teachers).
Stages:

``pilot``    cross-tokenizer teachers with training seed 0 at each of ``BUDGETS`` CE steps
             (``teacher_big_s<steps>``); their greedy accuracy on the validation problems, and
             the sixteenth protocol's four same-tokenizer teachers' (the target: their mean).
             The chosen budget is the one nearest the target (a tie: the larger budget);
             record ``credit24v17/pilot.json``.
``confirm``  continued CE, S = the four same-tokenizer arms, X = the four cross-tokenizer arms
             of the sixteenth protocol (3000-step teachers) and M = the four arms of the matched
             teachers (``op_k1_byte_mean_clip_s<steps>{,_t2,_t3,_t4}``: seeds 0-3 at the chosen
             budget) on fresh seeds 180-182, the unlabeled test half, scored once.
             ``study.json``: the thirteenth protocol's teacher-level analysis of S against M
             ((A) penalty, (B) tokenizer effect, per teacher and per seed), (F) X against M
             (Welch over teachers, two-sided; Holm over (B) and (F)), (R) the penalty of S
             against X (reported), (D) the same-tokenizer gains > 0, (E) collapse and (Q) the
             equal-accuracy check (the matched teachers' mean validation accuracy within
             ``EQUAL_WITHIN`` of the target).

Raw per-run results: ``benchmarks/quality/credit24v17/pilot.json``, ``confirm.json`` and
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
import study_v16 as v16
from toyq.confirm import accuracy_by_arm
from toyq.continued import budget_arm, k1_teacher
from toyq.run import update_results_md
from toyq.stats import holm

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "credit24v17"
RESULTS_MD = HERE / "RESULTS.md"
TASK = v16.TASK
SAME, CROSS, TEACHER_OF = v13.design()
SAME_TEACHERS = tuple(TEACHER_OF[a] for a in SAME)
BUDGETS = (250, 500, 750, 1000, 1500, 2000)
CONFIRM_SEEDS = (180, 181, 182)
EQUAL_WITHIN = 0.05
# accuracies are counts over the validation problems: a gap of exactly k of them is within a limit
# of k / n even where floating point reads it a few 1e-17 above
ROUNDING = 1e-9


def within(gap: float, limit: float) -> bool:
    """``|gap| <= limit`` up to floating-point rounding (the equal-accuracy checks)."""
    return abs(gap) <= limit + ROUNDING
STAGES = ("pilot", "confirm")
say = study.say


def prepared(args, teachers) -> dict:
    """The sixteenth protocol's cache with ``teachers`` ready (trained there when missing)."""
    from toyq.prepare import prepare_all
    from toyq.run import parse, prep_config
    from toyq.runner import Watch

    return prepare_all(args.cache or args.out / "prepared", prep_config(parse(list(TASK))),
                       teachers=list(teachers), watch=Watch(), jobs=args.jobs)


def valid_accuracy(assets: dict, names) -> dict:
    """Per prepared teacher, its greedy accuracy on the validation problems."""
    from xdistill.tokenization import load_tokenizer

    from toyq.evaluate import SCORING, greedy_accuracy, load_model

    out = {}
    for name in names:
        path = assets[name]["model"]
        with SCORING:
            out[name] = greedy_accuracy(load_model(path), load_tokenizer(path),
                                        assets["corpus"]["valid"])["accuracy"]
    return out


def choose_budget(accuracy_by_steps: dict, target: float) -> int:
    """The budget whose teacher's validation accuracy is nearest ``target`` (a tie: the larger)."""
    return min(accuracy_by_steps,
               key=lambda n: (round(abs(accuracy_by_steps[n] - target), 12), -n))


def stage_pilot(args, state: dict) -> None:
    names = {n: f"teacher_big_s{n}" for n in BUDGETS}
    assets = prepared(args, [*names.values(), *SAME_TEACHERS])
    acc = valid_accuracy(assets, [*names.values(), *SAME_TEACHERS])
    target = statistics.fmean(acc[t] for t in SAME_TEACHERS)
    by_steps = {n: acc[name] for n, name in names.items()}
    chosen = choose_budget(by_steps, target)
    pilot = {"split": "valid", "n": len(assets["corpus"]["valid"]),
             "same_teachers": {t: acc[t] for t in SAME_TEACHERS}, "target": target,
             "budgets": {str(n): {"teacher": names[n], "valid_accuracy": by_steps[n],
                                  "test_accuracy": assets[names[n]]["accuracy"]}
                         for n in BUDGETS},
             "rule": "nearest the target; a tie goes to the larger budget",
             "chosen_steps": chosen}
    RECORDS.mkdir(exist_ok=True)
    (RECORDS / "pilot.json").write_text(json.dumps(pilot, indent=1) + "\n")
    state["pilot"] = pilot
    say("pilot (validation accuracy): target " + f"{target:.3f}; "
        + ", ".join(f"{n} steps {by_steps[n]:.3f}" for n in BUDGETS)
        + f"; chosen {chosen} steps")


def matched_arms(steps: int) -> tuple:
    """M: the four arms of the matched teachers (seeds 0-3 at ``steps``)."""
    return tuple(budget_arm(steps, sfx) for sfx in v13.SUFFIXES)


def budget_analysis(conf_x: dict, acc: dict, seeds, matched, valid: dict, target: float) -> dict:
    """(F), (R), (D), (Q) and Holm over (B) and (F); ``conf_x`` is :func:`v13.analyse` of S
    against X, ``acc`` the runs' accuracy by arm and seed."""
    gains = v13.teacher_gains(acc, seeds, CROSS, matched)
    f = v13.tokenizer_effect(gains, CROSS, matched)
    mean_valid = statistics.fmean(valid[k1_teacher(a)] for a in matched)
    return {"length_effect": {"full_gains": f["same_gains"], "matched_gains": f["cross_gains"],
                              **{k: f[k] for k in ("difference", "welch_t", "welch_p",
                                                   "permutation_p")}},
            "penalty_full": conf_x["penalty"], "tokenizer_effect_full": conf_x["tokenizer_effect"],
            "equal_accuracy": {"target": target, "matched_valid": {k1_teacher(a):
                                                                    valid[k1_teacher(a)]
                                                                    for a in matched},
                               "matched_mean": mean_valid, "within": EQUAL_WITHIN,
                               "passes": within(mean_valid - target, EQUAL_WITHIN)}}


def stage_confirm(args, state: dict) -> None:
    pilot = json.loads((RECORDS / "pilot.json").read_text())
    matched = matched_arms(pilot["chosen_steps"])
    teacher_of = {**TEACHER_OF, **{a: k1_teacher(a) for a in matched}}
    runs, conf = v13.confirm_teachers(args, ("cont_ce", *SAME, *CROSS, *matched), CONFIRM_SEEDS,
                                      "credit24v17", RECORDS, (SAME, matched, teacher_of),
                                      RESULTS_MD)
    acc = accuracy_by_arm(runs)
    meta = json.loads((RECORDS / "confirm.json").read_text()).get("meta", {})
    conf_x = v13.analyse(runs, meta, SAME, CROSS, teacher_of)
    valid = valid_accuracy(prepared(args, [k1_teacher(a) for a in matched]),
                           [k1_teacher(a) for a in matched])
    conf.update(budget_analysis(conf_x, acc, conf["seeds"], matched, valid, pilot["target"]))
    conf["same_positive"] = v14.same_positive(conf["gains"], SAME)
    conf["holm"] = dict(zip(("tokenizer_effect", "length_effect"),
                            holm([conf["tokenizer_effect"]["welch_p"],
                                  conf["length_effect"]["welch_p"]])))
    state["confirm"] = conf
    update_results_md(render_budget(conf, matched), RESULTS_MD, "credit24v17budget")
    p, q = conf["penalty"], conf["equal_accuracy"]
    say(f"matched teachers ({pilot['chosen_steps']} steps, validation accuracy "
        f"{q['matched_mean']:.3f} against {q['target']:.3f}): penalty {p['penalty']:.2f} "
        f"[{p['interval'][0]:.2f}, {p['interval'][1]:.2f}] (goal <= {v13.GOAL}); 3000-step "
        f"teachers' penalty {conf['penalty_full']['penalty']:.2f}")


def render_budget(conf: dict, matched) -> str:
    """The block ``GENERATED:credit24v17budget``: (Q), (F), (R), (D) and Holm, from the record."""
    q, f, r, d = (conf["equal_accuracy"], conf["length_effect"], conf["penalty_full"],
                  conf["same_positive"])
    fmt = v13._f
    lines = ["## Teachers of equal accuracy (generated from `credit24v17/study.json`)", "",
             "| matched teacher | validation accuracy | gain | 3000-step teacher | gain |",
             "|---|---|---|---|---|"]
    for m, x in zip(matched, CROSS):
        lines.append(f"| {k1_teacher(m)} | {q['matched_valid'][k1_teacher(m)]:.3f} | "
                     f"{conf['gains'][m]:+.3f} | {TEACHER_OF[x]} | "
                     f"{f['full_gains'][CROSS.index(x)]:+.3f} |")
    lo, hi = r["interval"]
    lines += ["",
              f"- (Q) matched teachers' mean validation accuracy {q['matched_mean']:.3f} against "
              f"the same-tokenizer teachers' {q['target']:.3f} (within {q['within']}): "
              f"**{'passes' if q['passes'] else 'fails'}**",
              f"- (F) 3000-step minus matched cross-tokenizer teachers' gains: "
              f"{f['difference']:+.3f}, Welch t {fmt(f['welch_t'], '+.2f')}, p "
              f"{fmt(f['welch_p'], '.2g')} (exact permutation p {f['permutation_p']:.3f})",
              f"- Holm over (B) and (F): (B) p {fmt(conf['holm']['tokenizer_effect'], '.2g')}, "
              f"(F) p {fmt(conf['holm']['length_effect'], '.2g')}",
              f"- (R) penalty of the 3000-step cross-tokenizer teachers on these seeds "
              f"(reported): {r['penalty']:.2f} [{lo:.2f}, {hi:.2f}]",
              f"- (D) same-tokenizer gains {', '.join(f'{x:+.3f}' for x in d['gains'])}: mean "
              f"{d['mean']:+.3f}, one-sample t {fmt(d['t'], '+.2f')}, p {fmt(d['p'], '.2g')}; "
              f"holds: **{'yes' if d['holds'] else 'no'}**"]
    return "\n".join(lines)


STAGE_FUNCS = {"pilot": stage_pilot, "confirm": stage_confirm}


def main(argv=None) -> int:
    return study.protocol_main(argv, "runs/q24v17", STAGES, STAGE_FUNCS, RECORDS, TASK, __doc__)


if __name__ == "__main__":
    sys.exit(main())
