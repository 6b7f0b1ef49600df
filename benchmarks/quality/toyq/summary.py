"""Aggregate scored runs per arm: mean +- std of accuracy, bits per byte and learning speed.

Learning speed: ``acc_auc`` = the mean of a run's curve accuracies, i.e. the area under the
accuracy-vs-step curve (step rule, one point per ``eval_every`` steps) divided by the steps. It is
defined only for curves of at least two points (``eval_every = 0`` leaves just the final
checkpoint, whose accuracy is the final accuracy, not a learning speed).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def _mean_std(xs: list[float]) -> tuple[float, float]:
    xs = [x for x in xs if x is not None]
    if not xs:
        return float("nan"), float("nan")
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def acc_auc(run: dict) -> float | None:
    """Mean held-out accuracy over the run's curve points; None without a curve of >= 2 points
    (score.json files written before curves existed have none)."""
    curve = run.get("curve") or []
    if len(curve) < 2:
        return None
    return statistics.fmean(float(acc) for _, acc in curve)


def summarize(runs: list[dict], arms) -> dict:
    """Per arm, over its successful seeds: mean and std of final accuracy, bits per byte and
    ``acc_auc`` (None where no run has a curve, so results.json stays strict JSON; ``auc_seeds``
    counts the runs that have one)."""
    out = {}
    for arm in arms:
        rs = [r for r in runs if r["arm"] == arm and "error" not in r]
        if not rs:
            continue
        acc, acc_sd = _mean_std([r["accuracy"] for r in rs])
        fmt, fmt_sd = _mean_std([r.get("format_rate") for r in rs])  # older scores have none
        bpb, bpb_sd = _mean_std([r["bpb"] for r in rs])
        aucs = [acc_auc(r) for r in rs]
        auc, auc_sd = _mean_std(aucs) if any(a is not None for a in aucs) else (None, None)
        out[arm] = {"accuracy": acc, "accuracy_std": acc_sd, "format_rate": fmt,
                    "format_rate_std": fmt_sd, "bpb": bpb, "bpb_std": bpb_sd,
                    "acc_auc": auc, "acc_auc_std": auc_sd,
                    "auc_seeds": sum(a is not None for a in aucs),
                    "seeds": len(rs), "train_s": statistics.fmean(r["train_s"] for r in rs)}
    return out


def _pm(mean, std) -> str:
    """``mean ± std`` with 3 decimals, ``-`` when missing (nan/None)."""
    if mean is None or math.isnan(mean):
        return "-"
    return f"{mean:.3f} ± {std:.3f}"


# the accuracy column's name per scored split (``run.py --eval-split``)
SPLIT_COLUMNS = {"heldout": "held-out accuracy", "valid": "validation accuracy",
                 "unlabeled": "accuracy on the unlabeled prompts",
                 "unlabeled_tune": "accuracy on the unlabeled prompts' tuning half",
                 "unlabeled_test": "accuracy on the unlabeled prompts' test half"}


def format_table(summary: dict, split: str = "heldout") -> str:
    """Markdown table: final accuracy (on the held-out test split, or the split named by
    ``split``: see :data:`SPLIT_COLUMNS`), format rate (well-formed answers; ``-`` for runs
    scored before it existed), mean accuracy over training (``acc_auc``), bits per byte,
    mean ± std over seeds."""
    name = SPLIT_COLUMNS.get(split, "held-out accuracy")
    lines = [f"| arm | {name} | format rate | mean accuracy over training | bits per "
             "byte | seeds | train s/run |", "|---|---|---|---|---|---|---|"]
    for arm, s in summary.items():
        auc = _pm(s.get("acc_auc"), s.get("acc_auc_std"))
        fmt = _pm(s.get("format_rate"), s.get("format_rate_std"))
        lines.append(f"| {arm} | {_pm(s['accuracy'], s['accuracy_std'])} | {fmt} | {auc} | "
                     f"{_pm(s['bpb'], s['bpb_std'])} | {s['seeds']} | {s['train_s']:.0f} |")
    return "\n".join(lines)


