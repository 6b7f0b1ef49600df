"""Comparisons of arms over seeds: Welch and paired t-tests with a Holm correction.

What a results table claims is decided here, from the raw per-seed values (``results.json``), not
from "N std" (a difference of means over the larger standard deviation passes a null comparison
at n = 3 about 2% of the time, and the best of many arms far more often).

* :func:`welch` -- two-sample t-test without equal variances (Welch-Satterthwaite degrees of
  freedom), two-sided; for arms whose seeds are unrelated.
* :func:`paired` -- paired t-test over seeds present in both arms (same seed = same data order and
  initialisation), two-sided.
* :func:`holm` -- Holm's step-down adjustment of a family of p-values (the comparisons a protocol
  lists, all of them, whatever came out).
* :func:`penalty` -- the cross-tokenizer penalty ``1 - cross gain / same gain`` (gains over the
  same baseline; nan unless the same-tokenizer gain is positive); :func:`penalty_interval` pools
  several protocols' seeds and bootstraps an interval.
* :func:`compare` -- every listed (arm vs baseline) comparison of one metric, adjusted together;
  :func:`format_comparisons` renders them as a markdown table (the harness's on-policy
  confirmation table is :mod:`toyq.confirm`).

The statistics are written from their definitions; the t distribution's tail comes from
``scipy.special.stdtr``. Tests check them against ``scipy.stats`` and hand-computed cases.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from scipy.special import stdtr

NAN = float("nan")


class TTest(NamedTuple):
    """One two-sided t-test: statistic, degrees of freedom, p-value (also ``t, df, p = test``)."""

    t: float
    df: float
    p: float


def _two_sided(t: float, df: float) -> float:
    if not (math.isfinite(df) and df > 0) or math.isnan(t):
        return float("nan")
    return float(2.0 * stdtr(df, -abs(t)))


def welch(a, b) -> TTest:
    """Welch's t-test of mean(a) - mean(b); ValueError unless each side has >= 2 values."""
    a, b = list(a), list(b)
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch's t needs at least 2 values per arm, got {len(a)} and {len(b)}")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = statistics.fmean(a) - statistics.fmean(b)
    if va + vb == 0:
        t = 0.0 if diff == 0 else math.copysign(math.inf, diff)
        return TTest(t, float("nan"), 1.0 if diff == 0 else 0.0)
    t = diff / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return TTest(t, df, _two_sided(t, df))


