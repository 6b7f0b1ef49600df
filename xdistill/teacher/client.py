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

import functools
import signal
import time
import traceback
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout

import numpy as np
import torch

from xdistill.child_signals import held
from xdistill.errors import TeacherError, XDistillError
from xdistill.teacher.config import TeacherConfig
from xdistill.teacher.host import RayHost, subprocess_main
from xdistill.teacher.served import ServedTeacher
from xdistill.teacher.transport import SlotRing, TeacherLease, choose_transport, make_reader
from xdistill.teacher.worker import TeacherRequest, TeacherWorker, make_output

_POLL_S = 0.05


def teacher_error(message: str, worker_traceback: str | None = None) -> TeacherError:
    """A TeacherError whose message ends with the worker's traceback (also kept as an attribute)."""
    text = message if not worker_traceback else f"{message}\n--- worker traceback ---\n" \
                                                  f"{worker_traceback.rstrip()}"
    err = TeacherError(text)
    err.worker_traceback = worker_traceback
    return err


def _describe_exit(code) -> str:
    if code is None:
        return "is unreachable"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


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


class _RemoteClient(TeacherClient):
    """Shared logic of subprocess and Ray teachers: slots, replies, leases."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reader = None
        self._pending: dict[int, int] = {}   # step -> slot
        self._replies: dict[int, tuple] = {}  # step -> ("ok", reply) | ("error", step, tb)
        self.pid = None

    def _where(self) -> str:
        return f"teacher {self.name!r} ({self.placement} pid {self.pid})"

    def submit(self, view) -> int:
        self._check_usable()
        request = self._request(view)
        slot = self._ring.acquire()
        try:
            self.reader.wait_reusable(slot)
            self._send(slot, request.step, request.input_ids_BTt.detach().cpu().long().numpy(),
                       request.attention_mask_BTt.detach().cpu().numpy())
        except BaseException:
            self._ring.release(slot)
            raise
        self._next_step += 1
        self._pending[request.step] = slot
        return request.step

    def collect(self, step: int, timeout: float | None = None) -> TeacherLease:
        if step not in self._pending:
            raise TeacherError(f"teacher {self.name!r}: step {step} was not submitted")
        self._check_usable()
        timeout = self.config.timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while step not in self._replies:
            self._receive_one(step, deadline, timeout)
        slot = self._pending.pop(step)
        msg = self._replies.pop(step)
        if msg[0] == "error":
            self._ring.release(slot)
            first = msg[2].strip().splitlines()[-1]
            raise teacher_error(f"{self._where()} raised on request {step}: {first}", msg[2])
        reply = msg[1]
        try:
            tensors = self.reader.read(slot, reply["meta"])
        except BaseException:
            self._ring.release(slot)
            raise
        output = make_output(self.info, step, tensors)
        return TeacherLease(output, functools.partial(self._release, slot))

    def _release(self, slot: int) -> None:
        if self.reader is not None:
            self.reader.release(slot)
        self._ring.release(slot)

    def _store(self, msg: tuple) -> None:
        if msg[0] == "ok":
            self._replies[msg[1]["step"]] = msg
        elif msg[0] == "error":
            self._replies[msg[1]] = msg
        else:
            raise self._fail(f"{self._where()} sent an unexpected message {msg[0]!r}")

    def _send(self, slot, step, ids, mask) -> None:
        raise NotImplementedError

    def _receive_one(self, step: int, deadline: float, timeout: float) -> None:
        raise NotImplementedError


class SubprocessClient(_RemoteClient):
    """The engine runs in a spawned ``torch.multiprocessing`` process on this node."""

    placement = "subprocess"

    def start(self) -> None:
        ctx = torch.multiprocessing.get_context("spawn")
        self.transport = choose_transport(self.config.transport, "subprocess", self.config.device)
        self._conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=subprocess_main, daemon=True,
                                name=f"xdistill-teacher-{self.name}",
                                args=(child, self.engine_factory, self.transport,
                                      self.config.slots, self.config.num_threads))
        with held():   # the child ignores the trainer's stop signals from its first instruction
            self.proc.start()
        child.close()
        self._sender = ThreadPoolExecutor(1, thread_name_prefix=f"xdistill-teacher-{self.name}-send")
        self._sends: list = []   # futures of queued requests, oldest first
        self.pid = self.proc.pid
        self.reader = make_reader(self.transport)

    def wait_ready(self):
        if self.info is not None:
            return self.info
        deadline = time.monotonic() + self.config.startup_timeout_s
        msg = self._recv(deadline, self.config.startup_timeout_s, "to start")
        if msg[0] != "ready":
            self._kill()
            first = msg[2].strip().splitlines()[-1]
            raise self._fail_tb(f"{self._where()} failed to start: {first}", msg[2])
        self.info = msg[1]
        return self.info

    def _fail_tb(self, message: str, tb: str) -> TeacherError:
        self._broken = message
        return teacher_error(message, tb)

    def _send(self, slot, step, ids, mask) -> None:
        """Queue the request on the sender thread: a request larger than the pipe's buffer
        blocks in ``send`` until the worker reads it, and a hung worker never does, so the
        blocking write happens there and ``collect``'s timeout still applies. Copies of the
        arrays travel: the caller may reuse its tensors once ``submit`` returns."""
        self._check_sent()
        msg = ("forward", slot, step, np.array(ids, copy=True), np.array(mask, copy=True))
        self._sends.append(self._sender.submit(self._conn.send, msg))

    def _check_sent(self) -> None:
        """Raise the error of a failed send (the worker is gone); forget finished sends."""
        while self._sends and self._sends[0].done():
            exc = self._sends.pop(0).exception()
            if isinstance(exc, (BrokenPipeError, EOFError, OSError)):
                raise self._died() from exc
            if exc is not None:
                raise self._fail(f"{self._where()}: sending a request failed: "
                                 f"{type(exc).__name__}: {exc}") from exc

    def _died(self) -> TeacherError:
        self.proc.join(1.0)
        err = self._fail(f"{self._where()} {_describe_exit(self.proc.exitcode)}")
        if self.reader is not None:
            self.reader.forget_worker(self.pid)
        return err

    def _recv(self, deadline: float, timeout: float, what: str) -> tuple:
        """Next message, or TeacherError when the worker dies or ``deadline`` passes."""
        while True:
            remaining = deadline - time.monotonic()
            self._check_sent()
            try:
                if self._conn.poll(max(0.0, min(_POLL_S, remaining))):
                    return self._conn.recv()
            except (EOFError, OSError):
                raise self._died() from None
            if not self.proc.is_alive():
                if self._conn.poll(0):  # it answered, then exited
                    continue
                raise self._died()
            if remaining <= 0:
                self._kill()
                raise self._fail(f"{self._where()} did not answer {what} within {timeout:g} s "
                                 "(hung?); the worker was killed")

    def _receive_one(self, step: int, deadline: float, timeout: float) -> None:
        self._store(self._recv(deadline, timeout, f"request {step}"))

    def _kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5.0)
        if self.reader is not None:
            self.reader.forget_worker(self.pid)

    def close(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is None:
            return
        if proc.is_alive():
            # behind any queued request, so the worker reads it after them
            closing = self._sender.submit(self._conn.send, ("close",))
            try:
                closing.result(timeout=10.0)
                proc.join(10.0)
            except (FutureTimeout, BrokenPipeError, OSError):
                pass
        self._kill()     # a send still blocked on a dead worker's pipe now fails
        self._sender.shutdown(wait=True)
        self._conn.close()
        if self.reader is not None:
            self.reader.close()
        self.proc = None
        self._broken = self._broken or "closed"


class RayClient(_RemoteClient):
    """The engine runs in a Ray actor (``config.ray`` resources; ``ray.init`` is the caller's)."""

    placement = "ray"

    def __init__(self, *args, scheduling_strategy=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.scheduling_strategy = scheduling_strategy
        self.actor = None
        self._refs: dict[int, object] = {}

    def _options(self) -> dict:
        r = self.config.ray
        opts = {"num_cpus": r.num_cpus, "num_gpus": r.num_gpus, "max_restarts": 0,
                "resources": dict(r.resources)}
        if self.scheduling_strategy is not None:
            opts["scheduling_strategy"] = self.scheduling_strategy
        elif r.node_id:
            # deferred: ray (optional extra `ray`)
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(r.node_id, soft=False)
        return opts

    def start(self) -> None:
        # deferred: ray (optional extra `ray`)
        import ray

        if not ray.is_initialized():
            raise TeacherError(f"teacher {self.name!r} has placement 'ray' but Ray is not "
                               "initialised; call ray.init(...) first")
        self.actor = ray.remote(**self._options())(RayHost).remote()
        deadline = time.monotonic() + self.config.startup_timeout_s
        node = self._get(self.actor.node_id.remote(), deadline, self.config.startup_timeout_s,
                         "to start")
        same = node == ray.get_runtime_context().get_node_id()
        self.transport = choose_transport(self.config.transport, "ray", self.config.device, same)
        self.reader = make_reader(self.transport)
        self._setup_ref = self.actor.setup.remote(self.engine_factory, self.transport,
                                                  self.config.slots, self.config.num_threads)

    def wait_ready(self):
        if self.info is not None:
            return self.info
        msg = self._get(self._setup_ref, time.monotonic() + self.config.startup_timeout_s,
                        self.config.startup_timeout_s, "to load its model")
        if msg[0] != "ready":
            first = msg[2].strip().splitlines()[-1]
            self._broken = f"{self._where()} failed to start: {first}"
            raise teacher_error(self._broken, msg[2])
        self.info = msg[1]
        self.pid = self.info.pid
        return self.info

    def _get(self, ref, deadline: float, timeout: float, what: str):
        # deferred: ray (optional extra `ray`)
        import ray
        # deferred: ray (optional extra `ray`)
        from ray.exceptions import GetTimeoutError, RayActorError, RayError

        try:
            return ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except GetTimeoutError:
            self._kill()
            raise self._fail(f"{self._where()} did not answer {what} within {timeout:g} s "
                             "(hung?); the actor was killed") from None
        except RayActorError as exc:
            if self.reader is not None and self.transport == "shm" and self.pid:
                self.reader.forget_worker(self.pid)
            raise self._fail(f"{self._where()} died: {str(exc).strip().splitlines()[0]}") from None
        except RayError as exc:
            raise self._fail(f"{self._where()} failed: {exc}") from None

    def _send(self, slot, step, ids, mask) -> None:
        self._refs[step] = self.actor.forward.remote(slot, step, ids, mask)

    def _receive_one(self, step: int, deadline: float, timeout: float) -> None:
        ref = self._refs.pop(step)
        self._store(self._get(ref, deadline, timeout, f"request {step}"))

    def _kill(self) -> None:
        # deferred: ray (optional extra `ray`)
        import ray

        if self.actor is not None:
            ray.kill(self.actor, no_restart=True)
        if self.reader is not None and self.transport == "shm" and self.pid:
            self.reader.forget_worker(self.pid)

    def close(self) -> None:
        # deferred: ray (optional extra `ray`)
        import ray

        if self.actor is None:
            return
        if self._broken is None:
            try:
                ray.get(self.actor.close.remote(), timeout=10.0)
            except Exception:
                pass
        self._kill()
        self.actor = None
        if self.reader is not None:
            self.reader.close()
        self._broken = self._broken or "closed"


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
    """The client class for ``config.placement``."""
    cls = {"inprocess": InProcessClient, "subprocess": SubprocessClient,
           "ray": RayClient, "served": ServedClient}[config.placement]
    return cls(config, projection_VsVt, engine_factory, **kwargs)
