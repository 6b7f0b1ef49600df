"""CUDA IPC transport and GPU teachers. Skipped without a CUDA GPU (the development machine has
none, so this file has never run there; see the README).

Legend: B batch, Tt teacher tokens, V vocabulary.
"""

from __future__ import annotations

import functools
import random
import time

import pytest
import torch

from teacher_fakes import StampEngine, random_batch, reference_logits
from xdistill.teacher import (InProcessClient, SubprocessClient, TeacherConfig, TeacherRequest,
                              TeacherWorker)

pytestmark = pytest.mark.gpu


def _req(ids, mask):
    return TeacherRequest(-1, ids, mask)


def test_subprocess_gpu_teacher_over_cuda_ipc_matches_plain_forward(tiny_models):
    ids, mask = random_batch(1000, B=3, Tt=9)
    ref = reference_logits(tiny_models["llama"], ids, mask)
    cfg = TeacherConfig(name="g", model=tiny_models["llama"], placement="subprocess",
                        device="cuda:0", micro_batch_size=2, timeout_s=120)
    with SubprocessClient(cfg) as client:
        assert client.transport == "cuda_ipc"
        for _ in range(3):
            with client.forward(_req(ids, mask)) as lease:
                out = lease.output.logits_BTtV
                assert out.is_cuda
                torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)
        big_ids, big_mask = random_batch(1000, B=6, Tt=20, seed=2)  # slot grows
        with client.forward(_req(big_ids, big_mask)) as lease:
            torch.testing.assert_close(lease.output.logits_BTtV.cpu(),
                                       reference_logits(tiny_models["llama"], big_ids, big_mask),
                                       rtol=1e-4, atol=1e-4)


def test_cuda_ipc_slot_reuse_stress():
    cfg = TeacherConfig(name="stamp", placement="subprocess", device="cuda:0", timeout_s=60)
    factory = functools.partial(StampEngine, "stamp", 4096, 0.0005, -1, 1, "cuda:0")
    rng = random.Random(0)
    with SubprocessClient(cfg, engine_factory=factory) as client:
        assert client.transport == "cuda_ipc"
        reqs = [_req(torch.full((2, 8), i % 50), torch.ones(2, 8, dtype=torch.bool))
                for i in range(1001)]
        nxt = client.submit(reqs[0])
        for i in range(1000):
            cur, nxt = nxt, client.submit(reqs[i + 1])
            with client.collect(cur) as lease:
                x = lease.output.logits_BTtV
                first = x[..., 1:].float().sum()  # queued on the student's stream
                time.sleep(rng.random() * 0.0005)
                assert bool(torch.all(x[..., 1:] == i)), f"step {i} torn or stale"
                assert float(first) == i * x[..., 1:].numel()
        client.collect(nxt).release()


def test_bf16_gpu_teacher_inprocess_with_offload(tiny_models):
    ids, mask = random_batch(1000, B=2, Tt=8)
    ref = reference_logits(tiny_models["llama"], ids, mask)
    cfg = TeacherConfig(name="b", model=tiny_models["llama"], dtype="bfloat16", device="cuda",
                        logits_dtype="bfloat16", offload=True)
    with InProcessClient(cfg) as client:
        assert next(client.engine.model.parameters()).device.type == "cpu"  # offloaded at rest
        with client.forward(_req(ids, mask)) as lease:
            out = lease.output.logits_BTtV
            assert out.is_cuda and out.dtype == torch.bfloat16
            real = mask[:, :, None].expand_as(ref)
            torch.testing.assert_close(out.float().cpu()[real], ref[real], rtol=0.1, atol=0.1)
        assert next(client.engine.model.parameters()).device.type == "cpu"
    worker = TeacherWorker(TeacherConfig(name="w", model=tiny_models["llama"], device="cuda",
                                         output="topk", top_k=8))
    assert worker.forward(_req(ids, mask)).topk_idx_BTtK.is_cuda


@pytest.mark.parametrize("output", ["logits", "topk"])
def test_two_process_handoff_is_bitwise_equal_to_inprocess(tiny_models, output):
    """A teacher in a subprocess on the same GPU hands its outputs over CUDA IPC; they are the
    very bits an in-process teacher on that GPU computes for the same batch (same kernels)."""
    ids, mask = random_batch(900, B=4, Tt=33, seed=5)  # the tiny qwen2 has 900 ids
    kw = dict(model=tiny_models["qwen2"], output=output, top_k=16, micro_batch_size=4)
    with InProcessClient(TeacherConfig(name="a", device="cuda:0", **kw)) as local, \
            SubprocessClient(TeacherConfig(name="b", device="cuda:0", placement="subprocess",
                                           timeout_s=120, **kw)) as remote:
        assert remote.transport == "cuda_ipc"
        for _ in range(2):  # the second round reuses the slots
            with local.forward(_req(ids, mask)) as a, remote.forward(_req(ids, mask)) as b:
                fields = ("logits_BTtV",) if output == "logits" else ("topk_logp_BTtK",
                                                                      "topk_idx_BTtK")
                for f in fields:
                    x, y = getattr(a.output, f), getattr(b.output, f)
                    assert y.is_cuda and x.dtype == y.dtype and x.shape == y.shape
                    assert torch.equal(x, y), f"{f}: max |diff| {(x.float() - y.float()).abs().max()}"


def test_bf16_gpu_teacher_writes_float32_logits_and_auto_picks_bf16(tiny_models, monkeypatch):
    """On CUDA the bf16 head writes float32 logits (torch.mm with out_dtype, or the widened
    bf16 product where torch lacks it); dtype auto picks bf16 on a GPU with native bf16."""
    from xdistill import precision

    ids, mask = random_batch(1000, B=2, Tt=8)
    ref = reference_logits(tiny_models["llama"], ids, mask)
    worker = TeacherWorker(TeacherConfig(name="f", model=tiny_models["llama"], dtype="bfloat16",
                                         device="cuda"))
    assert worker.split is not None
    out = worker.forward(_req(ids, mask)).logits_BTtV
    assert out.is_cuda and out.dtype == torch.float32
    real = mask[:, :, None].expand_as(ref)
    torch.testing.assert_close(out.cpu()[real], ref[real], rtol=0.1, atol=0.1)
    monkeypatch.delenv(precision.ENV_OVERRIDE, raising=False)
    assert precision.resolve_compute_dtype("auto", "cuda", "t") == (
        torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32)
