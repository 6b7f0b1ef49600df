"""Ray-actor teachers on a local cluster with a bounded object store: equality with a plain
forward over shared memory (auto, same node) and over the object store (override), a raising,
a killed and a hung actor.

Legend: B batch, Tt teacher tokens, V vocabulary, K top-k.
"""

from __future__ import annotations

import functools
import os
import signal
import time

import pytest
import torch

import teacher_fakes
from teacher_fakes import SleepEngine, random_batch, reference_logits, shm_files
from xdistill.errors import TeacherError
from xdistill.teacher import RayClient, RayPlacement, TeacherConfig, TeacherPool, TeacherRequest
from xdistill.teacher.outputs import topk_logprobs

ray = pytest.importorskip("ray")


pytestmark = pytest.mark.integration  # starts processes

@pytest.fixture(scope="module")
def ray_cluster():
    ray.cloudpickle.register_pickle_by_value(teacher_fakes)  # test engines travel by value
    ray.init(num_cpus=2, object_store_memory=1_000_000_000, include_dashboard=False,
             log_to_driver=False)
    yield ray
    ray.shutdown()


def _cfg(name, **kw):
    return TeacherConfig(name=name, placement="ray", num_threads=1,
                         ray=RayPlacement(num_cpus=0.25), **kw)


def _req(ids, mask):
    return TeacherRequest(-1, ids, mask)


def test_ray_teachers_match_plain_forward(ray_cluster, tiny_models):
    ids, mask = random_batch(1000, B=3, Tt=9, seed=7)
    ref_NV = reference_logits(tiny_models["llama"], ids, mask).reshape(-1, 1000)
    model = tiny_models["llama"]
    configs = [_cfg("shm", model=model, micro_batch_size=2),
               _cfg("store", model=model, output="topk", top_k=4, transport="ray"),
               _cfg("store_bf16", model=model, dtype="bfloat16", logits_dtype="bfloat16",
                    transport="ray")]
    with TeacherPool(configs) as pool:
        assert [c.transport for c in pool.clients.values()] == ["shm", "ray", "ray"]
        assert all(c.pid != os.getpid() for c in pool.clients.values())
        views = [_view(c.name, ids, mask) for c in configs]
        for _ in range(2):
            with pool.forward(views) as outs:
                torch.testing.assert_close(outs["shm"].logits_BTtV.reshape(-1, 1000), ref_NV,
                                           rtol=1e-5, atol=1e-5)
                v, i, tail = topk_logprobs(ref_NV, 4, 1.0)
                torch.testing.assert_close(outs["store"].topk_logp_BTtK.reshape(-1, 4), v,
                                           rtol=1e-5, atol=1e-5)
                assert torch.equal(outs["store"].topk_idx_BTtK.reshape(-1, 4), i)
                torch.testing.assert_close(outs["store"].tail_logmass_BTt.reshape(-1), tail,
                                           rtol=1e-4, atol=1e-4)
                assert outs["store_bf16"].logits_BTtV.dtype == torch.bfloat16
                real = mask.reshape(-1)
                torch.testing.assert_close(outs["store_bf16"].logits_BTtV.reshape(-1, 1000)[real]
                                           .float(), ref_NV[real], rtol=0.1, atol=0.1)
        shm = pool.clients["shm"]
        bad = ids.clone()
        bad[2, 1] = 5000
        with pytest.raises(TeacherError, match="token id 5000 at row 2, position 1") as err:
            shm.forward(_req(bad, mask))
        assert "run_into" in err.value.worker_traceback
        with shm.forward(_req(ids, mask)) as lease:  # still serving after the error
            assert lease.output.logits_BTtV.shape == (3, 9, 1000)
        pid = shm.pid
    assert shm_files(pid) == []


def _view(name, ids, mask):
    from xdistill.data.batch import TeacherView

    z = torch.zeros_like(ids)
    return TeacherView(name=name, input_ids_BTt=ids, attention_mask_BTt=mask, loss_mask_BTt=mask,
                       s_chunk_BTs=z, t_chunk_BTt=z, chunk_valid_BC=mask, chunk_exact_BC=mask)


