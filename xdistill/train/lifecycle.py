"""Run bookkeeping around the loop: the run lock, clean stops, resumed logs, one-line disk errors.

One live run per ``out_dir``, a clean stop on SIGTERM or Ctrl-C, logs without replayed steps
after a resume, and one-line errors for a full disk or an unwritable ``out_dir``.

* :func:`acquire_run_lock` (rank 0): ``<out_dir>/.lock`` held with ``flock`` for the run's life.
  A second live run on the same ``out_dir`` would interleave ``metrics.jsonl`` and overwrite the
  first run's checkpoints and export; it is refused, naming the pid that holds the lock. The
  kernel drops the lock when its process dies, so a killed run leaves no stale lock.
* :class:`StopSignals`: SIGTERM or the first Ctrl-C asks the loop to stop at the next step
  boundary (ranks agree on the step through one all-reduce per step), save a checkpoint and end
  with :class:`RunStopped` (exit code 128 + the signal number, one line, no traceback); a second
  Ctrl-C aborts at once.
* :func:`trim_logs`: a resumed run replays the steps after its checkpoint; the records of those
  steps are dropped from ``metrics.jsonl`` and ``samples_rank<R>.jsonl`` first.
* :func:`io_error`: a failed write of the export (``inline_container.cc ... unexpected pos`` when
  the disk is full, ``OSError``) as one :class:`~xdistill.train.checkpoint.CheckpointError` line
  (a failed checkpoint write: :func:`xdistill.train.checkpoint.write_error`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import threading
from pathlib import Path

from xdistill import distributed as xdist
from xdistill.errors import ConfigError, XDistillError
from xdistill.log import get_logger
from xdistill.metrics import drop_records_after
from xdistill.train.checkpoint import CheckpointError

log = get_logger("train")


class RunStopped(XDistillError):
    """The run stopped on a signal after saving a checkpoint; ``exit_code`` = 128 + signal."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def acquire_run_lock(out_dir: str | os.PathLike):
    """Create ``out_dir`` and lock it for this run (returns the open lock file; keep it open).
    ConfigError naming ``train.out_dir`` when it cannot be written or another run holds it."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        handle = open(out / ".lock", "a+", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"train.out_dir {str(out)!r} is not writable: "
                          f"{exc.strerror or exc}") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise ConfigError(f"train.out_dir {str(out)!r} is in use by another live run (pid "
                          f"{holder}); wait for it to finish or choose another out_dir") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


class StopSignals:
    """SIGTERM / SIGINT handlers for the loop (installed only in the main thread)."""

    def __init__(self):
        self.signum = 0
        self._old: dict = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: abort now
        self.signum = signum
        log.warning("%s received: stopping after this step (a checkpoint is saved first)%s",
                    signal.Signals(signum).name,
                    "; Ctrl-C again to abort" if signum == signal.SIGINT else "")

    def agreed(self) -> int:
        """The signal any rank received (0 = none): every rank stops at the same step."""
        if not xdist.is_distributed():
            return self.signum
        return int(xdist.all_reduce_max(int(self.signum)))


def trim_logs(out_dir: str | os.PathLike, step: int) -> None:
    """Drop the records of steps after ``step`` (being replayed) from this rank's logs."""
    out = Path(out_dir)
    names = [f"samples_rank{xdist.get_rank()}.jsonl"]
    if xdist.is_main_process():
        names.append("metrics.jsonl")
    for name in names:
        dropped = drop_records_after(out / name, step)
        if dropped:
            log.info("%s: %d record(s) of steps after %d set aside in %s.abandoned (replayed on "
                     "resume)", out / name, dropped, step, name)


def io_error(exc: BaseException, what: str) -> CheckpointError | None:
    """A one-line CheckpointError for a failed write of ``what``, or None if ``exc`` is not an
    I/O failure (then it should propagate unchanged)."""
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
        if exc.errno == errno.ENOSPC:
            reason = "no space left on the device"
        return CheckpointError(f"writing {what} failed: {reason}")
    text = str(exc)
    if isinstance(exc, RuntimeError) and any(s in text for s in (
            "unexpected pos", "PytorchStreamWriter", "file write failed", "inline_container")):
        return CheckpointError(f"writing {what} failed (is the disk full?): "
                               f"{text.strip().splitlines()[0][:200]}")
    return None
