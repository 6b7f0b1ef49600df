"""The issue-24 on-policy credit study, twelfth protocol: byte credit on the student's own units.

The protocol is written in ``benchmarks/quality/RESULTS.md`` ("On-policy credit study, twelfth
protocol", committed before its runs); this script runs it without a hand-set number:

    python benchmarks/quality/study_v12.py --out runs/q24v12 --cache runs/q24_prep \\
        --reuse runs/q24v11/confirm/runs --jobs 2

The eleventh protocol's task, rates, teachers and seeds (130-139, the unlabeled test half). Two
new arms, the confirmed estimator (k1, ``mean`` baseline, 2-nat clamp, byte credit) on
*student-token units* (``loss.byte_units: token``): ``op_k1_byte_tok_mean_clip`` (D: the first
cross-tokenizer teacher) and ``op_k1_byte_tok_mean_clip_t2`` (D2: the second). The eleventh
protocol's five arms on the same seeds are reused, not re-run (``--reuse``: their finished run
folders are linked, and the harness still checks each one's config against the one it would
generate). Stages:

``confirm``  the seven arms on seeds 130-139 (only D and D2 train); the generated block
             ``GENERATED:credit24v12`` (every k1 arm against continued CE, Holm over six);
             ``study.json`` adds (a) the unit effect within each cross teacher (D - C, D2 - C2:
             paired and Welch t, Holm over two), (b) the penalty over both teachers with token
             units, ``1 - mean gain(D, D2) / mean gain(A, A2)``, with its bootstrap interval,
             (c) the four one-teacher-each penalties with token units, (d) the unit effect over
             both teachers ((D + D2)/2 - (C + C2)/2 per seed, paired and Welch t).
``repro``    the reuse check: the eleventh protocol's ``op_k1_byte_mean_clip`` on seed 130 (and
             its CE warm start) trained again from nothing; its accuracy, bits per byte and
             curve must equal the committed record exactly.

Raw per-run results: ``benchmarks/quality/credit24v12/confirm.json``, ``repro.json`` and
``study.json``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import study  # the first protocol's helpers (this script's folder is on the path when it runs)
import study_v5 as v5
import study_v6 as v6
from toyq.confirm import accuracy_by_arm, comparisons
from toyq.stats import compare, paired, penalty_interval, welch

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "credit24v12"
ELEVENTH = HERE / "credit24v11" / "confirm.json"
SAME, SAME2 = "op_k1_same_mean_clip", "op_k1_same_mean_clip_t2"
CROSS, CROSS2 = "op_k1_byte_mean_clip", "op_k1_byte_mean_clip_t2"
TOK, TOK2 = "op_k1_byte_tok_mean_clip", "op_k1_byte_tok_mean_clip_t2"
REUSED = ("cont_ce", SAME, SAME2, CROSS, CROSS2)
ARMS = REUSED + (TOK, TOK2)
SEEDS = tuple(range(130, 140))
REPRO_ARM, REPRO_SEED = CROSS, 130
STAGES = ("confirm", "repro")
ALPHA = 0.05
GOAL = 0.2
say = study.say


def link_runs(src: Path | None, dst: Path, arms, seeds) -> int:
    """Link the finished run folders ``src/<arm>/seed<k>`` (and the CE warm starts) into
    ``dst``; returns how many are linked there (made now or by an earlier invocation). Missing
    ones are left for the harness to train."""
    if src is None or not src.is_dir():
        return 0
    n = 0
    for arm in ("ce", *arms):
        for s in seeds:
            a, b = src / arm / f"seed{s}", dst / arm / f"seed{s}"
            if a.is_dir() and not b.exists():
                b.parent.mkdir(parents=True, exist_ok=True)
                b.symlink_to(a.resolve(), target_is_directory=True)
            n += b.is_symlink() and b.resolve() == a.resolve()
    return n


def _gain(acc: dict, arms, seed: int) -> float:
    """The mean gain of ``arms`` over continued CE on ``seed``."""
    return statistics.fmean(acc[a][seed] - acc["cont_ce"][seed] for a in arms)


def unit_effect(acc: dict, seeds: list[int]) -> dict:
    """(a) D - C and D2 - C2 (paired and Welch t, Holm over the two; decided on the paired
    test), and (d) the effect over both teachers per seed (paired t, Welch reported)."""
    tests = compare(acc, [(TOK, CROSS), (TOK2, CROSS2)], higher_is_better=True,
                    shared_seeds=True)
    per = {t: {"arm": c.arm, "baseline": c.baseline, "difference": c.gain,
               "welch_p": c.welch.p, "paired_p": c.paired.p, "welch_holm": c.welch_holm,
               "paired_holm": c.paired_holm,
               "raises_paired": c.paired_holm < ALPHA and c.gain > 0}
           for t, c in zip(("first", "second"), tests)}
    tok = [_gain(acc, (TOK, TOK2), s) for s in seeds]
    chunk = [_gain(acc, (CROSS, CROSS2), s) for s in seeds]
    both = {"difference": statistics.fmean(tok) - statistics.fmean(chunk),
            "paired_p": paired(tok, chunk).p, "welch_p": welch(tok, chunk).p}
    return {"per_teacher": per, "both_teachers": both}


def penalties(acc: dict, seeds: list[int]) -> dict:
    """(b) the penalty over both teachers of each tokenizer with token units (the issue's
    figure for this estimator), next to the chunk-unit one on the same seeds, and (c) the four
    one-teacher-each penalties with token units; bootstrap intervals (seeds resampled)."""
    def one(same_arms, cross_arms) -> dict:
        pen, lo, hi = penalty_interval([[(_gain(acc, same_arms, s), _gain(acc, cross_arms, s))
                                         for s in seeds]])
        return {"penalty": pen, "interval": [lo, hi]}

    tok = one((SAME, SAME2), (TOK, TOK2))
    return {"token_units": {**tok, "goal": GOAL, "met": tok["penalty"] <= GOAL},
            "chunk_units": one((SAME, SAME2), (CROSS, CROSS2)),
            "one_teacher_each": {f"{s}/{c}": one((s,), (c,))
                                 for s in (SAME, SAME2) for c in (TOK, TOK2)}}


def analyse(runs: list[dict]) -> dict:
    """Decisions (a)-(d) of the protocol (module doc) from the confirmation's runs."""
    acc = accuracy_by_arm(runs)
    seeds = sorted(set.intersection(*(set(acc[a]) for a in ARMS)))
    gains = {a: statistics.fmean(_gain(acc, (a,), s) for s in seeds) for a in ARMS[1:]}
    return {"seeds": seeds, "gains": gains, "unit_effect": unit_effect(acc, seeds),
            "penalties": penalties(acc, seeds)}


