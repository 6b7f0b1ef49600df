"""The contract between the trainer core and a training mode: the mode, its plan, the run state.

:class:`TrainMode` is what a mode implements, :class:`RunPlan` what the core reads of the mode's
plan, :class:`Run` the live state of a run.

The core (:mod:`xdistill.train.core`) runs the loop; a mode (``OffPolicyMode``, ``OnPolicyMode``)
supplies a step's micro-batches and their loss, and declares what the core needs of its config
beyond the shared sections of :class:`xdistill.train.run_config.RunConfig`: the longest student
sequence it feeds the model (``sequence_length``) and its evaluation cadence (``eval_every``).
A mode's own parts (teacher pool, loaders, rollout engine) are read through the mode
(``run.mode.pool``), never through the run; neither this module nor the core imports a mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from torch.optim.lr_scheduler import LRScheduler

    from xdistill.distributed import DistEnv
    from xdistill.metrics import MetricsWriter
    from xdistill.tokenization.tokenizer import Tokenizer
    from xdistill.train.metrics import StepMetrics, Timers
    from xdistill.train.run_config import RunConfig
    from xdistill.train.trackers import Trackers


class RunPlan(Protocol):
    """What the core reads of a mode's plan (:meth:`TrainMode.plan`)."""

    # the student's tokenizer
    student_tok: Tokenizer


class TrainMode:
    """How a step's micro-batches are produced and scored (see :mod:`xdistill.train.core`).

    Subclasses set ``kind`` and implement the methods below; ``loaders`` are the stateful loaders
    whose states go into every checkpoint.
    """

    kind = "base"
    loaders: list

    def plan(self, cfg: RunConfig, env: DistEnv) -> RunPlan:
        """Validate ``cfg`` for ``env``'s world size, then load tokenizers, projections, loss
        specs: everything checked before any model loads."""
        raise NotImplementedError

    def sequence_length(self, cfg: RunConfig) -> tuple[int, str]:
        """The longest student sequence this mode feeds the model, and the config key(s) that set
        it (checked against the model's positions before any step)."""
        raise NotImplementedError

    def eval_every(self, cfg: RunConfig) -> int:
        """Evaluate after every this many steps (0: only after the last; -1: never)."""
        raise NotImplementedError

    def build(self, run: Run) -> None:
        """Loaders, teachers, engines (after the student exists)."""
        raise NotImplementedError

    def start(self, run: Run) -> None:
        """Start teachers and iterators (after resume)."""

    def micro_batches(self, run: Run, step: int, timers: Timers) -> list:
        raise NotImplementedError

    def units(self, micros: list) -> dict[str, int]:
        """Local loss units per key over this step's micro-batches (summed over ranks here)."""
        raise NotImplementedError

    def prepare_step(self, run: Run, micros: list) -> None:
        """Once per step on every rank, after the units are counted and before the micro-steps:
        any other whole-step quantity (collectives allowed)."""

    def micro_step(self, run: Run, micro, num_valid: dict, timers: Timers,
                   metrics: StepMetrics) -> None:
        """Teachers, student forward, loss and backward of one micro-batch; records metrics."""
        raise NotImplementedError

    def after_update(self, run: Run, step: int) -> None:
        """Called after every optimizer step (applied or skipped)."""

    def evaluate(self, run: Run, step: int) -> dict | None:
        return None

    def loader_states(self, step: int) -> list:
        """Every loader's state right after ``step`` (for its checkpoint)."""
        return [ld.state_dict() for ld in self.loaders]

    def load_loader_states(self, states: list) -> None:
        for loader, st in zip(self.loaders, states):
            loader.load_state_dict(st)

    def log_samples(self, run: Run, step: int, micros: list) -> None:
        pass

    def console_keys(self, cfg: RunConfig) -> list[str]:
        return ["loss", "lr", "grad_norm", "tok_per_s"]

    def checkpoint_extra(self, cfg: RunConfig) -> dict:
        return {}

    def check_resume(self, cfg: RunConfig, path: Path, extra: dict) -> None:
        """Refuse (or warn about) a checkpoint whose data differs from this run's."""

    def close(self) -> None:
        pass


@dataclass(slots=True)
class Run:
    """The live state of a run. The mode's own parts (teacher pool, loaders, engine, ...) are
    read through ``run.mode`` (slots: a misspelt or mode-side attribute set on the run is an
    error, not a silent new attribute)."""

    cfg: RunConfig
    env: DistEnv
    mode: TrainMode
    plan: RunPlan
    device: torch.device
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler
    # micro-batches per data shard per step (gradient accumulation)
    accum: int = 1
    start_step: int = 0
    writer: MetricsWriter | None = None
    # TensorBoard / W&B (xdistill.train.trackers), rank 0 only
    trackers: Trackers | None = None
    # non-finite steps in a row, and finite steps taken by this process
    nonfinite_streak: int = 0
    finite_steps: int = 0
    last_nonfinite: str = ""
    last_checkpoint: Path | None = None
    # a resumed run's RNG states, restored once the mode has started (its loaders' iterators
    # draw from the global generator when they are made, as the uninterrupted run's did before
    # its first step)
    resume_rng: dict | None = None
