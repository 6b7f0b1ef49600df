"""Worker-process side of remote teachers: the host loop of a subprocess and the Ray actor.

Legend: B batch, Tt teacher tokens.

Both wrap one engine (a :class:`~xdistill.teacher.worker.TeacherWorker`, or any object with the
same ``info`` / ``output_spec`` / ``run_into`` contract, built in the worker by a picklable
``engine_factory``) and one :class:`~xdistill.teacher.transport.base.SlotWriter`. A request names
the slot to write (chosen by the training process, which only names free slots); the reply carries
the slot's transport meta. Exceptions never cross as exceptions: the host answers
``("error", step, traceback_text)`` and keeps serving, so the training process can raise a
:class:`~xdistill.errors.TeacherError` that carries the worker's traceback.

Subprocess wire protocol (``multiprocessing`` Pipe, pickled tuples, token ids as numpy so nothing is
routed through torch's shared-memory reductions):

* worker -> parent at start: ``("ready", TeacherInfo)`` or ``("error", -1, traceback)``
* parent -> worker: ``("forward", slot, step, ids_BTt, mask_BTt)`` | ``("close",)``
* worker -> parent: ``("ok", {"step", "slot", "meta"})`` | ``("error", step, traceback)``

The subprocess exits when the pipe closes (the training process died), unlinking its segments.
"""

from __future__ import annotations

import os
import threading
import traceback

import numpy as np
import torch
import tqdm

from xdistill.child_signals import ignore_stop_signals
from xdistill.host_memory import HOST_ALLOCATOR_ENV, apply_host_allocator
from xdistill.teacher.transport import make_writer
from xdistill.teacher.worker import TeacherRequest


class WorkerHost:
    """An engine plus the writer half of a transport, inside the worker process."""

    def __init__(self, engine_factory, transport: str, n_slots: int, num_threads: int = 0):
        if num_threads > 0:
            torch.set_num_threads(num_threads)
        self.engine = engine_factory()
        self.info = self.engine.info
        apply_host_allocator(os.environ.get(HOST_ALLOCATOR_ENV, "auto"), str(self.info.device))
        self.writer = make_writer(transport, n_slots, self.info.device)

    def handle(self, slot: int, step: int, ids_BTt: np.ndarray, mask_BTt: np.ndarray) -> dict:
        request = TeacherRequest(step, torch.from_numpy(ids_BTt), torch.from_numpy(mask_BTt))
        B, Tt = ids_BTt.shape
        out = self.writer.prepare(slot, self.engine.output_spec(B, Tt))
        self.engine.run_into(request, out)
        return {"step": step, "slot": slot, "meta": self.writer.publish(slot)}

    def close(self) -> None:
        self.writer.close()
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()


def _thread_lock_for_progress_bars() -> None:
    """tqdm (the model-loading bars) otherwise creates a multiprocessing lock, a named semaphore
    registered with the trainer's resource tracker: a teacher killed after a timeout never
    unregisters it, and the tracker printed a "leaked semaphore" warning after the error line."""
    try:
        tqdm.tqdm.set_lock(threading.RLock())
    except ImportError:   # pragma: no cover - tqdm is a dependency
        pass


def subprocess_main(conn, engine_factory, transport: str, n_slots: int,
                    num_threads: int = 0) -> None:
    """Entry point of a spawned teacher subprocess (see module doc for the protocol). It ignores
    the trainer's stop signals (:mod:`xdistill.child_signals`): the trainer ends it."""
    ignore_stop_signals()
    _thread_lock_for_progress_bars()
    host = None
    try:
        try:
            host = WorkerHost(engine_factory, transport, n_slots, num_threads)
        except BaseException:
            conn.send(("error", -1, traceback.format_exc()))
            return
        conn.send(("ready", host.info))
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):  # the training process is gone
                return
            if msg[0] == "close":
                return
            _, slot, step, ids, mask = msg
            try:
                reply = ("ok", host.handle(slot, step, ids, mask))
            except Exception:
                reply = ("error", step, traceback.format_exc())
            conn.send(reply)
    finally:
        if host is not None:
            host.close()
        conn.close()


class RayHost:
    """Body of the Ray actor (wrapped with ``ray.remote(...)`` by the client)."""

    def __init__(self):
        self.host = None

    def node_id(self) -> str:
        # deferred: ray (optional extra `ray`)
        import ray

        return ray.get_runtime_context().get_node_id()

    def setup(self, engine_factory, transport: str, n_slots: int, num_threads: int = 0):
        try:
            self.host = WorkerHost(engine_factory, transport, n_slots, num_threads)
        except BaseException:
            return ("error", -1, traceback.format_exc())
        return ("ready", self.host.info)

    def forward(self, slot: int, step: int, ids_BTt, mask_BTt):
        try:
            return ("ok", self.host.handle(slot, step, ids_BTt, mask_BTt))
        except Exception:
            return ("error", step, traceback.format_exc())

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        if self.host is not None:
            self.host.close()
            self.host = None
