"""Review of the teacher-output path (session 24): transports, clients, host, pool, cache, pipeline.

Legend: B batch, Tt teacher tokens, V vocabulary.

Checked and found correct (no test here):

* slot/lease protocol (``transport/base.py``): the training side names only free slots, a slot
  returns to the ring only on ``TeacherLease.release`` (double release refused), the error path of
  ``collect`` and the in-process/served submit failures give their slot back; a worker therefore
  never writes a slot the student holds (also the 1,000-step stress test in test_subprocess.py).
* shm (``transport/shm.py``): growth to a bigger batch creates a new generation whose handle is
  announced once; a smaller/larger Tt reuses or grows the slot with the layout of the reply; a
  generation grown by a request that then raised is announced by the next publish; segments are
  unlinked on a normal ``close`` (writer: current ones, reader: every announced one) and by
  ``forget_worker`` after a kill, a death or a timeout (pid-prefixed glob is exact).
* Ray object store: bf16 carried as int16 and viewed back bitwise; references dropped on release.
* CUDA IPC (read only, no GPU here): event recorded at release and waited for before reuse.
* clients: replies of other steps are stored while collecting one (any collect order works),
  worker exceptions keep the worker serving and carry the traceback, hung workers are killed
  after ``timeout_s`` with "did not answer request N", sends are on a thread so a hung worker
  cannot block ``submit``; ``close`` is bounded.
* pool: remote teachers submitted first, per-teacher steps, failures release the others' leases,
  ``discard`` on a failed submit.
* output cache: the key is the row's ids and mask up to its last attended position (an
  unambiguous byte stream: 9 L bytes), the cache lives in one worker whose teacher, kind,
  temperature, top-k and dtypes are fixed, so those cannot differ between a store and a hit;
  no output field depends on ids beyond L (``token_logp`` at j uses ids[j], j < L).
* pipeline: the same micro-batches in the same order reach the teachers with and without
  lookahead; ``1 + lookahead`` slots are held at most (evaluation between steps finds one free).

Defects, one failing test each:

* ``test_shm_segments_survive_a_training_process_that_exits_without_close``: a training script
  that ends (here: an uncaught exception) without closing its SubprocessClient leaves the
  worker's /dev/shm segment behind: multiprocessing's exit handler ``terminate()`` s the daemon
  worker, whose stop-signal guard (``child_signals._drop_stop_signals``) then ``os._exit(0)`` s
  without unlinking, and the training side has no finaliser. shm.py says only a simultaneous
  kill of both processes can leak.
* ``test_ray_actor_that_fails_to_start_is_not_left_running``: ``with RayClient(...)`` whose
  engine fails to load raises from ``__enter__`` (so ``__exit__`` never runs) and
  ``RayClient.wait_ready`` does not kill the actor (``SubprocessClient.wait_ready`` does): an
  orphan actor keeps its CPUs reserved for the rest of the Ray session.
* ``test_dead_worker_error_names_the_request``: a worker killed mid-request raises "teacher 'x'
  (subprocess pid N) was killed by signal SIGKILL" without the request it was answering,
  unlike the timeout ("did not answer request N") and worker-exception ("raised on request N")
  errors (``SubprocessClient._died`` and ``RayClient._get`` are not given the step);
  ``test_dead_ray_actor_error_names_the_request`` shows the same for a Ray actor.
* ``test_subprocess_that_cannot_be_launched_reports_why_and_closes_cleanly``: when
  ``Process.start()`` raises (an engine factory spawn cannot pickle), ``SubprocessClient.close``
  joins a process that never started (``AssertionError: can only join a started process``), so
  ``TeacherPool.start``'s clean-up raises "closing teachers failed: ... can only join a started
  process" and the real cause survives only as ``__context__``.

Also checked with a scripted trainer loop (no test kept): ``MicroBatchStream`` hands every
micro-batch the remote step of its own submission, in the sequential order, for lookahead 0-3,
over two loaders of different lengths up to exhaustion (partial last step), holding at most
``1 + lookahead`` slots.
"""

from __future__ import annotations

import functools
import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import teacher_fakes
from teacher_fakes import BrokenLoadEngine, SleepEngine, shm_files
from xdistill.errors import TeacherError
from xdistill.teacher import (RayPlacement, SubprocessClient, TeacherConfig, TeacherPool,
                              TeacherRequest)

pytestmark = pytest.mark.integration  # starts processes

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))


def _one():
    ids, mask = torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool)
    return TeacherRequest(-1, ids, mask)


_SCRIPT = textwrap.dedent("""
    import functools
    import torch
    from teacher_fakes import StampEngine
    from xdistill.teacher import SubprocessClient, TeacherConfig, TeacherRequest

    if __name__ == "__main__":
        cfg = TeacherConfig(name="leaky", placement="subprocess", timeout_s=30)
        factory = functools.partial(StampEngine, "leaky", 8, 0.0)
        client = SubprocessClient(cfg, engine_factory=factory)
        client.start()
        client.wait_ready()
        ids, mask = torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool)
        client.forward(TeacherRequest(-1, ids, mask)).release()   # slot 0's segment now exists
        print(client.pid, flush=True)
        raise RuntimeError("the training script failed before closing its teacher")
""")


