"""Teacher clients for other processes: a spawned subprocess or a Ray actor.

:mod:`xdistill.teacher.client` documents their surface and failure rules. Requests go out as slot
numbers plus token ids; outputs come back through the transport's slots."""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import time
import weakref
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout

import numpy as np
import torch

from xdistill.child_signals import held
from xdistill.errors import TeacherError
from xdistill.teacher.client_base import TeacherClient, teacher_error
from xdistill.teacher.host import RayHost, subprocess_main
from xdistill.teacher.transport import TeacherLease, choose_transport, make_reader
from xdistill.teacher.worker import make_output

_POLL_S = 0.05
log = logging.getLogger(__name__)


def _describe_exit(code) -> str:
    if code is None:
        return "is unreachable"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


_DEATH_WAIT_S = 10.0


def _await_death(actor, name: str) -> None:
    """Wait (at most ``_DEATH_WAIT_S``) until a killed Ray actor stops answering.

    ``ray.kill`` only sends the kill: a call made right after it can still be answered, and the
    actor keeps its CPUs and memory until it is gone. Waiting here means a closed or failed
    client has really handed its resources back."""
    # deferred: ray (optional extra `ray`)
    import ray
    # deferred: ray (optional extra `ray`)
    from ray.exceptions import GetTimeoutError, RayError

    deadline = time.monotonic() + _DEATH_WAIT_S
    what = "still answered"
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=max(0.0, deadline - time.monotonic()))
        except GetTimeoutError:
            what = "did not confirm its exit"
            break
        except RayError:
            return          # dead: the kill has landed
        time.sleep(_POLL_S)
    log.warning("teacher %r: its Ray actor %s %g s after ray.kill; it may hold its resources a "
                "while longer", name, what, _DEATH_WAIT_S)


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
        try:
            with held():   # the child ignores the trainer's stop signals from its first instruction
                self.proc.start()
        except Exception as exc:   # e.g. an engine factory that spawn cannot pickle
            self._conn.close()
            self.proc = None
            self._broken = f"{self._where()} could not be launched"
            raise TeacherError(f"{self._broken}: {type(exc).__name__}: {exc}") from exc
        finally:
            child.close()
        self._sender = ThreadPoolExecutor(1, thread_name_prefix=f"xdistill-teacher-{self.name}-send")
        self._sends: list = []   # futures of queued requests, oldest first
        self.pid = self.proc.pid
        self.reader = make_reader(self.transport)
        # a trainer that exits without close(): multiprocessing then terminates the worker, which
        # leaves at once (child_signals) without unlinking its shared memory; this finaliser runs
        # first (atexit order) and unlinks it
        self._finalizer = weakref.finalize(self, _forget_worker, self.reader, self.pid)

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

    def _check_sent(self, what: str = "") -> None:
        """Raise the error of a failed send (the worker is gone); forget finished sends."""
        while self._sends and self._sends[0].done():
            exc = self._sends.pop(0).exception()
            if isinstance(exc, (BrokenPipeError, EOFError, OSError)):
                raise self._died(what) from exc
            if exc is not None:
                raise self._fail(f"{self._where()}: sending a request failed: "
                                 f"{type(exc).__name__}: {exc}") from exc

    def _died(self, what: str = "") -> TeacherError:
        self.proc.join(10.0)   # reaped: its exit code names the cause (slow on a loaded machine)
        err = self._fail(f"{self._where()} {_describe_exit(self.proc.exitcode)}{_during(what)}")
        if self.reader is not None:
            self.reader.forget_worker(self.pid)
        return err

    def _recv(self, deadline: float, timeout: float, what: str) -> tuple:
        """Next message, or TeacherError when the worker dies or ``deadline`` passes."""
        while True:
            remaining = deadline - time.monotonic()
            self._check_sent(what)
            try:
                if self._conn.poll(max(0.0, min(_POLL_S, remaining))):
                    return self._conn.recv()
            except (EOFError, OSError):
                raise self._died(what) from None
            if not self.proc.is_alive():
                if self._conn.poll(0):  # it answered, then exited
                    continue
                raise self._died(what)
            if remaining <= 0:
                self._kill()
                raise self._fail(f"{self._where()} did not answer {what} within {timeout:g} s "
                                 "(hung?); the worker was killed")

    def _receive_one(self, step: int, deadline: float, timeout: float) -> None:
        self._store(self._recv(deadline, timeout, f"request {step}"))

    def _kill(self) -> None:
        if self.proc.pid is None:      # never launched
            return
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
        self._finalizer.detach()   # done here; at exit the pid may be another process's
        self._sender.shutdown(wait=True)
        self._conn.close()
        if self.reader is not None:
            self.reader.close()
        self.proc = None
        self._broken = self._broken or "closed"


