"""RESULTS.md and plots from a harness result (``results.json``).

Plots (matplotlib, Agg): ``accuracy_bpb.png`` (mean +- std per arm, two panels) and
``curves.png`` (learning curves per arm, mean over seeds with a shaded +-std band: held-out
accuracy of the checkpoints, from each run's ``score.json`` ``curve``, and held-out bits per byte
from the trainer's ``eval/bpb`` in ``metrics.jsonl``; runs without them are skipped).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from toyq.confirm import confirmation_lines, is_same
from toyq.summary import acc_auc, format_table, read_metrics


def plot_summary(summary: dict, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(summary)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, key, label in ((axes[0], "accuracy", "held-out exact-match accuracy"),
                           (axes[1], "bpb", "held-out bits per byte (lower is better)")):
        ax.bar(arms, [summary[a][key] for a in arms],
               yerr=[summary[a][f"{key}_std"] for a in arms], capsize=3,
               color=["#888" if a == "ce" else "#3a7" for a in arms])
        ax.set_title(label)
        ax.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def mean_band(series: list[list]) -> tuple[list, list, list]:
    """``(steps, mean, std)`` over the steps every series in ``[[[step, value], ...], ...]`` has
    (std 0 for a single series)."""
    steps = sorted(set.intersection(*(set(int(st) for st, _ in ser) for ser in series))
                   if series else set())
    by_step = [{int(st): float(v) for st, v in ser} for ser in series]
    mean, std = [], []
    for st in steps:
        vals = [d[st] for d in by_step]
        mean.append(statistics.fmean(vals))
        std.append(statistics.stdev(vals) if len(vals) > 1 else 0.0)
    return steps, mean, std


def _run_curves(out: Path, arm: str, seeds) -> tuple[list, list]:
    """Accuracy curves (score.json) and bpb curves (metrics.jsonl) of ``arm``'s runs."""
    acc, bpb = [], []
    for seed in seeds:
        run_dir = out / "runs" / arm / f"seed{seed}"
        score_path = run_dir / "score.json"
        curve = json.loads(score_path.read_text()).get("curve") if score_path.exists() else None
        if curve:
            acc.append(curve)
        if (run_dir / "metrics.jsonl").exists():
            ev = [[m["step"], m["eval/bpb"]] for m in read_metrics(run_dir / "metrics.jsonl")
                  if "eval/bpb" in m]
            if ev:
                bpb.append(ev)
    return acc, bpb


def plot_curves(out: Path, arms, seeds, path: Path) -> Path:
    """``curves.png``: per arm, held-out accuracy and bits per byte vs step, mean over ``seeds``
    with a shaded +-std band (CE-only dashed black)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from toyq.arms import ARMS

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    colors = plt.get_cmap("tab20")
    for i, arm in enumerate(arms):  # the same colour for an arm in every plot
        color = colors((ARMS.index(arm) if arm in ARMS else i) % 20)
        style = {"color": "black", "ls": "--"} if arm == "ce" else {"color": color}
        for ax, series in zip(axes, _run_curves(Path(out), arm, seeds)):
            steps, mean, std = mean_band(series)
            if not steps:
                continue
            ax.plot(steps, mean, lw=1.3, marker="o", ms=2, label=f"{arm} ({len(series)})", **style)
            ax.fill_between(steps, [m - d for m, d in zip(mean, std)],
                            [m + d for m, d in zip(mean, std)], color=style["color"], alpha=0.12,
                            lw=0)
    axes[0].set(title="held-out exact-match accuracy", xlabel="step")
    axes[1].set(title="held-out bits per byte (lower is better)", xlabel="step")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6.5, ncol=2, title="arm (seeds); band = ±std",
                      title_fontsize=6.5)
        else:
            ax.text(0.5, 0.5, "no curves (runs without checkpoints / eval)", ha="center",
                    transform=ax.transAxes, color="gray")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def xtoken_ordering(summary: dict) -> str:
    """The measured accuracy ordering of the X-Token arms (worst to best)."""
    from toyq.arms import XTOKEN_ARMS

    present = [a for a in XTOKEN_ARMS if a in summary]
    ranked = sorted(present, key=lambda a: summary[a]["accuracy"])
    return " < ".join(f"{a} ({summary[a]['accuracy']:.3f})" for a in ranked)


def write_results_json(result: dict, path: Path) -> Path:
    path.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return path


def significance(summary: dict, base_arm: str = "ce") -> list[str]:
    """Each arm's accuracy gain over the baseline (CE-only) in units of the larger std."""
    if base_arm not in summary:
        return []
    base = summary[base_arm]
    lines = []
    for arm, s in summary.items():
        if arm == base_arm:
            continue
        sd = max(s["accuracy_std"], base["accuracy_std"])
        gain = s["accuracy"] - base["accuracy"]
        if min(s["seeds"], base["seeds"]) < 2 or sd == 0:
            lines.append(f"- {arm}: {gain:+.3f} accuracy vs {base_arm} (no std: fewer than 2 "
                         "seeds)")
            continue
        lines.append(f"- {arm}: {gain:+.3f} accuracy vs {base_arm} ({gain / sd:+.1f} std)")
    return lines


