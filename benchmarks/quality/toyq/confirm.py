"""The issue-24 confirmation table: each kind against continued CE with a cross-tokenizer and a
same-tokenizer control teacher, Welch and paired t with Holm's correction, the penalty.

Arms: ``op_<kind>`` (cross-tokenizer teacher) and ``op_<kind>_same`` (the control teacher over
the student's tokenizer; :func:`control_arm`), against ``cont_ce``, over the seeds each pair
finished. For every (kind, teacher), a control shared by two kinds counted once: the gain in
mean accuracy, Welch's t and the paired t with two-sided p, each family of p-values
Holm-adjusted over all comparisons in the table; a comparison *passes* when both adjusted p are
below alpha (0.05) and the gain is positive. Per kind, the cross-tokenizer
penalty ``1 - cross gain / same gain``; per arm, the lowest final format rate over seeds (a
kind *collapses* when it is below 0.9 on any seed).
"""

from __future__ import annotations

from toyq.stats import compare, penalty

ALPHA = 0.05
MIN_FORMAT_RATE = 0.9


def is_same(arm: str) -> bool:
    """Whether an on-policy arm is scored by the same-tokenizer teacher's model: over the
    student's tokenizer (a ``same`` flag) or under its twin (``twin``: the cross pipeline)."""
    return bool({"same", "twin"} & set(arm.split("_")[2:]))


def teacher_label(arm: str) -> str:
    """``same``, ``twin`` or ``cross``: the teacher column of a comparison row."""
    flags = arm.split("_")[2:]
    return "same" if "same" in flags else "twin" if "twin" in flags else "cross"


def control_arm(arm: str) -> str:
    """The same-tokenizer control of an on-policy arm: ``op_k1`` -> ``op_k1_same``; a byte-credit
    arm shares its kind's control, with the same estimator changes (``op_k1_byte`` ->
    ``op_k1_same``, ``op_k1_byte_mean_clip`` -> ``op_k1_same_mean_clip``: over one tokenizer
    byte credit and token credit coincide; ``_tmean`` -> ``_mean`` and ``_tok`` dropped: with one
    student token per unit the two baselines, and chunk and student-token units, coincide)."""
    kind, *flags = arm.split("_")[1:]
    if "byte" in flags:
        same = {"tmean": "mean"}
        return "_".join(["op", kind, "same", *(same.get(f, f) for f in flags
                                               if f not in ("byte", "tok"))])
    return arm + "_same"


def _by_arm(runs: list[dict]) -> dict:
    out: dict = {}
    for r in runs:
        if "error" not in r:
            out.setdefault(r["arm"], {})[r["seed"]] = r
    return out


def accuracy_by_arm(runs: list[dict], arms=None) -> dict[str, dict[int, float]]:
    """``{arm: {seed: accuracy}}`` of the finished runs (of ``arms`` only, when given)."""
    return {arm: {s: r["accuracy"] for s, r in by_seed.items()}
            for arm, by_seed in _by_arm(runs).items() if arms is None or arm in arms}


def comparisons(runs: list[dict], base: str = "cont_ce") -> list[dict]:
    """One record per (kind, teacher) with both arms and the base finished on >= 2 shared seeds;
    the tests are :func:`toyq.stats.compare`'s over those seeds."""
    arms = _by_arm(runs)
    if base not in arms:
        return []
    kinds = sorted(a for a in arms if a.startswith("op_") and not is_same(a)
                   and control_arm(a) in arms)
    pairs = [(kind, teacher, arm) for kind in kinds
             for teacher, arm in (("cross", kind), ("same", control_arm(kind)))]
    # an arm of the same-tokenizer teacher's model that is no kind's control (the twin) is its
    # own kind
    pairs += [(a, teacher_label(a), a) for a in sorted(arms) if a.startswith("op_") and is_same(a)]
    rows, seen = [], set()
    for kind, teacher, arm in pairs:  # a control shared by two kinds (k1, k1_byte): tested once
        if arm not in seen and len(set(arms[arm]) & set(arms[base])) >= 2:
            rows.append((kind, teacher, arm))
            seen.add(arm)
    per_seed = {a: {s: r["accuracy"] for s, r in by_seed.items()} for a, by_seed in arms.items()}
    tests = compare(per_seed, [(arm, base) for _, _, arm in rows], higher_is_better=True,
                    shared_seeds=True)
    out = []
    for (kind, teacher, arm), c in zip(rows, tests):
        seeds = sorted(set(arms[arm]) & set(arms[base]))
        fmts = [arms[arm][s].get("format_rate") for s in seeds]
        out.append({"kind": kind, "teacher": teacher, "arm": arm, "seeds": seeds,
                    "gain": c.gain, "welch": c.welch, "paired": c.paired,
                    "welch_holm": c.welch_holm, "paired_holm": c.paired_holm,
                    "passes": c.passes(ALPHA),
                    "min_format_rate": (min(fmts) if all(f is not None for f in fmts)
                                        else None)})
    return out


def confirmation_lines(runs: list[dict], base: str = "cont_ce") -> list[str]:
    """Markdown: the comparison table, the penalties and the decisions (module doc)."""
    comps = comparisons(runs, base)
    if not comps:
        return []
    lines = ["Confirmation (issue 24): gain over continued CE, Welch and paired t, p Holm-adjusted "
             f"over the {len(comps)} comparisons; passes = positive gain and both adjusted "
             f"p < {ALPHA}:", "",
             "| kind | teacher | seeds | gain | Welch t (p, Holm p) | paired t (p, Holm p) | "
             "lowest format rate | passes |", "|---|---|---|---|---|---|---|---|"]
    for c in comps:
        w, p = c["welch"], c["paired"]
        fmt = "-" if c["min_format_rate"] is None else f"{c['min_format_rate']:.2f}"
        lines.append(f"| {c['kind']} | {c['teacher']} | {len(c['seeds'])} | {c['gain']:+.3f} | "
                     f"{w[0]:+.2f} ({w[2]:.3f}, {c['welch_holm']:.3f}) | "
                     f"{p[0]:+.2f} ({p[2]:.3f}, {c['paired_holm']:.3f}) | {fmt} | "
                     f"{'yes' if c['passes'] else 'no'} |")
    lines.append("")
    gains = {c["arm"]: c["gain"] for c in comps}
    for kind in sorted({c["kind"] for c in comps}):
        if not is_same(kind) and kind in gains and control_arm(kind) in gains:
            pen = penalty(gains[kind], gains[control_arm(kind)])
            text = "undefined (the same-tokenizer gain is not positive)" if pen != pen \
                else f"{pen:.2f} (goal <= 0.2)"
            lines.append(f"- cross-tokenizer penalty of {kind}: {text}")
    collapsed = [c["arm"] for c in comps
                 if c["min_format_rate"] is not None and c["min_format_rate"] < MIN_FORMAT_RATE]
    k1 = next((c for c in comps if c["kind"] == "op_k1" and c["teacher"] == "same"), None)
    if k1 is not None:
        lines.append(f"- k1 with the same-tokenizer teacher beats continued CE: "
                     f"{'yes' if k1['passes'] else 'no'}")
    lines.append(f"- collapsed (format rate < {MIN_FORMAT_RATE} on a seed): "
                 f"{', '.join(collapsed) or 'none'}")
    return lines


__all__ = ["comparisons", "confirmation_lines", "control_arm", "is_same", "teacher_label"]
