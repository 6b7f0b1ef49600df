"""RESULTS.md and plots from a harness result (``results.json``).

Plots (matplotlib, Agg): ``accuracy_bpb.png`` (mean +- std per arm, two panels) and
``curves.png`` (training CE and, when evaluated during training, held-out bits per byte, per arm,
seed 0 of each arm).
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.quality.harness import format_table, read_metrics


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


def plot_curves(out: Path, arms, seed: int, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for arm in arms:
        mpath = out / "runs" / arm / f"seed{seed}" / "metrics.jsonl"
        if not mpath.exists():
            continue
        ms = read_metrics(mpath)
        tr = [(m["step"], m["ce"]) for m in ms if "ce" in m and "eval/bpb" not in m]
        ev = [(m["step"], m["eval/bpb"]) for m in ms if "eval/bpb" in m]
        if tr:
            axes[0].plot(*zip(*tr), label=arm)
        if ev:
            axes[1].plot(*zip(*ev), marker="o", label=arm)
    axes[0].set(title="training CE (student tokens, nats)", xlabel="step")
    axes[1].set(title="held-out bits per byte", xlabel="step")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def xtoken_ordering(summary: dict) -> str:
    """The measured accuracy ordering of the X-Token arms (worst to best)."""
    from benchmarks.quality.arms import XTOKEN_ARMS

    present = [a for a in XTOKEN_ARMS if a in summary]
    ranked = sorted(present, key=lambda a: summary[a]["accuracy"])
    return " < ".join(f"{a} ({summary[a]['accuracy']:.3f})" for a in ranked)


def write_results_json(result: dict, path: Path) -> Path:
    path.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return path


def significance(summary: dict) -> list[str]:
    """Each arm's accuracy gain over CE-only in units of the larger std."""
    if "ce" not in summary:
        return []
    base = summary["ce"]
    lines = []
    for arm, s in summary.items():
        if arm == "ce":
            continue
        sd = max(s["accuracy_std"], base["accuracy_std"])
        gain = s["accuracy"] - base["accuracy"]
        if min(s["seeds"], base["seeds"]) < 2 or sd == 0:
            lines.append(f"- {arm}: {gain:+.3f} accuracy vs CE-only (no std: fewer than 2 seeds)")
            continue
        lines.append(f"- {arm}: {gain:+.3f} accuracy vs CE-only ({gain / sd:+.1f} std)")
    return lines


def render(result: dict, meta: dict) -> str:
    """The generated part of RESULTS.md (table, ordering, significance, setup)."""
    summary = result["summary"]
    lines = ["## Table (generated)", "", format_table(summary), "",
             f"X-Token arms by held-out accuracy (worst to best): {xtoken_ordering(summary)}", "",
             "Gain over CE-only (accuracy, in units of the larger of the two stds):", "",
             *significance(summary), "",
             *[f"FAILED arm {a}: {e}" for a, e in result.get("failed", {}).items()], "",
             "## Setup (generated)", "", "```",
             json.dumps(meta, indent=1), "```", ""]
    return "\n".join(lines)
