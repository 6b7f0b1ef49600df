"""Tests of the issue-24 protocol: Welch's and the paired t-test, Holm's correction, the penalty.

Two-sided p-values from Student's t distribution (``scipy.stats.t``). Welch's t compares two
arms' per-seed results without assuming equal variances (Welch-Satterthwaite degrees of freedom);
the paired t compares them seed by seed (same seed = same initial weights and data order). Holm's
step-down correction controls the family-wise error over the confirmation's comparisons. The
cross-tokenizer penalty of a kind is ``1 - (cross-tokenizer gain / same-tokenizer gain)``, gains
over continued CE (nan unless the same-tokenizer gain is positive).
"""

from __future__ import annotations

import math
import statistics


def _p_two_sided(t: float, df: float) -> float:
    from scipy.stats import t as student_t

    if math.isnan(t) or df <= 0:
        return float("nan")
    return float(2.0 * student_t.sf(abs(t), df))


def welch(xs, ys) -> tuple[float, float, float]:
    """(t, degrees of freedom, two-sided p) of mean(xs) - mean(ys); needs >= 2 values each."""
    n, m = len(xs), len(ys)
    if n < 2 or m < 2:
        raise ValueError(f"Welch's t needs at least 2 values per arm, got {n} and {m}")
    vx, vy = statistics.variance(xs) / n, statistics.variance(ys) / m
    diff = statistics.fmean(xs) - statistics.fmean(ys)
    if vx + vy == 0:
        return (0.0 if diff == 0 else math.copysign(math.inf, diff)), float(n + m - 2), \
            (1.0 if diff == 0 else 0.0)
    t = diff / math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / (vx ** 2 / (n - 1) + vy ** 2 / (m - 1))
    return t, df, _p_two_sided(t, df)


def paired(xs, ys) -> tuple[float, float, float]:
    """(t, n - 1, two-sided p) of the per-pair differences xs[i] - ys[i]."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"the paired t needs two equal-length lists of >= 2, got {len(xs)} and "
                         f"{len(ys)}")
    d = [x - y for x, y in zip(xs, ys)]
    sd = statistics.stdev(d)
    mean = statistics.fmean(d)
    if sd == 0:
        return (0.0 if mean == 0 else math.copysign(math.inf, mean)), float(len(d) - 1), \
            (1.0 if mean == 0 else 0.0)
    t = mean / (sd / math.sqrt(len(d)))
    return t, float(len(d) - 1), _p_two_sided(t, len(d) - 1)


def holm(pvalues: dict) -> dict:
    """Holm-adjusted p-values (same keys): the k-th smallest of m is multiplied by m - k + 1,
    made monotone, capped at 1; reject where the adjusted p < alpha."""
    order = sorted(pvalues, key=lambda k: pvalues[k])
    m, out, running = len(order), {}, 0.0
    for k, key in enumerate(order):
        running = max(running, min(1.0, (m - k) * pvalues[key]))
        out[key] = running
    return out


def penalty(cross_gain: float, same_gain: float) -> float:
    """``1 - cross_gain / same_gain`` (nan unless ``same_gain > 0``)."""
    if not same_gain > 0:
        return float("nan")
    return 1.0 - cross_gain / same_gain


__all__ = ["holm", "paired", "penalty", "welch"]