def stage_confirm(args, state: dict) -> None:
    linked = link_runs(args.reuse, args.out / "confirm" / "runs", REUSED, SEEDS)
    say(f"reused {linked} finished run folders of the eleventh protocol from {args.reuse}")
    chosen = v6.fifth_rates()
    runs = v6.confirm_runs(args, ARMS, SEEDS, chosen, "credit24v12", RECORDS)
    comps = {c["arm"]: c for c in comparisons(runs)}
    parts = analyse(runs)
    state["confirm"] = {**v6.confirm_state(ARMS, SEEDS, chosen, comps), **parts,
                        "reused_arms": list(REUSED), "linked_runs": linked}
    g, p = parts["gains"], parts["penalties"]["token_units"]
    u = parts["unit_effect"]["per_teacher"]
    say(f"gains D {g[TOK]:+.3f}, D2 {g[TOK2]:+.3f} (C {g[CROSS]:+.3f}, C2 {g[CROSS2]:+.3f}); "
        f"D - C {u['first']['difference']:+.3f} (paired Holm p {u['first']['paired_holm']:.3g}), "
        f"D2 - C2 {u['second']['difference']:+.3f} (paired Holm p "
        f"{u['second']['paired_holm']:.3g}); penalty with token units {p['penalty']:.2f} "
        f"[{p['interval'][0]:.2f}, {p['interval'][1]:.2f}] (goal <= {GOAL})")


def repro_check(new: dict, old: dict) -> dict:
    """Exact equality of the fields a reused run is read by."""
    keys = ("accuracy", "format_rate", "bpb", "curve")
    same = {k: new.get(k) == old.get(k) for k in keys}
    return {"arm": new["arm"], "seed": new["seed"],
            "identical": new.get("accuracy") is not None and all(same.values()),
            "fields": same, "new": {k: new.get(k) for k in keys},
            "recorded": {k: old.get(k) for k in keys}}


def stage_repro(args, state: dict) -> None:
    chosen = v6.fifth_rates()
    out = args.out / "repro"
    runs = study.harness(out, args, [REPRO_ARM], [REPRO_SEED], v5.WARM_STEPS,
                         ["--eval-split", "unlabeled_test", "--cont-lr",
                          f"{chosen['cont_ce']:g}", "--arm-lr",
                          v6.arm_lr([REPRO_ARM], chosen),
                          # its report stays in the run folder: the committed RESULTS.md
                          # blocks and plots are the protocols' own
                          "--report-dir", str(out / "report")])
    study.record(out, "repro", RECORDS)
    old = next(r for r in json.loads(ELEVENTH.read_text())["runs"]
               if r["arm"] == REPRO_ARM and r["seed"] == REPRO_SEED)
    new = next(r for r in runs if r["arm"] == REPRO_ARM and r["seed"] == REPRO_SEED)
    state["repro"] = repro_check(new, old)
    say(f"reuse check: {REPRO_ARM} seed {REPRO_SEED} retrained: "
        f"{'identical to' if state['repro']['identical'] else 'DIFFERS from'} the record "
        f"(accuracy {new['accuracy']:.4f} vs {old['accuracy']:.4f})")


STAGE_FUNCS = {"confirm": stage_confirm, "repro": stage_repro}


def _options(parser) -> None:
    parser.add_argument("--reuse", type=Path, default=None,
                        help="the eleventh protocol's finished runs (<its out>/confirm/runs)")


def main(argv=None) -> int:
    return study.protocol_main(argv, "runs/q24v12", STAGES, STAGE_FUNCS, RECORDS, v5.TASK,
                               __doc__, extend=_options)


if __name__ == "__main__":
    sys.exit(main())