def test_shm_segments_survive_a_training_process_that_exits_without_close(tmp_path):
    """A training process that ends without ``close`` (uncaught exception) must not leave the
    worker's shared-memory segments in /dev/shm (shm.py: only a simultaneous kill of both
    processes may leak)."""
    script = tmp_path / "train_script.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([_HERE, _ROOT,
                                                       os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert "the training script failed" in proc.stderr, proc.stderr[-2000:]
    pid = int(proc.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.1)   # the worker ends with the training process
    left = shm_files(pid)
    try:
        assert left == [], f"segments of the worker {pid} leaked after the trainer exited: {left}"
    finally:
        for path in glob.glob(f"/dev/shm/xdistill_{pid}_*"):
            os.unlink(path)


def test_dead_worker_error_names_the_request():
    """A worker that dies while answering request N surfaces as one TeacherError naming the teacher
    and the request (as the timeout and worker-exception errors do)."""
    cfg = TeacherConfig(name="victim", placement="subprocess", timeout_s=60)
    _kill_mid_request(SubprocessClient(cfg, engine_factory=functools.partial(SleepEngine, 3.0)),
                      "killed by signal SIGKILL")


def _kill_mid_request(client, pattern: str) -> None:
    """Kill ``client``'s worker while it answers a request: one TeacherError matching
    ``pattern`` that names the teacher and the request."""
    with client:
        client.forward(_one(), timeout=30).release()
        step = client.submit(_one())
        time.sleep(0.3)
        os.kill(client.pid, signal.SIGKILL)   # mid-request
        with pytest.raises(TeacherError, match=pattern) as err:
            client.collect(step)
        assert f"'{client.name}'" in str(err.value)
        assert f"request {step}" in str(err.value), str(err.value)


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("a cluster is already up in this process")
    ray.cloudpickle.register_pickle_by_value(teacher_fakes)  # test engines travel by value
    ray.init(num_cpus=2, object_store_memory=200_000_000, include_dashboard=False,
             log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_actor_that_fails_to_start_is_not_left_running(ray_cluster):
    """``with RayClient(...)`` whose engine cannot load raises TeacherError and leaves no actor
    behind (SubprocessClient kills its worker in the same situation)."""
    from ray.exceptions import RayActorError

    from xdistill.teacher import RayClient

    ray = ray_cluster
    cfg = TeacherConfig(name="broken", placement="ray", num_threads=1,
                        ray=RayPlacement(num_cpus=1))
    client = RayClient(cfg, engine_factory=BrokenLoadEngine)
    with pytest.raises(TeacherError, match="failed to start"):
        with client:
            pass
    actor = client.actor
    if actor is None:   # a fix may drop the handle after killing the actor
        return
    try:
        alive_pid = ray.get(actor.pid.remote(), timeout=30)
    except RayActorError:
        alive_pid = None
    finally:
        ray.kill(actor, no_restart=True)   # clean up for the other tests
    assert alive_pid is None, (f"the actor of teacher 'broken' (pid {alive_pid}) still runs after "
                               "its failed start and holds its CPU")


def test_dead_ray_actor_error_names_the_request(ray_cluster):
    """Same as :func:`test_dead_worker_error_names_the_request` for a Ray actor."""
    from xdistill.teacher import RayClient

    cfg = TeacherConfig(name="rayvictim", placement="ray", num_threads=1, timeout_s=60,
                        ray=RayPlacement(num_cpus=0.25))
    _kill_mid_request(RayClient(cfg, engine_factory=functools.partial(SleepEngine, 2.0)), "died")


def _unpicklable_factory():
    return lambda: None   # a closure: spawn cannot pickle it


def test_subprocess_that_cannot_be_launched_reports_why_and_closes_cleanly():
    """When ``Process.start()`` itself fails (here: the engine factory cannot be pickled for
    spawn), the pool must raise that failure, not a clean-up error, and ``close`` of the client
    must not raise."""
    cfg = TeacherConfig(name="unlaunchable", placement="subprocess")
    with pytest.raises(Exception) as err:
        with TeacherPool([cfg], engine_factories={"unlaunchable": _unpicklable_factory()}):
            pass
    text = f"{type(err.value).__name__}: {err.value}"
    assert "can only join a started process" not in text, text
    assert "pickl" in text.lower(), text

    client = SubprocessClient(cfg, engine_factory=_unpicklable_factory())
    with pytest.raises(Exception, match="(?i)pickl"):
        client.start()
    client.close()   # AssertionError("can only join a started process") today
