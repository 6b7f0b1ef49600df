"""The issue-24 on-policy credit study, fifteenth protocol: k1 without the teacher's view of where
the text ends (``loss.stop_advantage: zero``) over four teachers of each tokenizer, the teacher as
the unit.

The protocol is written in ``benchmarks/quality/RESULTS.md`` ("On-policy credit study, fifteenth
protocol", committed before its runs); this script runs it without a hand-set number:

    python benchmarks/quality/study_v15.py --out runs/q24v15 --cache runs/q24_prep --jobs 2

The fifth protocol's task and rates (read from ``credit24v5/study.json``), the thirteenth
protocol's eight teachers and estimator with one change, ``loss.stop_advantage: zero`` (units
holding the student's stop get no advantage; under byte credit the stop is not merged with the
period, whose credit then does not depend on the end), one stage:

``confirm``  continued CE and eight arms on fresh seeds 160-162, the unlabeled test half, scored
             once: ``op_k1_same_mean_clip_zstop{,_t2,_t3,_t4}`` and
             ``op_k1_byte_mean_clip_zstop{,_t2,_t3,_t4}``. ``study.json`` holds the thirteenth
             protocol's teacher-level analysis ((A) penalty, (B) tokenizer effect, per teacher
             and per seed), (C) per teacher the change against its per-unit gain in the
             fourteenth protocol (other seeds; reported), (D) the same-tokenizer gains > 0, and
             each arm's stop fraction at the end of training (reported).

Raw per-run results: ``benchmarks/quality/credit24v15/confirm.json`` and ``study.json``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import study  # the first protocol's helpers (this script's folder is on the path when it runs)
import study_v5 as v5
import study_v13 as v13
import study_v14 as v14
from toyq.confirm import accuracy_by_arm
from toyq.run import update_results_md
from toyq.stats import penalty

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "credit24v15"
RESULTS_MD = HERE / "RESULTS.md"
SAME, CROSS, TEACHER_OF = v13.design("_zstop")
ARMS = ("cont_ce", *SAME, *CROSS)
# the per-unit arm of the same teacher (the fourteenth protocol ran them on seeds 150-152)
BEFORE = dict(zip(SAME + CROSS, v13.SAME + v13.CROSS))
CONFIRM_SEEDS = (160, 161, 162)
STAGES = ("confirm",)
say = study.say


def against_per_unit(gains: dict, runs0: list[dict], before: dict = BEFORE, same=SAME,
                     cross=CROSS) -> dict:
    """(C) per arm of ``same`` + ``cross``, its gain here minus the gain of arm ``before[arm]``
    in the fourteenth protocol's runs ``runs0`` (other seeds: reported, no test), and the
    per-unit penalty there."""
    acc0 = accuracy_by_arm(runs0)
    seeds0 = sorted(set.intersection(*(set(acc0[a]) for a in ("cont_ce", *before.values()))))
    gain0 = {a: v13._gain(acc0, (before[a],), seeds0) for a in same + cross}
    change = {a: gains[a] - gain0[a] for a in same + cross}
    return {"seeds_before": seeds0, "change": change,
            "mean_change": {name: statistics.fmean(change[a] for a in arms)
                            for name, arms in (("same", same), ("cross", cross))},
            "penalty_per_unit": penalty(statistics.fmean(gain0[a] for a in cross),
                                        statistics.fmean(gain0[a] for a in same))}


def change_parts(args, conf: dict, before: dict = BEFORE, same=SAME, cross=CROSS) -> tuple:
    """(C) :func:`against_per_unit` against the fourteenth protocol's recorded runs, (D) the
    same-tokenizer gains > 0, and the final stop fractions of ``conf``'s runs under
    ``args.out``."""
    runs0 = json.loads((v14.RECORDS / "confirm.json").read_text())["runs"]
    return (against_per_unit(conf["gains"], runs0, before, same, cross),
            v14.same_positive(conf["gains"], same),
            stop_fractions(args.out, conf["seeds"], same + cross))


def stop_fractions(out: Path, seeds, arms=SAME + CROSS) -> dict:
    """Per arm, the mean over seeds of the rollouts' stop fraction at its last logged step."""
    fr = {}
    for arm in arms:
        vals = []
        for seed in seeds:
            path = out / "confirm" / "runs" / arm / f"seed{seed}" / "metrics.jsonl"
            rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] \
                if path.is_file() else []
            last = [r["stop_fraction"] for r in rows if "stop_fraction" in r][-1:]
            vals += last
        fr[arm] = statistics.fmean(vals) if vals else None
    return fr


