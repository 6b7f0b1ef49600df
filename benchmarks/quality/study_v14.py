"""The issue-24 on-policy credit study, fourteenth protocol: k1 with the discounted return
(``loss.discount: 1``) over four teachers of each tokenizer, the teacher as the unit.

The protocol is written in ``benchmarks/quality/RESULTS.md`` ("On-policy credit study, fourteenth
protocol", committed before its runs); this script runs it without a hand-set number:

    python benchmarks/quality/study_v14.py --out runs/q24v14 --cache runs/q24_prep --jobs 2

The fifth protocol's task and rates (read from ``credit24v5/study.json``), the thirteenth
protocol's eight teachers and estimator with one change, ``loss.discount: 1`` (each unit's
advantage is the log-ratio of all the text from the unit to the end of its sample, before the
``mean`` baseline and the 2-nat clamp), one stage:

``confirm``  continued CE and sixteen arms on fresh seeds 150-152, the unlabeled test half, scored
             once: ``op_k1_same_mean_clip_g1{,_t2,_t3,_t4}`` and
             ``op_k1_byte_mean_clip_g1{,_t2,_t3,_t4}`` and the same eight teachers' per-unit
             arms. ``study.json`` holds (A) the penalty over
             the four teachers of each tokenizer (goal <= 0.2), (B) the tokenizer effect over
             teachers, (C) the change against the thirteenth protocol's per-unit estimator
             (its eight arms ``op_k1_{same,byte}_mean_clip{,_t2,_t3,_t4}``, run again on these
             seeds), (D) whether the same-tokenizer teachers' gains are
             positive, (E) collapse; the thirteenth protocol's per-teacher and per-seed reports.

Raw per-run results: ``benchmarks/quality/credit24v14/confirm.json`` and ``study.json``.
"""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

import study  # the first protocol's helpers (this script's folder is on the path when it runs)
import study_v5 as v5
import study_v13 as v13
from toyq.confirm import accuracy_by_arm
from toyq.run import update_results_md
from toyq.stats import holm, paired, penalty, percentile_interval

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "credit24v14"
RESULTS_MD = HERE / "RESULTS.md"
SAME, CROSS, TEACHER_OF = v13.design("_g1")
# the thirteenth protocol's arm of the same teacher (per-unit k1), run again on these seeds
BEFORE = dict(zip(SAME + CROSS, v13.SAME + v13.CROSS))
ARMS = ("cont_ce", *SAME, *CROSS, *v13.SAME, *v13.CROSS)
CONFIRM_SEEDS = (150, 151, 152)
STAGES = ("confirm",)
ALPHA = v13.ALPHA
DRAWS = v13.DRAWS
say = study.say


def against_per_unit(acc: dict, seeds: list[int], draws: int = DRAWS) -> dict:
    """(C) per teacher, its gain under the discount minus its gain under per-unit k1 (the
    thirteenth protocol's arm, run here on the same seeds); paired t over the four teachers of
    each tokenizer, Holm over the two; the per-unit penalty on these seeds and the penalty's
    change, with a 95% interval from draws that resample teachers (one draw for both estimators:
    they share teachers) and seeds (shared by every arm)."""
    gain = {a: v13._gain(acc, (a,), seeds) for a in SAME + CROSS}
    gain0 = {a: v13._gain(acc, (BEFORE[a],), seeds) for a in SAME + CROSS}
    tests = {}
    for name, arms in (("same", SAME), ("cross", CROSS)):
        t = paired([gain[a] for a in arms], [gain0[a] for a in arms])
        tests[name] = {"change": [gain[a] - gain0[a] for a in arms],
                       "mean_change": statistics.fmean(gain[a] - gain0[a] for a in arms),
                       "paired_t": t.t, "paired_p": t.p}
    for name, p_holm in zip(tests, holm([tests[k]["paired_p"] for k in tests])):
        tests[name]["paired_holm"] = p_holm

    def pen(idx_s, idx_c, ss, arm=lambda a: a) -> float:
        return penalty(v13._gain(acc, [arm(CROSS[i]) for i in idx_c], ss),
                       v13._gain(acc, [arm(SAME[i]) for i in idx_s], ss))

    def change(idx_s, idx_c, ss) -> float:
        return pen(idx_s, idx_c, ss) - pen(idx_s, idx_c, ss, BEFORE.get)

    rng, k = random.Random(1), range(len(SAME))
    boot = [change([rng.choice(k) for _ in k], [rng.choice(k) for _ in k],
                   [rng.choice(seeds) for _ in seeds]) for _ in range(draws)]
    return {"tests": tests, "penalty_per_unit": pen(list(k), list(k), seeds, BEFORE.get),
            "penalty_change": change(list(k), list(k), seeds),
            "penalty_change_interval": list(percentile_interval(boot))}


