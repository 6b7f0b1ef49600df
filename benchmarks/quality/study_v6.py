"""The issue-24 on-policy credit study, sixth protocol: a lower-variance byte-credit k1.

The protocol is written in ``benchmarks/quality/RESULTS.md`` ("On-policy credit study, sixth
protocol", committed before its runs); this script runs it without a hand-set number:

    python benchmarks/quality/study_v6.py --out runs/q24v6 --cache runs/q24_prep --jobs 2

The fifth protocol's task and rates (read from ``credit24v5/study.json``: continued CE at its
chosen rate, every k1 arm at k1's), with three variance-reduced versions of byte-credit k1
(``toyq.continued``): ``_mean`` (the micro-batch mean advantage subtracted: a control
variate), ``_clip`` (advantages clamped to ``[-BYTE_CLIP, BYTE_CLIP]``), and both.

Stages (choices appended to ``<out>/study.json``; runs cached by the harness):

1. ``screen``  ``SCREEN_ARMS`` on seeds 0-2, the unlabeled tuning half. The variant with the best
               mean accuracy (ties: the earlier in ``VARIANTS``) is carried forward if its mean
               beats ``op_k1_byte``'s and its lowest format rate is at least 0.9; otherwise the
               study stops there and says so.
2. ``confirm`` continued CE, ``op_k1_same``, ``op_k1_byte`` and the carried variant on fresh
               seeds 70-79, the unlabeled test half, scored once. The primary test: the variant
               against ``op_k1_byte``, paired and Welch (one comparison; it passes only if both
               do: two-sided p < 0.05 with a positive gain). The generated
               block ``GENERATED:credit24v6`` holds the arms against continued CE (Holm over
               them) and the cross-tokenizer penalties against ``op_k1_same``.

Raw per-run results: ``benchmarks/quality/credit24v6/{screen,confirm}.json`` and ``study.json``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import study  # the first protocol's helpers (this script's folder is on the path when it runs)
import study_v5 as v5
from toyq.confirm import MIN_FORMAT_RATE, accuracy_by_arm
from toyq.stats import compare

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "credit24v6"
REFERENCE = "op_k1_byte"
VARIANTS = ("op_k1_byte_mean", "op_k1_byte_clip", "op_k1_byte_mean_clip")
SCREEN_ARMS = (REFERENCE, *VARIANTS)
SCREEN_SEEDS = (0, 1, 2)
CONFIRM_SEEDS = tuple(range(70, 80))
STAGES = ("screen", "confirm")
ALPHA = 0.05
say = study.say


def fifth_rates() -> dict:
    """The fifth protocol's chosen rates (its committed ``study.json``)."""
    return json.loads((v5.RECORDS / "study.json").read_text())["lr"]["chosen"]


def rate_of(arm: str, chosen: dict) -> float:
    """Continued CE at its rate; every k1 arm (variants included) at k1's."""
    return chosen["cont_ce"] if arm == "cont_ce" else chosen["op_k1_same"]


def arm_lr(arms, chosen: dict) -> str:
    return ",".join(f"{a}={rate_of(a, chosen):g}" for a in arms if a != "cont_ce")


def carried(table: dict) -> str | None:
    """The screen's rule (module doc): the best variant, if it beats the reference."""
    best = max(VARIANTS, key=lambda a: (table[a]["mean"], -VARIANTS.index(a)))
    ok = (table[best]["mean"] > table[REFERENCE]["mean"]
          and table[best]["min_format_rate"] >= MIN_FORMAT_RATE)
    return best if ok else None


def stage_screen(args, state: dict) -> None:
    out, chosen = args.out / "screen", fifth_rates()
    runs = study.harness(out, args, list(SCREEN_ARMS), SCREEN_SEEDS, v5.WARM_STEPS,
                         ["--eval-split", "unlabeled_tune", "--cont-lr",
                          f"{chosen['cont_ce']:g}", "--arm-lr", arm_lr(SCREEN_ARMS, chosen),
                          "--no-report"])
    study.record(out, "screen", RECORDS)
    table = {a: v5.summarize(runs, a) for a in SCREEN_ARMS}
    pick = carried(table)
    state["screen"] = {"table": table, "carried": pick, "rates": chosen,
                       "rule": "best mean tuning-half accuracy among the variants, carried if it "
                               "beats op_k1_byte and keeps format rate >= 0.9 on every seed"}
    say("screen: " + ", ".join(f"{a} {t['mean']:.3f}" for a, t in table.items())
        + f"; carried: {pick or 'none (the study stops here)'}")