# arms whose only teacher has the other tokenizer (``multi`` also has a same-tokenizer teacher)
CROSS_ONLY = ("uld", "uld_1to1", "gold", "gold_ce", "exact_kl", "pkl_multi", "pkl_corpus",
              "pkl_cont", "alm", "alm_ce", "onpolicy")


def acceptance(summary: dict, base_arm: str = "ce", candidates=CROSS_ONLY) -> str:
    """The issue's criterion on the best cross-tokenizer-only arm: its held-out accuracy gain
    over the baseline (CE-only) divided by the larger of the two stds must exceed 2."""
    present = [a for a in candidates if a in summary]
    if base_arm not in summary or not present:
        return ""
    best = max(present, key=lambda a: summary[a]["accuracy"])
    s, base = summary[best], summary[base_arm]
    sd = max(s["accuracy_std"], base["accuracy_std"])
    gain = s["accuracy"] - base["accuracy"]
    if min(s["seeds"], base["seeds"]) < 2 or sd == 0:
        return f"Best cross-tokenizer arm: {best} ({gain:+.3f} vs CE-only; fewer than 2 seeds)."
    verdict = "met" if gain > 2 * sd else "NOT met"
    return (f"Best cross-tokenizer arm: {best}, {gain:+.3f} held-out accuracy over CE-only = "
            f"{gain / sd:.1f} x the larger std ({sd:.3f}); criterion (> 2 std): {verdict}.")


def paired_diffs(runs: list[dict], arm: str, base: str = "ce") -> dict:
    """Per seed both ``arm`` and ``base`` finished: ``arm - base`` of final accuracy and of
    ``acc_auc`` (the latter only where both runs have a curve). Same seed = same initial weights
    and data order, so the difference removes the seed's own luck from the comparison."""
    ok = {(r["arm"], r["seed"]): r for r in runs if "error" not in r}
    seeds = sorted(sd for a, sd in ok if a == arm and (base, sd) in ok)
    acc = [ok[arm, sd]["accuracy"] - ok[base, sd]["accuracy"] for sd in seeds]
    aucs = [(acc_auc(ok[arm, sd]), acc_auc(ok[base, sd])) for sd in seeds]
    return {"seeds": seeds, "accuracy": acc,
            "acc_auc": [a - b for a, b in aucs if a is not None and b is not None]}


def _paired_text(diffs: list[float]) -> str:
    """``mean ± std (t = ...)`` of per-seed differences; t = mean / (std / sqrt(n))."""
    if not diffs:
        return "-"
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return f"{mean:+.3f} (1 seed, no std)"
    sd = statistics.stdev(diffs)
    if sd <= 1e-12 * max(1.0, abs(mean)):  # identical differences (rounding noise): no t
        return f"{mean:+.3f} ± {sd:.3f} (identical on every seed)"
    t = mean / (sd / math.sqrt(len(diffs)))
    return f"{mean:+.3f} ± {sd:.3f} (t = {t:+.1f})"


