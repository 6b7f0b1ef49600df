"""Subprocess teachers (spawn) over shared memory: equality with an in-process forward, the
1,000-step slot-reuse stress test, raise / kill / hang within the timeout, no leaks.

Legend: B batch, Tt teacher tokens, V vocabulary, Vs student vocabulary, K top-k.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import time

import pytest
import torch

from teacher_fakes import (BrokenLoadEngine, SleepEngine, StampEngine, random_batch,
                           random_projection, reference_logits, shm_files)
from xdistill.errors import TeacherError
from xdistill.teacher import SubprocessClient, TeacherConfig, TeacherPool, TeacherRequest
from xdistill.teacher.outputs import (projected_logprobs, projection_on_device, support_columns,
                                      topk_logprobs)


pytestmark = pytest.mark.integration  # starts processes

def _req(ids, mask):
    return TeacherRequest(-1, ids, mask)


def _one():
    return _req(torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool))


def test_pool_of_subprocess_teachers_matches_inprocess_forward(tiny_models):
    """Four subprocess teachers (logits / top-k / projected / support) plus one in-process teacher of a
    second architecture, all submitted concurrently through a pool."""
    ids, mask = random_batch(1000, B=3, Tt=9, seed=4)
    qids, qmask = random_batch(900, B=2, Tt=5, seed=5)
    proj = random_projection(300, 1000)
    llama = dict(model=tiny_models["llama"], placement="subprocess", micro_batch_size=2,
                 num_threads=1)
    configs = [TeacherConfig(name="full", **llama),
               TeacherConfig(name="top", output="topk", top_k=5, temperature=1.5, **llama),
               TeacherConfig(name="proj", output="projected", **llama),
               TeacherConfig(name="sup", output="support", **llama),
               TeacherConfig(name="qwen", model=tiny_models["qwen2"])]
    views = [_view_like(c.name, ids, mask) for c in configs[:4]] + [_view_like("qwen", qids, qmask)]
    ref_NV = reference_logits(tiny_models["llama"], ids, mask).reshape(-1, 1000)
    support_S = support_columns(proj)
    with TeacherPool(configs, projections={"proj": proj, "sup": proj}) as pool:
        assert {c.transport for c in pool.clients.values()} == {"shm", "inprocess"}
        for _ in range(2):  # second round reuses the mapped slots
            with pool.forward(views) as outs:
                torch.testing.assert_close(outs["full"].logits_BTtV.reshape(-1, 1000), ref_NV,
                                           rtol=1e-5, atol=1e-5)
                v, i, tail = topk_logprobs(ref_NV, 5, 1.5)
                assert outs["top"].temperature == 1.5
                torch.testing.assert_close(outs["top"].topk_logp_BTtK.reshape(-1, 5), v,
                                           rtol=1e-5, atol=1e-5)
                assert torch.equal(outs["top"].topk_idx_BTtK.reshape(-1, 5), i)
                torch.testing.assert_close(outs["top"].tail_logmass_BTt.reshape(-1), tail,
                                           rtol=1e-4, atol=1e-4)
                ref_p = projected_logprobs(ref_NV, projection_on_device(proj, "cpu"), 1.0)
                torch.testing.assert_close(outs["proj"].proj_logp_BTtVs.reshape(-1, 300), ref_p,
                                           rtol=1e-4, atol=1e-4)
                sup = outs["sup"].support_logits_BTtS
                assert outs["sup"].token_logp_BTt is None
                torch.testing.assert_close(sup.reshape(-1, len(support_S)),
                                           ref_NV[:, support_S], rtol=1e-5, atol=1e-5)
                ref_q = reference_logits(tiny_models["qwen2"], qids, qmask)
                torch.testing.assert_close(outs["qwen"].logits_BTtV, ref_q, rtol=1e-5, atol=1e-5)
        pids = [c.pid for c in pool.clients.values() if c.placement == "subprocess"]
        procs = [c.proc for c in pool.clients.values() if c.placement == "subprocess"]
    assert all(not p.is_alive() for p in procs)
    assert all(shm_files(pid) == [] for pid in pids)


def _view_like(name, ids, mask):
    from xdistill.data.batch import TeacherView

    z = torch.zeros_like(ids)
    return TeacherView(name=name, input_ids_BTt=ids, attention_mask_BTt=mask, loss_mask_BTt=mask,
                       s_chunk_BTs=z, t_chunk_BTt=z, chunk_valid_BC=mask, chunk_exact_BC=mask)


def test_1000_step_slot_reuse_has_no_torn_or_stale_reads():
    """Pipelined: step i+1 is being written while the student still reads step i. Random delays
    on both sides; every element must carry the step id, before and after the reader's pause."""
    cfg = TeacherConfig(name="stamp", placement="subprocess", slots=2, timeout_s=30)
    factory = functools.partial(StampEngine, "stamp", 64, 0.0005, 1000 + 7, 1)
    rng = random.Random(0)
    with SubprocessClient(cfg, engine_factory=factory) as client:
        shapes = [(1 + rng.randrange(3), 1 + rng.randrange(8)) for _ in range(1001)]
        reqs = [_req(torch.full(s, i % 50), torch.ones(s, dtype=torch.bool))
                for i, s in enumerate(shapes)]
        nxt = client.submit(reqs[0])
        for i in range(1000):
            cur = nxt
            nxt = client.submit(reqs[i + 1])  # in flight, into the other slot
            with client.collect(cur) as lease:
                out = lease.output
                assert out.step == i
                x = out.logits_BTtV
                assert x.shape == (*shapes[i], 64)
                assert torch.all(x[..., 1:] == i)
                time.sleep(rng.random() * 0.0005)
                assert torch.all(x[..., 1:] == i), f"slot of step {i} overwritten while held"
                assert torch.all(x[..., 0] == (i % 50) + i)
        client.collect(nxt).release()
        # an exception inside the worker carries its traceback, and the worker keeps serving
        with pytest.raises(TeacherError, match="boom from worker at step 1007") as err:
            for _ in range(7):
                client.forward(reqs[0]).release()
        assert "explode_in_worker" in err.value.worker_traceback
        with client.forward(reqs[0]) as lease:
            assert lease.output.step == 1008