def primary(runs: list[dict], variant: str) -> dict:
    """The variant against ``op_k1_byte`` on the shared seeds (paired and Welch)."""
    per_seed = accuracy_by_arm(runs, (variant, REFERENCE))
    c = compare(per_seed, [(variant, REFERENCE)], higher_is_better=True, shared_seeds=True)[0]
    seeds = sorted(set(per_seed[variant]) & set(per_seed[REFERENCE]))
    better = sum(per_seed[variant][s] > per_seed[REFERENCE][s] for s in seeds)
    return {"variant": variant, "reference": REFERENCE, "gain": c.gain, "welch": c.welch.p,
            "paired": c.paired.p, "seeds_better": better, "n": len(seeds),
            "passed": bool(c.gain > 0 and c.welch.p < ALPHA and c.paired.p < ALPHA)}


def confirm_runs(args, arms, seeds, chosen: dict, tag: str, records: Path) -> list[dict]:
    """A confirmation stage's runs (later protocols too): ``arms`` on ``seeds``, the unlabeled
    test half, at the ``chosen`` rates; the report block ``tag``; the raw runs to ``records``."""
    out = args.out / "confirm"
    runs = study.harness(out, args, list(arms), seeds, v5.WARM_STEPS,
                         ["--eval-split", "unlabeled_test", "--cont-lr",
                          f"{chosen['cont_ce']:g}", "--arm-lr", arm_lr(arms, chosen),
                          "--report-dir", str(HERE), "--tag", tag])
    study.record(out, "confirm", records)
    return runs


def confirm_state(arms, seeds, chosen: dict, comps: dict) -> dict:
    """A later confirmation's record in ``study.json``: arms, seeds, rates and per arm the
    tests against continued CE (``comps``: :func:`toyq.confirm.comparisons` by arm)."""
    return {"arms": list(arms), "seeds": list(seeds),
            "rates": {a: rate_of(a, chosen) for a in arms},
            "tests": {a: {k: c[k] for k in ("gain", "welch_holm", "paired_holm", "passes",
                                            "min_format_rate")} for a, c in comps.items()}}


def stage_confirm(args, state: dict) -> None:
    variant = state["screen"]["carried"]
    if variant is None:
        say("no variant beat op_k1_byte in the screen: no confirmation (protocol rule)")
        state["confirm"] = {"skipped": "no variant carried"}
        return
    chosen = state["screen"]["rates"]
    arms = ["cont_ce", "op_k1_same", REFERENCE, variant]
    runs = confirm_runs(args, arms, CONFIRM_SEEDS, chosen, "credit24v6", RECORDS)
    test = primary(runs, variant)
    state["confirm"] = {"arms": arms, "seeds": list(CONFIRM_SEEDS), "primary": test,
                        "rates": {a: rate_of(a, chosen) for a in arms},
                        "means": {a: statistics.fmean(r["accuracy"] for r in runs
                                                      if r["arm"] == a and "error" not in r)
                                  for a in arms}}
    say(f"primary: {variant} - {REFERENCE} = {test['gain']:+.3f} ({test['seeds_better']}/"
        f"{test['n']} seeds), paired p {test['paired']:.3g}, Welch p {test['welch']:.3g}: "
        f"{'passed' if test['passed'] else 'not passed'}")


STAGE_FUNCS = {"screen": stage_screen, "confirm": stage_confirm}


def main(argv=None) -> int:
    return study.protocol_main(argv, "runs/q24v6", STAGES, STAGE_FUNCS, RECORDS, v5.TASK, __doc__)


if __name__ == "__main__":
    sys.exit(main())