def test_killed_ray_actor_raises_within_timeout(ray_cluster):
    ids, mask = torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.bool)
    client = RayClient(_cfg("victim", timeout_s=60),
                       engine_factory=functools.partial(SleepEngine, 2.0))
    with client:
        client.forward(_req(ids, mask), timeout=20).release()
        assert len(shm_files(client.pid)) == 1
        step = client.submit(_req(ids, mask))
        time.sleep(0.3)
        os.kill(client.pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(TeacherError, match="died"):
            client.collect(step)
        assert time.monotonic() - t0 < 20.0
        assert shm_files(client.pid) == []


def test_hung_ray_actor_times_out(ray_cluster):
    ids, mask = torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.bool)
    client = RayClient(_cfg("sleepy", timeout_s=1.5),
                       engine_factory=functools.partial(SleepEngine, 1000.0))
    with client:
        t0 = time.monotonic()
        with pytest.raises(TeacherError, match=r"did not answer request 0 within 1.5 s"):
            client.forward(_req(ids, mask))
        assert time.monotonic() - t0 < 10.0
        with pytest.raises(TeacherError, match="unusable"):
            client.submit(_req(ids, mask))



@pytest.mark.parametrize("address, env, world, expected", [
    (None, None, "1", None),                        # one process: a local Ray of its own
    (None, None, "2", "auto"),                      # torchrun: every rank joins one cluster
    (None, "10.0.0.5:6379", "2", "10.0.0.5:6379"),  # $RAY_ADDRESS
    ("ray://head:10001", "10.0.0.5:6379", "2", "ray://head:10001")])   # worker.ray.address wins
def test_ray_teacher_joins_the_cluster_its_config_and_launch_imply(monkeypatch, address, env,
                                                                   world, expected):
    """``join_ray`` (a ``placement: ray`` teacher whose caller has not initialised Ray, as in
    every ``xdistill train`` run) picks the address; a stand-in ``ray.init`` records it (a real
    ``auto`` would find the Ray this test session initialised for the actors above)."""
    from xdistill.teacher import remote_client
    from xdistill.teacher.remote_client import join_ray

    calls = []
    fake = type("FakeRay", (), {"init": staticmethod(lambda **kw: calls.append(kw))})
    monkeypatch.setattr(remote_client, "_unreachable", lambda addr: None)  # no such hosts here
    monkeypatch.setenv("WORLD_SIZE", world)
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    join_ray(fake, address, "big")
    assert calls == [{"address": expected, "ignore_reinit_error": True}]


def test_ray_teacher_without_a_reachable_cluster_is_one_clear_error(monkeypatch):
    """No cluster where one must be joined: Ray's ConnectionError (its words for ``auto`` with
    nothing running, raised here by a stand-in: a real unreachable address makes Ray retry for
    minutes) becomes one TeacherError naming the teacher and how to start a cluster."""
    from xdistill.teacher.remote_client import join_ray

    def init(**kw):
        raise ConnectionError("Could not find any running Ray instance. Please specify the one "
                              "to connect to by setting `--address` flag or `RAY_ADDRESS`.")

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(TeacherError) as info:
        join_ray(type("FakeRay", (), {"init": staticmethod(init)}), None, "big")
    msg = str(info.value)
    assert msg.startswith("teacher 'big' has placement 'ray'") and "at auto" in msg
    assert "Could not find any running Ray instance" in msg and "ray start --head" in msg


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_ray_teacher_with_an_explicit_address_nobody_listens_on_fails_at_once(monkeypatch,
                                                                              scheme):
    """``worker.ray.address`` (or ``$RAY_ADDRESS``) naming a port nothing listens on: one
    TeacherError naming the address within seconds, and Ray is never asked (its own connection
    retries take minutes); a port that accepts connections goes on to ``ray.init``."""
    import socket
    import time

    from xdistill.teacher.remote_client import _ray_endpoint, join_ray

    with socket.socket() as s:            # a free local port, closed again: nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    calls = []
    fake = type("FakeRay", (), {"init": staticmethod(lambda **kw: calls.append(kw))})
    monkeypatch.setenv("WORLD_SIZE", "1")
    t0 = time.perf_counter()
    with pytest.raises(TeacherError) as info:
        join_ray(fake, f"{scheme}127.0.0.1:{port}", "big")
    assert time.perf_counter() - t0 < 5 and calls == []
    msg = str(info.value)
    assert f"at {scheme}127.0.0.1:{port}" in msg and "nothing accepts a connection" in msg
    assert "ray start --head" in msg
    with socket.socket() as server:       # a listening port: the probe passes, Ray is asked
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        address = f"{scheme}127.0.0.1:{server.getsockname()[1]}"
        join_ray(fake, address, "big")
    assert calls == [{"address": address, "ignore_reinit_error": True}]
    assert _ray_endpoint("auto") is None and _ray_endpoint(None) is None
    assert _ray_endpoint("[::1]:6379") == ("::1", 6379)
