"""Typed step metrics: values stay on their device during the step and are reduced once.

Every value a trainer records in a step is keyed by a :class:`Metric` (its name, the teacher it
belongs to, its :class:`Role`: the weighted total loss, the CE term, a teacher's loss term, or a
plain statistic) and says how it combines over micro-batches *and* ranks (:class:`Reduce`):

* ``SUM``: loss terms (each micro-batch's term is already divided by the *global* unit count, so
  the sum over micro-batches and ranks is the step's value), token and clamp counts;
* ``MEAN``: averaged over every contribution of every rank (teacher weights, coverage, scores,
  ratios);
* ``PER_UNIT``: summed, then divided by the global loss units of its teacher (on-policy mean
  log-ratio and byte-credit gap);
* ``LOCAL``: this rank's value, not reduced (wall-clock timings, learning rate, the gradient norm
  that the clipping already reduced).

:meth:`StepMetrics.reduce` stacks all reduced values (0-dim tensors on any device, or Python
numbers) into one float64 vector and runs a single ``all_reduce_sum``: one device sync and one
collective per step, whatever the number of teachers. Every rank must record the same metrics
(the trainers record by construction the same ones on every rank). The result,
:class:`ReducedMetrics`, stays typed: the non-finite guard asks it which losses are non-finite
and whose they are. The flat ``{"key": float}`` dict users see (console, ``metrics.jsonl``,
trackers) is made at one edge, :meth:`StepReport.flat` (:meth:`ReducedMetrics.flat` for its
reduced part); :attr:`Metric.key` is the only place a key is spelt.

Also the step's other mode-neutral bookkeeping: :class:`Timers` (wall-clock seconds per phase)
and :func:`all_reduce_counts` (the loss-unit counts ``num_valid`` summed over ranks).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum

import torch

from xdistill import distributed as xdist


class Role(Enum):
    """What a recorded value is (the non-finite guard skips a step when a loss is non-finite)."""

    # the step's weighted total loss
    TOTAL = "total"
    # the student's own next-token cross-entropy term (before its weight)
    CE = "ce"
    # one teacher's loss term
    TEACHER_LOSS = "teacher_loss"
    # any other figure (weights, coverage, counts, ratios)
    STAT = "stat"


class Reduce(Enum):
    """How a metric combines over micro-batches and ranks (module doc)."""

    SUM = "sum"
    MEAN = "mean"
    PER_UNIT = "per_unit"
    LOCAL = "local"


@dataclass(frozen=True)
class Metric:
    """The identity of one step metric: its name, whose it is, what it is."""

    # the figure's name (``loss``, ``coverage``, ``clamp/exp_clip``, ``tokens``, ...)
    name: str
    # the teacher it belongs to; None for the step's own figures
    teacher: str | None = None
    # what it is (module doc)
    role: Role = Role.STAT

    @property
    def key(self) -> str:
        """How it is written: ``<teacher>/<name>``, or ``<name>`` for the step's own."""
        return self.name if self.teacher is None else f"{self.teacher}/{self.name}"

    @property
    def is_loss(self) -> bool:
        return self.role is not Role.STAT


# the step's own figures that the trainer itself reads
TOTAL = Metric("loss", role=Role.TOTAL)
CE = Metric("ce", role=Role.CE)
TOKENS = Metric("tokens")


def teacher_loss(teacher: str) -> Metric:
    """Teacher ``teacher``'s loss term."""
    return Metric("loss", teacher, Role.TEACHER_LOSS)


def teacher_weight(teacher: str) -> Metric:
    """Teacher ``teacher``'s weight in the loss."""
    return Metric("weight", teacher)


def teacher_coverage(teacher: str) -> Metric:
    """The fraction of student loss tokens teacher ``teacher``'s loss covers."""
    return Metric("coverage", teacher)


