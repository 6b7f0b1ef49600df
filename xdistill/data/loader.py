"""Build the resumable, sharded training DataLoader (torchdata's StatefulDataLoader).

``build_loader(cfg, student, teachers)`` wires a :class:`DocumentSource`, a :class:`PackedDataset`
(rank- and worker-sharded, lazily packed) and a :class:`CrossTokenizerCollator` (run inside the
workers) into a ``StatefulDataLoader``. Its ``state_dict()`` (one packing position per worker) goes
into the training checkpoint; ``load_state_dict()`` on a new loader with the same config, rank
count and worker count resumes with exactly the batches that were not yet consumed.
"""

from __future__ import annotations

import warnings

from xdistill import child_signals
from xdistill.data.collator import CrossTokenizerCollator, TeacherSpec
from xdistill.data.config import DataConfig
from xdistill.data.dataset import PackedDataset
from xdistill.data.source import DocumentSource
from xdistill.errors import ConfigError, DataError


def _dist_position(rank, world_size) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def build_dataset(cfg: DataConfig, student, *, source=None, rank=None, world_size=None) -> PackedDataset:
    """The packed, sharded dataset of ``cfg`` (``source`` overrides ``cfg.paths``)."""
    if source is None:
        if not cfg.paths:
            raise ConfigError("data.paths is empty: give at least one prepared directory or file")
        source = DocumentSource(cfg.paths, text_column=cfg.text_column,
                                messages_column=cfg.messages_column, invalid_utf8=cfg.invalid_utf8)
    rank, world_size = _dist_position(rank, world_size)
    return PackedDataset(source, student, cfg.seq_len, seed=cfg.seed, shuffle=cfg.shuffle,
                         rank=rank, world_size=world_size, epochs=cfg.epochs, add_bos=cfg.add_bos,
                         loss_roles=cfg.loss_roles, end_of_turn=cfg.end_of_turn_loss)


def build_collator(cfg: DataConfig, student, teachers: list[TeacherSpec]) -> CrossTokenizerCollator:
    return CrossTokenizerCollator(student, teachers, chunks=cfg.chunks, method=cfg.align_method,
                                  loss_roles=cfg.loss_roles, end_of_turn=cfg.end_of_turn_loss,
                                  pad_to_multiple_of=cfg.pad_to_multiple_of)


_LOADER_CLASS: list = []


def _loader_class():
    """``StatefulDataLoader`` whose worker processes start with the stop signals held (see
    :mod:`xdistill.child_signals`); built on first use, so importing this module stays light."""
    if not _LOADER_CLASS:
        from torchdata.stateful_dataloader import StatefulDataLoader

        class SignalSafeLoader(StatefulDataLoader):
            def _get_iterator(self):
                with child_signals.held():   # workers start here, with SIGINT/SIGTERM blocked
                    return super()._get_iterator()

        _LOADER_CLASS.append(SignalSafeLoader)
    return _LOADER_CLASS[0]


def stateful_loader(dataset, **kwargs):
    """A torchdata ``StatefulDataLoader`` for training: its workers ignore the trainer's stop
    signals (:mod:`xdistill.child_signals`: Ctrl-C or SIGTERM to the process group stops the run
    at a step boundary with a checkpoint instead of killing a worker), and torchdata's
    "'set_vital' is deprecated" warning (printed by its constructor on every run) is silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
        return _loader_class()(dataset, worker_init_fn=child_signals.worker_init, **kwargs)


def build_loader(cfg: DataConfig, student, teachers=(), *, source=None, rank=None, world_size=None):
    """A ``StatefulDataLoader`` yielding :class:`DistillBatch` (see the module docstring)."""
    if cfg.batch_size < 1 or cfg.seq_len < 2:
        raise ConfigError(f"data.batch_size must be >= 1 and data.seq_len >= 2 "
                          f"(got {cfg.batch_size}, {cfg.seq_len})")
    dataset = build_dataset(cfg, student, source=source, rank=rank, world_size=world_size)
    workers = int(cfg.num_workers)
    extra = {}
    if workers > 0:
        extra = {"prefetch_factor": cfg.prefetch_factor,
                 "multiprocessing_context": worker_start_method(cfg.multiprocessing_context),
                 "timeout": float(cfg.timeout_s)}
    return stateful_loader(dataset, batch_size=cfg.batch_size, num_workers=workers,
                           collate_fn=build_collator(cfg, student, list(teachers)), **extra)


def worker_start_method(name: str) -> str:
    """``data.multiprocessing_context`` resolved: "auto" is spawn when this process holds CUDA
    state (forking it is unsafe), else fork."""
    if name != "auto":
        return name
    import torch

    return "spawn" if torch.cuda.is_initialized() else "fork"


class WatchedIterator:
    """``next()`` over a loader that turns the loader's worker timeout into one clear error.

    With ``num_workers > 0`` and ``timeout`` set, torch raises a bare ``RuntimeError`` when no
    batch arrives in time; this names the loader, the worker the batch was expected from and the
    config key to change. Every other error passes through unchanged.
    """

    def __init__(self, loader, name: str = "data"):
        self.loader, self.name = loader, name
        self._it = iter(loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self._it)
        except RuntimeError as e:
            if "timed out" not in str(e):
                raise
            raise DataLoaderTimeout(self._timeout_message()) from None

    def _timeout_message(self) -> str:
        it = self._it
        worker = None
        info = getattr(it, "_task_info", {}).get(getattr(it, "_rcvd_idx", None))
        if info:
            worker = info[0]
        pid = None
        workers = getattr(it, "_workers", None)
        if worker is not None and workers and worker < len(workers):
            pid = getattr(workers[worker], "pid", None)
        who = (f"worker {worker}" + (f" (pid {pid})" if pid else "")) if worker is not None \
            else "its workers"
        return (f"no batch from the {self.name} loader for {self.loader.timeout:.0f} s (waiting "
                f"on {who}); a worker is stuck or too slow. Raise data.timeout_s (0 disables the "
                "watchdog) if batches legitimately take this long")


class DataLoaderTimeout(DataError):
    """No batch arrived from a loader's workers within ``data.timeout_s``."""