def test_killed_worker_raises_within_timeout_and_leaks_nothing():
    cfg = TeacherConfig(name="victim", placement="subprocess", timeout_s=60)
    factory = functools.partial(SleepEngine, 3.0)
    client = SubprocessClient(cfg, engine_factory=factory)
    with client:
        with client.forward(_one(), timeout=10):
            pass  # one step done: the shm segment of slot 0 exists
        assert len(shm_files(client.pid)) == 1
        step = client.submit(_one())
        time.sleep(0.3)
        os.kill(client.pid, signal.SIGKILL)  # mid-step
        t0 = time.monotonic()
        with pytest.raises(TeacherError, match="killed by signal SIGKILL"):
            client.collect(step)
        assert time.monotonic() - t0 < 5.0  # detected, not timed out
        assert shm_files(client.pid) == []
        with pytest.raises(TeacherError, match="unusable after an earlier failure"):
            client.submit(_one())


def test_hung_worker_times_out_and_is_killed():
    cfg = TeacherConfig(name="sleepy", placement="subprocess", timeout_s=1.0)
    with SubprocessClient(cfg, engine_factory=functools.partial(SleepEngine, 1000.0)) as client:
        t0 = time.monotonic()
        with pytest.raises(TeacherError, match=r"did not answer request 0 within 1 s \(hung\?\)"):
            client.forward(_one())
        assert 0.9 < time.monotonic() - t0 < 5.0
        assert not client.proc.is_alive()



def test_a_hung_worker_cannot_block_a_pipelined_submit():
    """A request larger than the pipe's buffer (8 x 4096 ids + mask, ~300 KB) submitted while the
    worker hangs in the previous one: ``submit`` returns at once and ``collect`` fails within the
    timeout (the write to the pipe blocked ``submit`` itself before, for ever)."""
    cfg = TeacherConfig(name="sleepy", placement="subprocess", slots=2, timeout_s=1.0)
    with SubprocessClient(cfg, engine_factory=functools.partial(SleepEngine, 1000.0)) as client:
        first = client.submit(_one())
        big_ids = torch.zeros(8, 4096, dtype=torch.long)
        t0 = time.monotonic()
        second = client.submit(_req(big_ids, torch.ones(8, 4096, dtype=torch.bool)))
        big_ids.fill_(7)   # the caller may reuse its tensors once submit returned
        assert time.monotonic() - t0 < 0.5
        with pytest.raises(TeacherError, match=r"did not answer request 0 within 1 s \(hung\?\)"):
            client.collect(first)
        assert time.monotonic() - t0 < 5.0
        assert not client.proc.is_alive()
        with pytest.raises(TeacherError, match="unusable after an earlier failure"):
            client.collect(second)
    assert client.proc is None   # close() returned: no sender thread left blocked

def test_worker_that_fails_to_load_reports_its_traceback():
    cfg = TeacherConfig(name="broken", placement="subprocess", startup_timeout_s=60)
    client = SubprocessClient(cfg, engine_factory=BrokenLoadEngine)
    client.start()
    with pytest.raises(TeacherError, match="failed to start: RuntimeError: cannot load") as err:
        client.wait_ready()
    assert "teacher_fakes.py" in err.value.worker_traceback
    client.close()
    assert client.proc is None
