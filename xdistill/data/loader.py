"""Build the resumable, sharded training DataLoader (torchdata's StatefulDataLoader).

``build_loader(cfg, student, teachers)`` wires a :class:`DocumentSource`, a :class:`PackedDataset`
(rank- and worker-sharded, lazily packed) and a :class:`CrossTokenizerCollator` (run inside the
workers) into a ``StatefulDataLoader``. Its ``state_dict()`` (one packing position per worker) goes
into the training checkpoint; ``load_state_dict()`` on a new loader with the same config, rank
count and worker count resumes with exactly the batches that were not yet consumed.
"""

from __future__ import annotations

import threading
import time
import warnings

import torch
import torch.distributed as dist

from xdistill import child_signals
from xdistill.data.collator import CrossTokenizerCollator, TeacherTokenization
from xdistill.data.config import DataConfig
from xdistill.data.dataset import PackedDataset
from xdistill.data.source import DocumentSource
from xdistill.errors import ConfigError, DataError, XDistillError
from xdistill.log import get_logger, rank

log = get_logger("data")


def _dist_position(rank, world_size) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)

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
                         loss_roles=cfg.loss_roles, end_of_turn=cfg.end_of_turn_loss,
                         specials_as_text=cfg.specials_as_text)


def build_collator(cfg: DataConfig, student, teachers: list[TeacherTokenization]) -> CrossTokenizerCollator:
    return CrossTokenizerCollator(student, teachers, chunks=cfg.chunks, method=cfg.align_method,
                                  loss_roles=cfg.loss_roles, end_of_turn=cfg.end_of_turn_loss,
                                  specials_as_text=cfg.specials_as_text,
                                  pad_to_multiple_of=cfg.pad_to_multiple_of)


_LOADER_CLASS: list = []


def _loader_class():
    """``StatefulDataLoader`` whose worker processes start with the stop signals held (see
    :mod:`xdistill.child_signals`); built on first use, so importing this module stays light."""
    if not _LOADER_CLASS:
        # deferred: torchdata (~1 s import on top of torch; built on first use)
        from torchdata.stateful_dataloader import StatefulDataLoader

        class SignalSafeLoader(StatefulDataLoader):
            def _get_iterator(self):
                with child_signals.held():   # workers start here, with SIGINT/SIGTERM blocked
                    return super()._get_iterator()

            def load_state_dict(self, state_dict):
                _check_worker_mode(state_dict, self.num_workers)
                super().load_state_dict(state_dict)

        _LOADER_CLASS.append(SignalSafeLoader)
    return _LOADER_CLASS[0]


def _check_worker_mode(state: dict, num_workers: int) -> None:
    """A clear error when a loader state from worker processes meets ``num_workers: 0`` or the
    reverse (torchdata only asserts on a missing key when the iterator starts)."""
    if not state:
        return
    saved_workers = "_snapshot" in state
    if saved_workers != (num_workers > 0):
        saved = "with worker processes" if saved_workers else "with num_workers: 0"
        raise DataError(f"cannot resume data state saved {saved} into a loader with "
                        f"num_workers: {num_workers}: keep ranks, num_workers, seed and data "
                        "unchanged")


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

    return "spawn" if torch.cuda.is_initialized() else "fork"


def describe_loader(loader) -> str:
    """What a training loader reads and how, for the start-up log (rank 0)."""
    ds = loader.dataset
    source = getattr(ds, "source", None)
    files = getattr(source, "files", [])
    parts = [f"{len(source):,} documents" if source is not None else "documents"]
    if files:
        parts[0] += f" in {len(files)} file(s) under {files[0].parent}"
    if hasattr(ds, "window_len"):
        parts.append(f"batches of {loader.batch_size} x {ds.window_len} tokens")
    workers = loader.num_workers
    ctx = loader.multiprocessing_context
    how = getattr(ctx, "get_start_method", lambda: None)() if ctx is not None else None
    parts.append(f"{workers} worker process(es)" + (f" ({how})" if how else "") if workers
                 else "loaded in the training process")
    return ", ".join(parts)


class WatchedIterator:
    """``next()`` over a loader with one-line errors and a word while the first batch is late.

    With ``num_workers > 0`` and ``timeout`` set, torch raises a bare ``RuntimeError`` when no
    batch arrives in time; this names the loader, the worker the batch was expected from and the
    config key to change. An :class:`~xdistill.errors.XDistillError` raised in a worker arrives as
    its own one-line message (:func:`unwrap_worker_error`). Until the first batch arrives, a line
    is logged every ``heartbeat_s`` seconds (the first run compiles the aligner, ~30 s).
    Every other error passes through unchanged.
    """

    def __init__(self, loader, name: str = "data", heartbeat_s: float = 10.0):
        self.loader, self.name, self.heartbeat_s = loader, name, heartbeat_s
        self._first = True
        try:
            self._it = iter(loader)   # workers start; one that fails to restore its state raises
        except XDistillError as exc:
            raise unwrap_worker_error(exc) from None

    def __iter__(self):
        return self

    def __next__(self):
        if self._first:
            self._first = False
            with _Heartbeat(f"waiting for the first batch of the {self.name} loader",
                            self.heartbeat_s):
                return self._next()
        return self._next()

    def _next(self):
        try:
            return next(self._it)
        except XDistillError as exc:
            raise unwrap_worker_error(exc) from None
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


def unwrap_worker_error(exc: XDistillError) -> XDistillError:
    """The error a loader worker raised, as its own one-line message.

    torch re-raises a worker's exception in the training process as the same class, built from
    ``"Caught DataError in DataLoader worker process 0.\nOriginal Traceback ..."``: 17-32 lines
    with the message at the bottom. The message is recovered from that text (the last
    ``<module>.<class>: `` line of the worker's traceback); other errors are returned as they are.
    """
    text = str(exc)
    if "in DataLoader worker process" not in text or "Original Traceback" not in text:
        return exc
    cls = type(exc)
    marker = f"{cls.__module__}.{cls.__qualname__}: "
    at = text.rfind(marker)
    if at < 0:
        return exc
    try:
        return cls(text[at + len(marker):].strip())
    except Exception:   # noqa: BLE001 - a subclass with another constructor: keep the original
        return exc


class _Heartbeat:
    """Logs ``what`` with the seconds waited every ``every`` seconds until the block ends (rank 0;
    then one line with the total, when it logged at all)."""

    def __init__(self, what: str, every: float):
        self.what, self.every = what, every
        self._done = threading.Event()
        self._beats = 0

    def _run(self, t0: float) -> None:
        while not self._done.wait(self.every):
            self._beats += 1
            log.info("%s: %.0f s", self.what, time.monotonic() - t0)

    def __enter__(self):
        self._t0 = time.monotonic()
        self._thread = None
        if self.every > 0 and rank() == 0:
            self._thread = threading.Thread(target=self._run, args=(self._t0,), daemon=True,
                                            name="xdistill-heartbeat")
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread is not None:   # its last line (if any) before the total
            self._thread.join()
        if self._beats and exc[0] is None:
            log.info("%s: done after %.1f s", self.what, time.monotonic() - self._t0)


class DataLoaderTimeout(DataError):
    """No batch arrived from a loader's workers within ``data.timeout_s``."""
