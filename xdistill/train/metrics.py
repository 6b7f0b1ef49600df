"""Typed step metrics: values stay on their device during the step and are reduced once.

Every value a trainer records in a step says how it combines over micro-batches *and* ranks:

* ``add`` (sum): loss terms (each micro-batch's term is already divided by the *global* unit
  count, so the sum over micro-batches and ranks is the step's value), token and clamp counts;
* ``mean``: averaged over every contribution of every rank (teacher weights, coverage, scores,
  ratios);
* ``local``: this rank's value, not reduced (wall-clock timings, learning rate, the gradient norm
  that the clipping already reduced).

:meth:`StepMetrics.reduce` stacks all ``add``/``mean`` values (0-dim tensors on any device, or
Python numbers) into one float64 vector and runs a single ``all_reduce_sum``: one device sync and
one collective per step, whatever the number of teachers. Every rank must record the same keys
(the trainers record by construction the same keys on every rank).

Also the step's other mode-neutral bookkeeping: :class:`Timers` (wall-clock seconds per phase)
and :func:`all_reduce_counts` (the loss-unit counts ``num_valid`` summed over ranks).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from xdistill import distributed as xdist


class StepMetrics:
    """Metrics of one optimizer step (see the module docstring)."""

    def __init__(self):
        self._sum: dict[str, list] = {}
        self._mean: dict[str, list] = {}
        self._local: dict[str, float] = {}

    def add(self, key: str, value) -> None:
        """Summed over micro-batches and ranks."""
        self._check(key, self._mean, self._local)
        self._sum.setdefault(key, []).append(value)

    def mean(self, key: str, value) -> None:
        """Averaged over all contributions of all ranks."""
        self._check(key, self._sum, self._local)
        self._mean.setdefault(key, []).append(value)

    def local(self, key: str, value) -> None:
        """This rank's value, reported as is (the last one recorded wins)."""
        self._check(key, self._sum, self._mean)
        self._local[key] = float(value)

    @staticmethod
    def _check(key: str, *others) -> None:
        if any(key in o for o in others):
            raise ValueError(f"metric {key!r} recorded with two different reductions")

    def __contains__(self, key: str) -> bool:
        return key in self._sum or key in self._mean or key in self._local

    def reduce(self) -> dict[str, float]:
        """One all-reduce over ranks; returns plain floats (non-finite values stay non-finite)."""
        sums, means = sorted(self._sum), sorted(self._mean)
        parts = [_total(self._sum[k]) for k in sums]
        parts += [_total(self._mean[k]) for k in means]
        parts += [float(len(self._mean[k])) for k in means]
        out: dict[str, float] = {}
        if parts:
            dev = next((p.device for p in parts if isinstance(p, torch.Tensor)), torch.device("cpu"))
            vec = torch.stack([_as_f64(p, dev) for p in parts])
            vec = xdist.all_reduce_sum(vec).tolist()
            n = len(sums)
            out.update(zip(sums, vec[:n]))
            m = len(means)
            for i, k in enumerate(means):
                count = vec[n + m + i]
                out[k] = vec[n + i] / count if count else math.nan
        out.update(self._local)
        return out


def _total(values: list):
    total = values[0]
    for v in values[1:]:
        total = total + v
    return total


def _as_f64(value, device: torch.device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().reshape(()).to(device, torch.float64)
    return torch.tensor(float(value), dtype=torch.float64, device=device)


def first_nonfinite(metrics: dict[str, float], keys) -> list[str]:
    """The keys among ``keys`` whose reduced value is NaN or infinite."""
    return [k for k in keys if k in metrics and not math.isfinite(metrics[k])]


class Timers:
    """Accumulates wall-clock seconds per phase (``with timers("teacher"): ...``)."""

    def __init__(self, sync=None):
        self.seconds = defaultdict(float)
        self._sync = sync or (lambda: None)

    @contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds[name] += time.perf_counter() - t0


def all_reduce_counts(local: dict[str, int]) -> dict[str, int]:
    """Per-key counts summed over all ranks (one collective; every rank has the same keys)."""
    keys = sorted(local)
    summed = xdist.all_reduce_sum(torch.tensor([int(local[k]) for k in keys], dtype=torch.int64))
    return {k: int(v) for k, v in zip(keys, summed.tolist())}