def change_table(conf: dict, change: dict, heading: str, intro: str, penalty_text: str,
                 arms=SAME + CROSS) -> str:
    """A ``...change`` block: per arm its change (``change``: :func:`against_per_unit`'s record)
    and final stop fraction, then (C) and (D); ``heading`` / ``intro`` / ``penalty_text`` say
    against what."""
    d, fr = conf["same_positive"], conf["stop_fraction_end"]
    lines = [heading, "", intro, "", "| arm | change | stop fraction at the end |", "|---|---|---|"]
    for arm in arms:
        lines.append(f"| {arm} | {change['change'][arm]:+.3f} | {v13._f(fr[arm], '.2f')} |")
    lines += ["",
              f"- (C) mean change: same-tokenizer {change['mean_change']['same']:+.3f}, "
              f"cross-tokenizer {change['mean_change']['cross']:+.3f}; {penalty_text} "
              f"{v13._f(change['penalty_per_unit'], '.2f')} (reported)",
              f"- (D) same-tokenizer teachers' gains: "
              f"{', '.join(f'{x:+.3f}' for x in d['gains'])}; mean {d['mean']:+.3f}, one-sample "
              f"t {v13._f(d['t'], '+.2f')} (p {v13._f(d['p'], '.3g')}): "
              f"**{'positive' if d['holds'] else 'not shown positive'}**"]
    return "\n".join(lines)


def render_change(conf: dict) -> str:
    """The block ``GENERATED:credit24v15change``: (C), (D) and the stop fractions."""
    c = conf["against_per_unit"]
    intro = (f"Per teacher: gain with `loss.stop_advantage: zero` (seeds "
             f"{', '.join(map(str, conf['seeds']))}) minus its per-unit gain in the fourteenth "
             f"protocol (seeds {', '.join(map(str, c['seeds_before']))}; other seeds: reported, "
             "no test); stop fraction of the training rollouts at the end (mean over seeds).")
    return change_table(conf, c, "## Without the stop's advantage, against per-unit k1 "
                        "(generated from `credit24v15/study.json`)", intro,
                        "per-unit penalty on the fourteenth protocol's seeds")


def stage_confirm(args, state: dict) -> None:
    _, conf = v13.confirm_teachers(args, ARMS, CONFIRM_SEEDS, "credit24v15", RECORDS,
                                   (SAME, CROSS, TEACHER_OF), RESULTS_MD)
    conf["against_per_unit"], conf["same_positive"], conf["stop_fraction_end"] = \
        change_parts(args, conf)
    state["confirm"] = conf
    update_results_md(render_change(conf), RESULTS_MD, "credit24v15change")
    te, p = conf["tokenizer_effect"], conf["penalty"]
    say(f"stop_advantage zero: penalty over four teachers each {p['penalty']:.2f} "
        f"[{p['interval'][0]:.2f}, {p['interval'][1]:.2f}] (goal <= {v13.GOAL}); tokenizer effect "
        f"{te['difference']:+.3f} (Welch p {te['welch_p']:.3g})")

STAGE_FUNCS = {"confirm": stage_confirm}


def main(argv=None) -> int:
    return study.protocol_main(argv, "runs/q24v15", STAGES, STAGE_FUNCS, RECORDS, v5.TASK, __doc__)


if __name__ == "__main__":
    sys.exit(main())