# seconds a TCP connect to an explicit Ray address may take before the cluster counts as
# unreachable (Ray's own connection retries take minutes)
RAY_PROBE_TIMEOUT_S = 10.0


def _ray_endpoint(addr: str | None) -> tuple[str, int] | None:
    """(host, port) of an explicit Ray address (``host:port`` or ``ray://host:port``); None for
    ``auto``, ``local``, none, or a form Ray resolves itself."""
    if not addr or addr in ("auto", "local"):
        return None
    rest = addr.split("://", 1)[1] if "://" in addr else addr
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _unreachable(addr: str | None) -> str | None:
    """Why nothing listens at an explicit Ray address, or None (reachable, or not explicit)."""
    endpoint = _ray_endpoint(addr)
    if endpoint is None:
        return None
    try:
        with socket.create_connection(endpoint, timeout=RAY_PROBE_TIMEOUT_S):
            return None
    except OSError as exc:
        return (f"nothing accepts a connection at {endpoint[0]}:{endpoint[1]} within "
                f"{RAY_PROBE_TIMEOUT_S:g} s: {exc.strerror or type(exc).__name__}")


def join_ray(ray, address: str | None, name: str) -> None:
    """``ray.init`` for a ``placement: ray`` teacher when the caller has not initialised Ray:
    ``address`` (``worker.ray.address``), else ``$RAY_ADDRESS``, else ``"auto"`` under torchrun
    (every rank must join one cluster, not start its own), else a local Ray of this process.
    A cluster that cannot be reached is one TeacherError saying how to start one; an explicit
    ``host:port`` is probed first, so that it fails in seconds instead of Ray's minutes of
    retries."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    addr = address or os.environ.get("RAY_ADDRESS") or ("auto" if world > 1 else None)
    why = _unreachable(addr)
    try:
        if why is not None:
            raise ConnectionError(why)
        ray.init(address=addr, ignore_reinit_error=True)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TeacherError(
            f"teacher {name!r} has placement 'ray' and Ray could not be joined at "
            f"{addr or 'a new local instance'} ({first}); start a cluster on this node with "
            "`ray start --head` (under torchrun every rank joins it), or set "
            "worker.ray.address / $RAY_ADDRESS") from None
    log.info("teacher %r: Ray initialised by the trainer (address %s)", name,
             addr or "local instance")


class RayClient(_RemoteClient):
    """The engine runs in a Ray actor (``config.ray`` resources). Ray is joined or started
    (:func:`join_ray`) when the caller has not initialised it."""

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
            join_ray(ray, self.config.ray.address, self.name)
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
            self._kill()     # the actor would otherwise hold its resources for the session
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
            raise self._fail(f"{self._where()} died{_during(what)}: "
                             f"{str(exc).strip().splitlines()[0]}") from None
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
            _await_death(self.actor, self.name)
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


def _forget_worker(reader, pid) -> None:
    """Unlink the shared memory worker ``pid`` made (an exit-time finaliser's body)."""
    if reader is not None and pid:
        reader.forget_worker(pid)


def _during(what: str) -> str:
    """`` while answering request 3`` / `` while waiting for it to start`` (or nothing)."""
    if not what:
        return ""
    return f" while answering {what}" if what.startswith("request") else \
        f" while waiting for it {what}"