def same_positive(gains: dict, arms=SAME) -> dict:
    """(D) the four same-tokenizer teachers' gains (``arms``) under the discount: one-sample t
    against 0 (the paired t of the gains against zeros)."""
    xs = [gains[a] for a in arms]
    t = paired(xs, [0.0] * len(xs))
    return {"gains": xs, "mean": statistics.fmean(xs), "t": t.t, "p": t.p,
            "holds": bool(t.p < ALPHA and statistics.fmean(xs) > 0)}


def render_change(conf: dict) -> str:
    """The block ``GENERATED:credit24v14change``: (C) and (D) from the record only."""
    c, d = conf["against_per_unit"], conf["same_positive"]
    lo, hi = c["penalty_change_interval"]
    lines = ["## Discount 1 against per-unit k1 (generated from `credit24v14/study.json`)", "",
             f"Per teacher: gain with `loss.discount: 1` minus gain with per-unit k1 (the "
             f"thirteenth protocol's arms), both on seeds {', '.join(map(str, c['seeds']))} of "
             "the test half.", "",
             "| teachers | change per teacher | mean change | paired t (p, Holm over 2) |",
             "|---|---|---|---|"]
    for name in ("same", "cross"):
        t = c["tests"][name]
        lines.append(f"| {name}-tokenizer | {', '.join(f'{x:+.3f}' for x in t['change'])} | "
                     f"{t['mean_change']:+.3f} | {v13._f(t['paired_t'], '+.2f')} "
                     f"({v13._f(t['paired_p'], '.3f')}, {v13._f(t['paired_holm'], '.3f')}) |")
    lines += ["",
              f"- (C) penalty with per-unit k1 on these seeds: {c['penalty_per_unit']:.2f}; "
              f"change (discount 1 minus per-unit): {c['penalty_change']:+.2f} "
              f"[{lo:+.2f}, {hi:+.2f}] (teachers and seeds resampled, shared by both)",
              f"- (D) same-tokenizer teachers' gains under discount 1: "
              f"{', '.join(f'{x:+.3f}' for x in d['gains'])}; mean {d['mean']:+.3f}, one-sample "
              f"t {v13._f(d['t'], '+.2f')} (p {v13._f(d['p'], '.3g')}): "
              f"**{'positive' if d['holds'] else 'not shown positive'}**"]
    return "\n".join(lines)


def stage_confirm(args, state: dict) -> None:
    runs, conf = v13.confirm_teachers(args, ARMS, CONFIRM_SEEDS, "credit24v14", RECORDS,
                                      (SAME, CROSS, TEACHER_OF), RESULTS_MD)
    acc = accuracy_by_arm(runs)
    seeds = sorted(set(conf["seeds"]).intersection(*(set(acc[a]) for a in BEFORE.values())))
    conf["against_per_unit"] = {**against_per_unit(acc, seeds), "seeds": seeds}
    conf["same_positive"] = same_positive(conf["gains"])
    state["confirm"] = conf
    update_results_md(render_change(conf), RESULTS_MD, "credit24v14change")
    te, p, c = conf["tokenizer_effect"], conf["penalty"], conf["against_per_unit"]
    say(f"discount 1: penalty over four teachers each {p['penalty']:.2f} [{p['interval'][0]:.2f}, "
        f"{p['interval'][1]:.2f}] (goal <= {v13.GOAL}); tokenizer effect {te['difference']:+.3f} "
        f"(Welch p {te['welch_p']:.3g}); penalty change vs per-unit k1 {c['penalty_change']:+.2f}")

STAGE_FUNCS = {"confirm": stage_confirm}


def main(argv=None) -> int:
    return study.protocol_main(argv, "runs/q24v14", STAGES, STAGE_FUNCS, RECORDS, v5.TASK, __doc__)


if __name__ == "__main__":
    sys.exit(main())
