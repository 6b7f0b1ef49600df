"""Children of the trainer ignore the stop signals the trainer handles (SIGINT, SIGTERM).

A terminal's Ctrl-C sends SIGINT to the whole foreground process group, and schedulers and
``timeout`` send SIGTERM to the group: data-loader workers and subprocess teachers receive the
signal at the same moment as the trainer. The trainer finishes its step, writes a checkpoint and
exits with 128 + the signal (:class:`xdistill.train.lifecycle.StopSignals`); a child that died of the
signal instead took the run down with it (``DataLoader worker ... is killed by signal:
Terminated``; ``ConnectionResetError`` in ``rebuild_storage_fd``; a dead teacher), and no
checkpoint was written.

* :func:`held` (parent, around starting children): blocks the stop signals in the calling thread.
  A forked child inherits the blocked mask and a spawned one keeps it through ``exec``, so a
  child cannot die of a stop signal before it calls :func:`ignore_stop_signals` (a spawned
  teacher spends seconds importing torch first). The parent's own pending signal is delivered when
  the block ends.
* :func:`ignore_stop_signals` (child, first thing): keeps the signals blocked and consumes them on
  a daemon thread (``sigwaitinfo``). A SIGTERM sent by the parent itself (``Process.terminate()``:
  multiprocessing's exit clean-up of daemon children, torch's last-resort kill of a stuck loader
  worker) still ends the child at once, as torch's own worker handler does; every other SIGINT or
  SIGTERM is dropped. The children still end with the trainer: loader workers watch their parent,
  a teacher host exits when its pipe closes.

:func:`worker_init` is the ``worker_init_fn`` of the training loaders
(:func:`xdistill.data.loader.stateful_loader`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_GUARD: list = []   # the guard thread of this process (at most one)


@contextlib.contextmanager
def held():
    """Block SIGINT and SIGTERM in the calling thread for the ``with`` body (children started
    inside inherit the block); the previous mask is restored afterwards."""
    if not hasattr(signal, "pthread_sigmask"):   # pragma: no cover - not POSIX
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def ignore_stop_signals() -> None:
    """In a child of the trainer: drop SIGINT/SIGTERM from anyone but the parent (module doc).
    Idempotent; call it from the child's main thread before it starts other threads."""
    if _GUARD and _GUARD[0][0] == os.getpid():
        return
    if not hasattr(signal, "sigwaitinfo"):   # pragma: no cover - not Linux/BSD
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    parent = os.getppid()
    thread = threading.Thread(target=_drop_stop_signals, args=(parent,), daemon=True,
                              name="xdistill-stop-signals")
    _GUARD[:] = [(os.getpid(), thread)]
    thread.start()


def _drop_stop_signals(parent: int) -> None:
    while True:
        info = signal.sigwaitinfo(STOP_SIGNALS)
        if info.si_signo == signal.SIGTERM and info.si_pid == parent:
            os._exit(0)   # the parent's terminate(): end now, like torch's worker SIGTERM handler


def worker_init(worker_id: int) -> None:
    """``worker_init_fn`` of the training loaders: the worker ignores the trainer's stop signals."""
    ignore_stop_signals()