def paired(a, b) -> TTest:
    """Paired t-test of a - b: over the seeds (keys) both have when given mappings, else over
    two equal-length sequences; ValueError unless there are >= 2 pairs."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        seeds = sorted(set(a) & set(b))
        d = [a[s] - b[s] for s in seeds]
    else:
        a, b = list(a), list(b)
        if len(a) != len(b):
            raise ValueError(f"the paired t needs equal-length lists, got {len(a)} and {len(b)}")
        d = [x - y for x, y in zip(a, b)]
    if len(d) < 2:
        raise ValueError(f"the paired t needs at least 2 pairs, got {len(d)}")
    mean, sd = statistics.fmean(d), statistics.stdev(d)
    df = len(d) - 1
    if sd == 0:
        t = 0.0 if mean == 0 else math.copysign(math.inf, mean)
        return TTest(t, df, 1.0 if mean == 0 else 0.0)
    t = mean / (sd / math.sqrt(len(d)))
    return TTest(t, df, _two_sided(t, df))


def holm(pvalues):
    """Holm step-down adjusted p-values: the k-th smallest of m is multiplied by m - k + 1, made
    monotone, capped at 1. A list gives a list in its order, a mapping a mapping with its keys;
    nan stays nan and does not count in m."""
    if isinstance(pvalues, Mapping):
        keys = list(pvalues)
        return dict(zip(keys, holm([pvalues[k] for k in keys])))
    idx = sorted((i for i, p in enumerate(pvalues) if not math.isnan(p)), key=lambda i: pvalues[i])
    m, out, running = len(idx), [NAN] * len(pvalues), 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def penalty(cross_gain: float, same_gain: float) -> float:
    """``1 - cross_gain / same_gain`` (nan unless ``same_gain > 0``)."""
    if not same_gain > 0:
        return NAN
    return 1.0 - cross_gain / same_gain


def penalty_interval(groups: list[list[tuple[float, float]]], *, draws: int = 20000,
                     seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """(penalty, low, high): the cross-tokenizer penalty of per-seed (same gain, cross gain)
    pairs pooled over ``groups`` (one list per protocol), and a percentile bootstrap interval
    that resamples seeds within each group (``draws`` resamples, seeded)."""
    def pen(rows):
        return penalty(statistics.fmean(c for _, c in rows), statistics.fmean(s for s, _ in rows))

    pooled = [r for g in groups for r in g]
    rng = random.Random(seed)
    boot = [pen([g[rng.randrange(len(g))] for g in groups for _ in g]) for _ in range(draws)]
    return (pen(pooled), *percentile_interval(boot, level))


def percentile_interval(draws: list[float], level: float = 0.95) -> tuple[float, float]:
    """The ``level`` percentile interval of bootstrap ``draws`` of a penalty. A draw whose same
    gain is not positive has no penalty (nan): it counts as the worst, +inf, since a teacher that
    teaches nothing over one tokenizer leaves the other nothing to match, so such draws widen the
    interval upwards (an end that falls on them is inf) instead of being sorted arbitrarily."""
    boot = sorted(math.inf if math.isnan(x) else x for x in draws)
    k = int(round((1 - level) / 2 * len(boot)))
    return boot[k], boot[len(boot) - 1 - k]


def _or_nan(test, *args) -> TTest:
    """``test(*args)``, or an all-nan result where it is undefined (fewer than 2 seeds)."""
    try:
        return test(*args)
    except ValueError:
        return TTest(NAN, NAN, NAN)


@dataclass(frozen=True)
class Comparison:
    """``arm`` against ``baseline`` on one metric (gain > 0 = better in the metric's direction)."""

    arm: str
    baseline: str
    n_arm: int
    n_base: int
    gain: float
    welch: TTest
    paired: TTest
    welch_holm: float
    paired_holm: float

    def passes(self, alpha: float = 0.05) -> bool:
        """Better, with both Holm-adjusted p-values below ``alpha``."""
        return self.gain > 0 and self.welch_holm < alpha and self.paired_holm < alpha


def compare(per_seed: dict[str, dict[int, float]], pairs: list[tuple[str, str]], *,
            higher_is_better: bool, shared_seeds: bool = False) -> list[Comparison]:
    """Every (arm, baseline) in ``pairs`` on ``per_seed[arm][seed]``; the Welch and the paired
    p-values are each Holm-adjusted over the whole list (a comparison with fewer than 2 seeds
    gets nan and does not count). ``shared_seeds``: each pair uses only the seeds both of its
    arms finished (Welch too, not only the paired test)."""
    for arm, base in pairs:
        for name in (arm, base):
            if name not in per_seed:
                raise KeyError(f"no per-seed results for arm {name!r} (have: {sorted(per_seed)})")
    sign = 1.0 if higher_is_better else -1.0
    rows = []
    for arm, base in pairs:
        a, b = per_seed[arm], per_seed[base]
        if shared_seeds:
            keep = sorted(a.keys() & b.keys())
            a, b = {k: a[k] for k in keep}, {k: b[k] for k in keep}
        gain = sign * (statistics.fmean(a.values()) - statistics.fmean(b.values()))
        rows.append((arm, base, len(a), len(b), gain, _or_nan(welch, a.values(), b.values()),
                     _or_nan(paired, a, b)))
    wh = holm([r[5].p for r in rows])
    ph = holm([r[6].p for r in rows])
    return [Comparison(*r, welch_holm=w, paired_holm=p) for r, w, p in zip(rows, wh, ph)]


def _p(x: float) -> str:
    return "-" if math.isnan(x) else (f"{x:.2g}" if x < 0.01 else f"{x:.3f}")


def format_comparisons(rows: list[Comparison], metric: str, alpha: float = 0.05) -> str:
    """Markdown table: gain, Welch and paired t with raw and Holm-adjusted p, verdict."""
    lines = [f"| arm vs baseline | n | gain in {metric} | Welch t (df) | p | p Holm | paired t (df) "
             "| p | p Holm | verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        verdict = f"better (Holm p < {alpha})" if r.passes(alpha) else "not shown"
        lines.append(
            f"| {r.arm} vs {r.baseline} | {r.n_arm} / {r.n_base} | {r.gain:+.4f} | "
            f"{r.welch.t:.2f} ({r.welch.df:.1f}) | {_p(r.welch.p)} | {_p(r.welch_holm)} | "
            f"{r.paired.t:.2f} ({r.paired.df:.0f}) | {_p(r.paired.p)} | {_p(r.paired_holm)} | "
            f"{verdict} |")
    return "\n".join(lines) + "\n"


__all__ = ["Comparison", "TTest", "compare", "format_comparisons", "holm", "paired", "penalty",
           "welch"]