# the keys :meth:`StepReport.flat` writes besides the recorded metrics (and :func:`time_key`)
LR_KEY, GRAD_NORM_KEY, STEP_S_KEY = "lr", "grad_norm", "step_s"
SKIPPED_KEY, TOK_PER_S_KEY, RSS_KEY = "skipped", "tok_per_s", "rss_mb"


def time_key(phase: str) -> str:
    """How the seconds of timer phase ``phase`` (:class:`Timers`) are written."""
    return f"time/{phase}"


def _metric(metric: Metric | str) -> Metric:
    """A plain name is a statistic of the step's own (no teacher, no loss)."""
    return metric if isinstance(metric, Metric) else Metric(metric)


class StepMetrics:
    """Metrics of one optimizer step, before the rank reduction (see the module docstring)."""

    def __init__(self):
        self._values: dict[Metric, tuple[Reduce, list]] = {}
        self._keys: dict[str, Metric] = {}

    def add(self, metric: Metric | str, value) -> None:
        """Summed over micro-batches and ranks."""
        self._record(metric, Reduce.SUM, value)

    def mean(self, metric: Metric | str, value) -> None:
        """Averaged over all contributions of all ranks."""
        self._record(metric, Reduce.MEAN, value)

    def per_unit(self, metric: Metric, value) -> None:
        """Summed over micro-batches and ranks, then divided by the global loss units of
        ``metric.teacher`` (at least 1)."""
        if metric.teacher is None:
            raise ValueError(f"metric {metric.key!r}: a per-unit figure belongs to a teacher")
        self._record(metric, Reduce.PER_UNIT, value)

    def local(self, metric: Metric | str, value) -> None:
        """This rank's value, reported as is (the last one recorded wins)."""
        metric = _metric(metric)
        self._record(metric, Reduce.LOCAL, None)
        self._values[metric] = (Reduce.LOCAL, [float(value)])

    def _record(self, metric: Metric | str, how: Reduce, value) -> None:
        metric = _metric(metric)
        known = self._keys.setdefault(metric.key, metric)
        entry = self._values.get(metric)
        if known != metric or (entry is not None and entry[0] is not how):
            raise ValueError(f"metric {metric.key!r} recorded with two different reductions")
        if entry is None:
            entry = self._values[metric] = (how, [])
        if value is not None:
            entry[1].append(value)

    def __contains__(self, metric: Metric | str) -> bool:
        return _metric(metric) in self._values

    def reduce(self, units: dict[str, int] | None = None) -> ReducedMetrics:
        """One all-reduce over ranks (non-finite values stay non-finite); ``units``: the global
        loss units per teacher name (and ``"ce"``) of the step, which per-unit figures divide
        by and which the result carries."""
        units = dict(units or {})
        by = {how: sorted((m for m, (h, _) in self._values.items() if h is how),
                          key=lambda m: m.key) for how in (Reduce.SUM, Reduce.MEAN)}
        per_unit = [m for m, (h, _) in self._values.items() if h is Reduce.PER_UNIT]
        summed = by[Reduce.SUM] + by[Reduce.MEAN] + per_unit
        parts = [_total(self._values[m][1]) for m in summed]
        parts += [float(len(self._values[m][1])) for m in by[Reduce.MEAN]]
        values: dict[Metric, float] = {}
        if parts:
            dev = next((p.device for p in parts if isinstance(p, torch.Tensor)), torch.device("cpu"))
            vec = xdist.all_reduce_sum(torch.stack([_as_f64(p, dev) for p in parts])).tolist()
            values.update(zip(summed, vec))
            for m, count in zip(by[Reduce.MEAN], vec[len(summed):]):
                values[m] = values[m] / count if count else math.nan
            for m in per_unit:
                values[m] = values[m] / max(units.get(m.teacher, 0), 1)
        entries = [ReducedMetric(m, how, values[m]) for how in (Reduce.SUM, Reduce.MEAN)
                   for m in by[how]]
        entries += [ReducedMetric(m, Reduce.LOCAL, v[0]) for m, (h, v) in self._values.items()
                    if h is Reduce.LOCAL]
        entries += [ReducedMetric(m, Reduce.PER_UNIT, values[m]) for m in per_unit]
        return ReducedMetrics(tuple(entries), units)


