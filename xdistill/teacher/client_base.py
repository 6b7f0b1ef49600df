"""The teacher clients' base class (requests, slot ring, leases) and the in-process client.

:mod:`xdistill.teacher.client` documents the surface every client shares and has ``make_client``."""

from __future__ import annotations

import functools
import traceback

import torch

from xdistill.errors import TeacherError, XDistillError
from xdistill.teacher.config import TeacherConfig
from xdistill.teacher.transport import SlotRing, TeacherLease
from xdistill.teacher.worker import TeacherRequest, TeacherWorker, make_output


def teacher_error(message: str, worker_traceback: str | None = None) -> TeacherError:
    """A TeacherError whose message ends with the worker's traceback (also kept as an attribute)."""
    text = message if not worker_traceback else f"{message}\n--- worker traceback ---\n" \
                                                  f"{worker_traceback.rstrip()}"
    err = TeacherError(text)
    err.worker_traceback = worker_traceback
    return err



class TeacherClient:
    """Common base: request bookkeeping, slot ring, leases (see module doc)."""

    placement = "base"

    def __init__(self, config: TeacherConfig, projection_VsVt: torch.Tensor | None = None,
                 engine_factory=None):
        self.config = config.validate()
        self.name = config.name
        self.engine_factory = engine_factory or functools.partial(TeacherWorker, config,
                                                                  projection_VsVt)
        self.info = None
        self.transport = None
        self._next_step = 0
        self._broken: str | None = None
        self._ring = SlotRing(config.slots, config.name)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        raise NotImplementedError

    def wait_ready(self):
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        if self.info is None:
            self.start()
            self.wait_ready()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- requests -----------------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._broken is not None:
            raise TeacherError(f"teacher {self.name!r} is unusable after an earlier failure: "
                               f"{self._broken}")
        if self.info is None:
            raise TeacherError(f"teacher {self.name!r} is not started (call start/wait_ready or "
                               "use it as a context manager)")

    def _request(self, view) -> TeacherRequest:
        step = self._next_step  # consumed (``_next_step += 1``) once the request reaches the engine
        if isinstance(view, TeacherRequest):
            return TeacherRequest(step, view.input_ids_BTt, view.attention_mask_BTt)
        if getattr(view, "name", self.name) != self.name:
            raise TeacherError(f"teacher {self.name!r} got the view of teacher {view.name!r}")
        return TeacherRequest.from_view(step, view)

    def submit(self, view) -> int:
        raise NotImplementedError

    def collect(self, step: int, timeout: float | None = None) -> TeacherLease:
        raise NotImplementedError

    def forward(self, view, timeout: float | None = None) -> TeacherLease:
        """``collect(submit(view))``."""
        return self.collect(self.submit(view), timeout)

    def _fail(self, message: str) -> TeacherError:
        self._broken = message
        return teacher_error(message)


class InProcessClient(TeacherClient):
    """The engine lives in the training process (colocated; optional weight offload)."""

    placement = "inprocess"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.engine = None
        self._done: dict[int, object] = {}

    def start(self) -> None:
        try:
            self.engine = self.engine_factory()
        except TeacherError:
            raise
        except XDistillError as exc:  # a diagnosed error: its message says it all
            raise TeacherError(f"teacher {self.name!r} failed to load: {exc}") from exc
        except Exception as exc:
            raise teacher_error(f"teacher {self.name!r} failed to load: {exc}",
                                traceback.format_exc()) from exc
        self.info, self.transport = self.engine.info, "inprocess"

    def wait_ready(self):
        return self.info

    def submit(self, view) -> int:
        self._check_usable()
        request = self._request(view)
        slot = self._ring.acquire()
        self._next_step += 1
        try:
            B, Tt = request.input_ids_BTt.shape
            out = {n: torch.empty(shape, dtype=dt, device=self.info.device)
                   for n, (shape, dt) in self.engine.output_spec(B, Tt).items()}
            self.engine.run_into(request, out)
        except Exception as exc:
            self._ring.release(slot)
            if isinstance(exc, TeacherError):
                raise
            raise teacher_error(f"teacher {self.name!r} (in-process) raised "
                                f"{type(exc).__name__}: {exc}", traceback.format_exc()) from exc
        self._done[request.step] = (slot, make_output(self.info, request.step, out))
        return request.step

    def collect(self, step: int, timeout: float | None = None) -> TeacherLease:
        if step not in self._done:
            raise TeacherError(f"teacher {self.name!r}: step {step} was not submitted")
        slot, output = self._done.pop(step)
        return TeacherLease(output, functools.partial(self._ring.release, slot))

    def close(self) -> None:
        if self.engine is not None and hasattr(self.engine, "close"):
            self.engine.close()
        self.engine = None
        self._broken = self._broken or "closed"