def paired_significance(runs: list[dict], arms, base_arm: str = "ce") -> list[str]:
    """One line per arm: paired-by-seed difference to CE-only of final accuracy (with the
    per-seed values) and of the mean accuracy over training, plus a header with the two-sided 5%
    critical |t| (Student's t, n - 1 degrees of freedom) for the seed counts present."""
    from scipy.stats import t as student_t

    pairs = {a: paired_diffs(runs, a, base_arm) for a in arms if a != base_arm}
    pairs = {a: p for a, p in pairs.items() if p["seeds"]}
    if not pairs:
        return []
    ns = sorted({len(p["seeds"]) for p in pairs.values() if len(p["seeds"]) > 1})
    crit = ", ".join(f"{student_t.ppf(0.975, n - 1):.2f} at n = {n}" for n in ns)
    lines = [f"Paired by seed (arm − {base_arm} on the same seed = same initial weights and data "
             "order; mean ± std over seeds, t = mean / (std / √n)"
             + (f"; two-sided 5% needs |t| > {crit}):" if crit else "):"), ""]
    for arm, p in pairs.items():
        per_seed = "/".join(f"{d:+.2f}" for d in p["accuracy"])
        better = sum(d > 0 for d in p["accuracy"])
        auc = (f"; mean accuracy over training {_paired_text(p['acc_auc'])}" if p["acc_auc"]
               else "")
        lines.append(f"- {arm}: final accuracy {_paired_text(p['accuracy'])}, per seed "
                     f"{per_seed} (better on {better}/{len(p['seeds'])}){auc}")
    return lines


def _protocol_lines(summary: dict) -> tuple[str, list[str]]:
    """(baseline arm, the protocol's ordering and criterion lines)."""
    from toyq.continued import is_cont_arm

    if "cont_ce" in summary:
        op = [a for a in summary if a.startswith("op_") and is_cont_arm(a)]
        ranked = sorted(op, key=lambda a: summary[a]["accuracy"])
        order = " < ".join(f"{a} ({summary[a]['accuracy']:.3f})" for a in ranked)
        return "cont_ce", [
            f"On-policy kinds by held-out accuracy (worst to best): {order}; published "
            "orderings: Strict top-k > SimCT > GOLD (Hou et al.), ESCD > BPM (ESCD paper).", "",
            "Gain over continued CE (accuracy, in units of the larger of the two stds):", "",
            *significance(summary, "cont_ce"), "",
            acceptance(summary, "cont_ce", [a for a in op if not is_same(a)])
            .replace("CE-only", "continued CE")]  # a same-teacher arm is the control, not cross
    return "ce", [f"X-Token arms by held-out accuracy (worst to best): "
                  f"{xtoken_ordering(summary)}", "",
                  "Gain over CE-only (accuracy, in units of the larger of the two stds):", "",
                  *significance(summary), "", acceptance(summary)]


def render(result: dict, meta: dict) -> str:
    """The generated part of RESULTS.md (table, ordering, significance, setup)."""
    summary = result["summary"]
    base, protocol = _protocol_lines(summary)
    splits = {r.get("split", "heldout") for r in result.get("runs", [])}
    split = splits.pop() if len(splits) == 1 else "heldout"
    lines = ["## Table (generated)", "", format_table(summary, split), "",
             "Mean accuracy over training = the mean held-out accuracy of the checkpoints saved "
             "every `eval_every` steps (area under the accuracy curve / steps): higher = learns "
             "faster; `-` = no curve.", "",
             *protocol, "",
             *paired_significance(result.get("runs", []), list(summary), base), "",
             *confirmation_lines(result.get("runs", [])), "",
             *[f"FAILED arm {a}: {e}" for a, e in result.get("failed", {}).items()], "",
             "## Setup (generated)", "", "```",
             json.dumps(meta, indent=1), "```", ""]
    return "\n".join(lines)
