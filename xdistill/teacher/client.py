"""Training-process handles of one teacher, whatever its placement.

Every client has the same surface::

    client = make_client(config, projection_VsVt=None)   # In-process/Subprocess/Ray/ServedClient
    client.start(); client.wait_ready()                   # or `with client:`
    step = client.submit(view)                            # TeacherView (or TeacherRequest)
    with client.collect(step) as lease:                   # TeacherLease
        out = lease.output                                # TeacherOutput (views into a slot)
    client.close()

``submit`` sends the request and returns at once (remote placements compute while the student
works); ``collect`` waits at most ``config.timeout_s`` for it. Up to ``config.slots`` outputs may be
outstanding or held; a slot is reused only after its lease is released (see transport/base.py).

Failures raise :class:`~xdistill.errors.TeacherError` within the timeout: an exception in the worker
(message + ``worker_traceback``; the worker keeps serving), a dead worker (exit code / signal; the
client becomes unusable) or a hung worker (killed after the timeout; the client becomes unusable).
In-process teachers run synchronously inside ``submit`` and cannot be timed out.
"""

from __future__ import annotations

import dataclasses
import functools
import traceback
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout

import torch

from xdistill.errors import TeacherError
from xdistill.teacher.client_base import InProcessClient, TeacherClient, teacher_error
from xdistill.teacher.config import TeacherConfig
from xdistill.teacher.remote_client import RayClient, SubprocessClient
from xdistill.teacher.served import ServedTeacher
from xdistill.teacher.transport import TeacherLease
from xdistill.teacher.worker import make_output

__all__ = ["TeacherClient", "InProcessClient", "SubprocessClient", "RayClient", "ServedClient",
           "make_client", "teacher_error"]


class ServedClient(InProcessClient):
    """A completions server (:mod:`xdistill.teacher.served`): ``submit`` hands the batch to a
    background thread that sends its rows, ``collect`` waits for them (at most ``timeout_s``)."""

    placement = "served"

    def __init__(self, config: TeacherConfig, projection_VsVt=None, engine_factory=None):
        if engine_factory is None:
            engine_factory = functools.partial(ServedTeacher, config)
        super().__init__(config, projection_VsVt, engine_factory)
        self._runner = ThreadPoolExecutor(1, thread_name_prefix=f"served-{config.name}")

    def start(self) -> None:
        super().start()
        self.transport = "http"

    def submit(self, view) -> int:
        self._check_usable()
        request, slot = self._request(view), self._ring.acquire()
        self._next_step += 1
        try:
            out = {n: torch.empty(shape, dtype=dt) for n, (shape, dt)
                   in self.engine.output_spec(*request.input_ids_BTt.shape).items()}
            future = self._runner.submit(self.engine.run_into, request, out)
        except BaseException:
            self._ring.release(slot)
            raise
        self._done[request.step] = (slot, out, future)
        return request.step

    def collect(self, step: int, timeout: float | None = None) -> TeacherLease:
        if step not in self._done:
            raise TeacherError(f"teacher {self.name!r}: step {step} was not submitted")
        slot, out, future = self._done.pop(step)
        timeout = self.config.timeout_s if timeout is None else timeout
        try:
            future.result(timeout)
        except BaseException as exc:
            self._ring.release(slot)
            if not isinstance(exc, Exception):   # KeyboardInterrupt, SystemExit: as they are
                raise
            if isinstance(exc, FutureTimeout):
                raise self._fail(f"teacher {self.name!r} (served at {self.config.served.url}) "
                                 f"did not answer request {step} within {timeout:g} s") from None
            if isinstance(exc, TeacherError):
                raise
            raise teacher_error(f"teacher {self.name!r} (served) raised {type(exc).__name__}: "
                                f"{exc}", traceback.format_exc()) from exc
        return TeacherLease(make_output(self.info, step, out),
                            functools.partial(self._ring.release, slot))

    def close(self) -> None:
        self._runner.shutdown(wait=False, cancel_futures=True)
        super().close()


def make_client(config: TeacherConfig, projection_VsVt=None, engine_factory=None,
                **kwargs) -> TeacherClient:
    """The client class for ``config.placement``. A subprocess worker's bare ``"cuda"`` is this
    process's current GPU (the rank's own under torchrun), not the child's default GPU 0."""
    if (config.placement == "subprocess" and config.device == "cuda"
            and torch.cuda.is_available()):
        config = dataclasses.replace(config, device=f"cuda:{torch.cuda.current_device()}")
    cls = {"inprocess": InProcessClient, "subprocess": SubprocessClient,
           "ray": RayClient, "served": ServedClient}[config.placement]
    return cls(config, projection_VsVt, engine_factory, **kwargs)
