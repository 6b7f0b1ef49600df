"""Experiment trackers behind one interface: TensorBoard and Weights & Biases (offline or online).

``metrics.jsonl`` (:mod:`xdistill.metrics`) is always written; trackers are extra sinks that rank 0
opens once per run (:func:`open_trackers`), feeds every logged step (``log(step, metrics)``, numbers
only) and closes at the end:

* ``train.tensorboard: true`` (the default): ``<out_dir>/tb``, through
  ``torch.utils.tensorboard`` (needs the ``tensorboard`` package: ``pip install
  'xdistill[tracking]'``);
* ``train.wandb: offline`` writes the run under ``<out_dir>/wandb`` without any network (upload it
  later with ``wandb sync <out_dir>/wandb/offline-run-*``); ``online`` logs to the W&B server
  (after ``wandb login``); ``WANDB_MODE=offline`` in the environment keeps an ``online`` run
  offline. Project: ``train.wandb_project``; the run's config goes with it.

A requested tracker whose package is missing is one warning naming the extra to install; the run
goes on with the others.
"""

from __future__ import annotations

import os
from pathlib import Path

from xdistill.log import get_logger

log = get_logger("train")

EXTRA = "pip install 'xdistill[tracking]'"


class Tracker:
    """One sink of step metrics."""

    name = "tracker"

    def log(self, step: int, metrics: dict) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class TensorBoardTracker(Tracker):
    """Scalars into a TensorBoard event file under ``folder``."""

    name = "tensorboard"

    def __init__(self, folder: Path, start_step: int = 0):
        # deferred: tensorboard (optional extra `tracking`)
        from torch.utils.tensorboard import SummaryWriter

        # the steps after start_step are (re)written by this run: earlier events of them (a run
        # resumed from a checkpoint, a fresh run in a used folder) are purged, as metrics.jsonl
        # is trimmed
        self.writer = SummaryWriter(str(folder), purge_step=start_step + 1)

    def log(self, step: int, metrics: dict) -> None:
        for k, v in _numbers(metrics).items():
            self.writer.add_scalar(k, v, step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker(Tracker):
    """A W&B run under ``folder`` (``mode``: offline or online)."""

    name = "wandb"

    def __init__(self, folder: Path, mode: str, project: str, name: str, config: dict):
        # deferred: wandb (optional extra `tracking`)
        import wandb

        if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled"):
            mode = os.environ["WANDB_MODE"].lower()
        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, name=name, dir=str(folder), mode=mode,
                              config=config, settings=wandb.Settings(console="off", silent=True))

    def log(self, step: int, metrics: dict) -> None:
        self.run.log(_numbers(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """The run's open trackers, fed and closed together."""

    def __init__(self, trackers: list[Tracker]):
        self.trackers = trackers

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.trackers]

    def log(self, step: int, metrics: dict) -> None:
        for t in self.trackers:
            t.log(step, metrics)

    def close(self) -> None:
        for t in self.trackers:
            t.close()


def _numbers(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _missing(key: str, package: str) -> None:
    log.warning("%s is on but the %s package is not installed (%s); the run goes on without it "
                "(metrics.jsonl has the logged steps)", key, package, EXTRA)


def open_trackers(cfg, out_dir: Path, config: dict | None = None,
                  start_step: int = 0) -> Trackers:
    """The trackers ``cfg.train`` asks for (call on rank 0 only; see the module docstring);
    ``start_step``: the step the run starts after (its resume step)."""
    tc, out = cfg.train, []
    if tc.tensorboard:
        try:
            out.append(TensorBoardTracker(out_dir / "tb", start_step))
        except ImportError:
            _missing("train.tensorboard", "tensorboard")
    mode = getattr(tc, "wandb", "off")
    if mode != "off":
        try:
            out.append(WandbTracker(out_dir / "wandb", mode, tc.wandb_project,
                                    Path(out_dir).name, config or {}))
        except ImportError:
            _missing(f"train.wandb ({mode})", "wandb")
    return Trackers(out)