@dataclass(frozen=True)
class ReducedMetric:
    """One metric of a step, reduced over micro-batches and ranks."""

    metric: Metric
    how: Reduce
    value: float


@dataclass(frozen=True)
class ReducedMetrics:
    """A step's metrics after the rank reduction (:meth:`StepMetrics.reduce`), still typed."""

    # in the order they are written: sums, then means (each by key), local values, per-unit ones
    entries: tuple[ReducedMetric, ...] = ()
    # global loss units per teacher name (and "ce")
    units: dict[str, int] = field(default_factory=dict)

    def get(self, metric: Metric | str, default: float | None = None) -> float | None:
        metric = _metric(metric)
        return next((e.value for e in self.entries if e.metric == metric), default)

    def __contains__(self, metric: Metric | str) -> bool:
        return self.get(metric) is not None

    def teacher_losses(self) -> dict[str, float]:
        """Teacher name -> its reduced loss term."""
        return {e.metric.teacher: e.value for e in self.entries
                if e.metric.role is Role.TEACHER_LOSS}

    def nonfinite_losses(self) -> list[Metric]:
        """The loss metrics (total, CE, teachers' terms) whose value is NaN or infinite."""
        return [e.metric for e in self.entries
                if e.metric.is_loss and not math.isfinite(e.value)]

    def flat(self) -> dict[str, float]:
        """The flat ``{key: value}`` form (the part of :meth:`StepReport.flat` these make):
        sums and means by key, local values, ``units/<name>``, per-unit figures."""
        out = {e.metric.key: e.value for e in self.entries if e.how is not Reduce.PER_UNIT}
        out.update({f"units/{k}": v for k, v in self.units.items()})
        out.update({e.metric.key: e.value for e in self.entries if e.how is Reduce.PER_UNIT})
        return out


@dataclass(frozen=True)
class StepReport:
    """Everything one optimizer step reports: its reduced metrics and the optimizer's part."""

    metrics: ReducedMetrics
    # the learning rate this step used
    lr: float
    # the global gradient norm before clipping
    grad_norm: float
    # wall-clock seconds of the whole step (this rank)
    seconds: float
    # False when the non-finite guard skipped the update
    applied: bool
    # wall-clock seconds per phase (Timers.seconds), in the order the phases first ran
    timers: dict[str, float] = field(default_factory=dict)
    # this rank's resident host memory in MiB after the step (None: not measurable here); a
    # figure that grows step after step is the allocator limit host_memory.py describes
    rss_mb: float | None = None

    def flat(self) -> dict[str, float]:
        """The step's metrics as written to the console, ``metrics.jsonl`` and the trackers
        (the one place typed metrics become flat keys)."""
        out = self.metrics.flat()
        out.update({LR_KEY: self.lr, GRAD_NORM_KEY: self.grad_norm, STEP_S_KEY: self.seconds,
                    SKIPPED_KEY: float(not self.applied)})
        tokens = self.metrics.get(TOKENS)
        if tokens is not None:
            out[TOK_PER_S_KEY] = tokens / self.seconds
        if self.rss_mb is not None:
            out[RSS_KEY] = self.rss_mb
        out.update({time_key(k): v for k, v in self.timers.items()})
        return out


def _total(values: list):
    if not values:  # a key recorded without a value on this rank (see StepMetrics._record)
        return 0.0
    total = values[0]
    for v in values[1:]:
        total = total + v
    return total


def _as_f64(value, device: torch.device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().reshape(()).to(device, torch.float64)
    return torch.tensor(float(value), dtype=torch.float64, device=device)


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
