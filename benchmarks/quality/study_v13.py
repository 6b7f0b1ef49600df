"""The issue-24 on-policy credit study, thirteenth protocol: four teachers of each tokenizer, the
teacher as the unit of replication.

The protocol is written in ``benchmarks/quality/RESULTS.md`` ("On-policy credit study, thirteenth
protocol", committed before its runs); this script runs it without a hand-set number:

    python benchmarks/quality/study_v13.py --out runs/q24v13 --cache runs/q24_prep --jobs 2

The fifth protocol's task and rates (read from ``credit24v5/study.json``), the confirmed
estimator (k1, ``mean`` baseline, 2-nat clamp; byte credit with the cross-tokenizer teachers),
one stage:

``confirm``  continued CE and eight k1 arms on fresh seeds 140-142, the unlabeled test half,
             scored once: ``op_k1_same_mean_clip{,_t2,_t3,_t4}`` (four same-tokenizer teachers,
             training seeds 0-3) and ``op_k1_byte_mean_clip{,_t2,_t3,_t4}`` (four cross-tokenizer
             teachers, training seeds 0-3). The generated block ``GENERATED:credit24v13`` holds
             the eight arms against continued CE (Holm over eight); ``study.json`` adds, with the
             teacher as the unit (a teacher's gain = its arm's mean gain over continued CE on the
             three seeds): (a) the tokenizer effect over teachers (Welch t on the 4 + 4 teacher
             gains; the exact permutation p over the 70 splits reported), (b) the penalty over
             the four teachers of each tokenizer with an interval that resamples teachers within
             each tokenizer and seeds, (c) per teacher its held-out accuracy, gain and paired t
             against continued CE, and how gain follows teacher accuracy (exploratory), (d) the
             per-seed tokenizer effect (paired t over the three seeds, reported).

Raw per-run results: ``benchmarks/quality/credit24v13/confirm.json`` and ``study.json``.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
import sys
from pathlib import Path

import study  # the first protocol's helpers (this script's folder is on the path when it runs)
import study_v5 as v5
import study_v6 as v6
from toyq.confirm import accuracy_by_arm, comparisons
from toyq.run import update_results_md
from toyq.stats import paired, penalty, percentile_interval, welch

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "credit24v13"
RESULTS_MD = HERE / "RESULTS.md"     # the teacher-level block goes here
SUFFIXES = ("", "_t2", "_t3", "_t4")


def design(flag: str = "") -> tuple[tuple, tuple, dict]:
    """(same-tokenizer arms, cross-tokenizer arms, each arm's teacher) of the eight k1 arms whose
    estimator carries ``flag`` (later protocols: ``_g1``, ``_zstop``) before the teacher's
    suffix."""
    same = tuple(f"op_k1_same_mean_clip{flag}{s}" for s in SUFFIXES)
    cross = tuple(f"op_k1_byte_mean_clip{flag}{s}" for s in SUFFIXES)
    return same, cross, {**{a: f"teacher_same_big{s}" for a, s in zip(same, SUFFIXES)},
                         **{a: f"teacher_big{s}" for a, s in zip(cross, SUFFIXES)}}


SAME, CROSS, TEACHER_OF = design()
ARMS = ("cont_ce", *SAME, *CROSS)
CONFIRM_SEEDS = (140, 141, 142)
STAGES = ("confirm",)
ALPHA = 0.05
GOAL = 0.2
DRAWS = 20000
say = study.say


def _gain(acc: dict, arms, seeds) -> float:
    """The mean over ``arms`` and ``seeds`` of arm minus continued CE on the same seed."""
    return statistics.fmean(acc[a][s] - acc["cont_ce"][s] for a in arms for s in seeds)


def teacher_gains(acc: dict, seeds: list[int], same=SAME, cross=CROSS) -> dict:
    """Per teacher arm, its mean gain over continued CE on ``seeds`` (the unit of this protocol).
    ``same`` / ``cross``: the arms of each tokenizer (later protocols pass theirs)."""
    return {a: _gain(acc, (a,), seeds) for a in same + cross}


def permutation_p(same: list[float], cross: list[float]) -> float:
    """Exact two-sided permutation p of the difference of means over every split of the pooled
    teacher gains into two groups of the original sizes."""
    pooled, k = same + cross, len(same)
    observed = abs(statistics.fmean(same) - statistics.fmean(cross))
    diffs = []
    for idx in itertools.combinations(range(len(pooled)), k):
        a = [pooled[i] for i in idx]
        b = [pooled[i] for i in range(len(pooled)) if i not in idx]
        diffs.append(abs(statistics.fmean(a) - statistics.fmean(b)))
    return sum(d >= observed - 1e-12 for d in diffs) / len(diffs)


def tokenizer_effect(gains: dict, same_arms=SAME, cross_arms=CROSS) -> dict:
    """(a) same-tokenizer teachers' gains against cross-tokenizer teachers' (n = 4 + 4): Welch t,
    decided; the exact permutation p reported."""
    same, cross = [gains[a] for a in same_arms], [gains[a] for a in cross_arms]
    w = welch(same, cross)
    diff = statistics.fmean(same) - statistics.fmean(cross)
    return {"same_gains": same, "cross_gains": cross, "difference": diff, "welch_t": w.t,
            "welch_p": w.p, "permutation_p": permutation_p(same, cross),
            "holds": bool(w.p < ALPHA and diff > 0)}


def penalty_over_teachers(acc: dict, seeds: list[int], draws: int = DRAWS, same=SAME,
                          cross=CROSS) -> dict:
    """(b) ``1 - mean cross gain / mean same gain`` over the four teachers of each tokenizer, and a
    95% percentile interval that resamples teachers within each tokenizer and the seeds (one
    seed draw shared by every arm: the design pairs arms by seed)."""
    def pen(same_arms, cross_arms, ss) -> float:
        return penalty(_gain(acc, cross_arms, ss), _gain(acc, same_arms, ss))

    rng = random.Random(0)
    boot = [pen([rng.choice(same) for _ in same], [rng.choice(cross) for _ in cross],
                [rng.choice(seeds) for _ in seeds]) for _ in range(draws)]
    point = pen(same, cross, seeds)
    return {"penalty": point, "interval": list(percentile_interval(boot)), "goal": GOAL,
            "met": point <= GOAL,
            "undefined_draws": sum(math.isnan(x) for x in boot) / draws}


def _pearson(x: list[float], y: list[float]) -> float:
    return statistics.correlation(x, y) if len(set(x)) > 1 and len(set(y)) > 1 else float("nan")


def per_teacher(acc: dict, seeds: list[int], gains: dict, meta: dict, same=SAME, cross=CROSS,
                teacher_of=TEACHER_OF) -> dict:
    """(c) per teacher: held-out accuracy (its preparation), gain, paired t against continued CE;
    Pearson r of gain on teacher accuracy within each tokenizer and over all eight
    (exploratory)."""
    rows = {}
    for a in same + cross:
        t = paired([acc[a][s] for s in seeds], [acc["cont_ce"][s] for s in seeds])
        teacher = meta.get(teacher_of[a], {})
        rows[a] = {"teacher": teacher_of[a], "teacher_accuracy": teacher.get("accuracy"),
                   "teacher_bpb": teacher.get("bpb"), "gain": gains[a], "paired_t": t.t,
                   "paired_p": t.p}
    r = {}
    for name, arms in (("same", same), ("cross", cross), ("all", same + cross)):
        xs = [rows[a]["teacher_accuracy"] for a in arms]
        if all(x is not None for x in xs):
            r[name] = _pearson(xs, [gains[a] for a in arms])
    return {"teachers": rows, "gain_vs_teacher_accuracy_r": r}


def seed_effect(acc: dict, seeds: list[int], same_arms=SAME, cross_arms=CROSS) -> dict:
    """(d) per seed, the four same-tokenizer arms' mean gain minus the four cross-tokenizer arms'
    (paired t over seeds, reported; n = 3)."""
    same, cross = ([_gain(acc, arms, (s,)) for s in seeds] for arms in (same_arms, cross_arms))
    t = paired(same, cross)
    return {"per_seed": [x - y for x, y in zip(same, cross)], "paired_t": t.t, "paired_p": t.p}


def analyse(runs: list[dict], meta: dict, same=SAME, cross=CROSS, teacher_of=TEACHER_OF) -> dict:
    """Decisions (a)-(d) of the protocol (module doc) from the confirmation's runs."""
    acc = accuracy_by_arm(runs)
    arms = ("cont_ce", *same, *cross)
    missing = [a for a in arms if a not in acc]
    if missing:
        raise SystemExit(f"[study] no finished run of {', '.join(missing)}: cannot analyse")
    seeds = sorted(set.intersection(*(set(acc[a]) for a in arms)))
    gains = teacher_gains(acc, seeds, same, cross)
    # every run, as for "collapsed" (a later protocol runs arms beyond the design's)
    fmts = [r.get("format_rate") for r in runs if "error" not in r]
    return {"seeds": seeds, "gains": gains,
            "tokenizer_effect": tokenizer_effect(gains, same, cross),
            "penalty": penalty_over_teachers(acc, seeds, same=same, cross=cross),
            "per_teacher": per_teacher(acc, seeds, gains, meta, same, cross, teacher_of),
            "seed_effect": seed_effect(acc, seeds, same, cross),
            "collapsed": sorted({r["arm"] for r in runs if "error" not in r
                                 and r.get("format_rate") is not None
                                 and r["format_rate"] < 0.9}),
            "format_rate_unknown": sorted({r["arm"] for r in runs if "error" not in r
                                           and r.get("format_rate") is None}),
            "lowest_format_rate": min((f for f in fmts if f is not None), default=None)}


def _f(x, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def render_teachers(conf: dict, same=SAME, cross=CROSS, record: str = "credit24v13") -> str:
    """The block ``GENERATED:<record>teachers``: the teacher-level decisions from the
    protocol's record (``<record>/study.json``'s ``confirm``) only."""
    te, pen, rows = conf["tokenizer_effect"], conf["penalty"], conf["per_teacher"]["teachers"]
    lines = [f"## Teachers as the unit (generated from `{record}/study.json`)", "",
             f"Seeds {', '.join(map(str, conf['seeds']))}; a teacher's gain = its arm's mean "
             "accuracy gain over continued CE on those seeds (unlabeled test half).", "",
             "| arm | teacher | tokenizer | teacher held-out accuracy | gain | paired t (p) |",
             "|---|---|---|---|---|---|"]
    for arm in same + cross:
        r = rows[arm]
        lines.append(f"| {arm} | {r['teacher']} | {'same' if arm in same else 'cross'} | "
                     f"{_f(r['teacher_accuracy'], '.3f')} | {r['gain']:+.3f} | "
                     f"{_f(r['paired_t'], '+.2f')} ({_f(r['paired_p'], '.3f')}) |")
    lo, hi = pen["interval"]
    r = conf["per_teacher"]["gain_vs_teacher_accuracy_r"]
    lines += ["",
              f"- (a) tokenizer effect over teachers (same minus cross, 4 + 4 teacher gains): "
              f"{te['difference']:+.3f}, Welch t {te['welch_t']:+.2f}, p {te['welch_p']:.2g} "
              f"(exact permutation p {te['permutation_p']:.3f}); holds (p < {ALPHA}): "
              f"**{'yes' if te['holds'] else 'no'}**",
              f"- (b) penalty over four teachers of each tokenizer: **{pen['penalty']:.2f}** "
              f"[{lo:.2f}, {hi:.2f}] (teachers and seeds resampled; {pen['undefined_draws']:.1%} "
              f"of draws without a penalty, counted as +inf); goal <= {GOAL}: "
              f"**{'met' if pen['met'] else 'not met'}**",
              "- (c) Pearson r of gain on teacher held-out accuracy (exploratory): "
              + ", ".join(f"{k} {_f(v, '+.2f')}" for k, v in r.items()),
              f"- (d) per-seed tokenizer effect: {', '.join(f'{x:+.3f}' for x in conf['seed_effect']['per_seed'])}"
              f" (paired t {_f(conf['seed_effect']['paired_t'], '+.2f')}, p "
              f"{_f(conf['seed_effect']['paired_p'], '.3f')}; reported)",
              f"- (e) collapsed (format rate < 0.9 on a seed): "
              f"{', '.join(conf['collapsed']) or 'none'}; lowest format rate "
              f"{_f(conf['lowest_format_rate'], '.3f')}"]
    return "\n".join(lines)


def confirm_teachers(args, arms, seeds, tag: str, records: Path, design=(SAME, CROSS, TEACHER_OF),
                     results_md: Path | None = None) -> tuple[list[dict], dict]:
    """A teacher-level confirmation (this protocol's and later ones'): ``arms`` on ``seeds`` at
    the fifth protocol's rates (report block ``tag``, raw runs to ``records``), then
    :func:`analyse` of ``design`` (same arms, cross arms, their teachers). Returns the runs and
    ``study.json``'s ``confirm`` record; the teachers' block ``<tag>teachers`` is written to
    ``results_md`` (default: this protocol's)."""
    chosen = v6.fifth_rates()
    runs = v6.confirm_runs(args, arms, seeds, chosen, tag, records)
    meta = json.loads((records / "confirm.json").read_text()).get("meta", {})
    comps = {c["arm"]: c for c in comparisons(runs)}
    conf = {**v6.confirm_state(arms, seeds, chosen, comps), **analyse(runs, meta, *design)}
    update_results_md(render_teachers(conf, design[0], design[1], tag),
                      results_md or RESULTS_MD, f"{tag}teachers")
    return runs, conf


def stage_confirm(args, state: dict) -> None:
    _, state["confirm"] = confirm_teachers(args, ARMS, CONFIRM_SEEDS, "credit24v13", RECORDS)
    te, p = state["confirm"]["tokenizer_effect"], state["confirm"]["penalty"]
    say(f"tokenizer effect over teachers {te['difference']:+.3f} (Welch p {te['welch_p']:.3g}, "
        f"permutation p {te['permutation_p']:.3g}); penalty over four teachers each "
        f"{p['penalty']:.2f} [{p['interval'][0]:.2f}, {p['interval'][1]:.2f}] (goal <= {GOAL})")

STAGE_FUNCS = {"confirm": stage_confirm}


def main(argv=None) -> int:
    return study.protocol_main(argv, "runs/q24v13", STAGES, STAGE_FUNCS, RECORDS, v5.TASK, __doc__)


if __name__ == "__main__":
    sys.exit(main())
