"""Float32 attention for a 16-bit student on a CPU (xdistill/student/attention.py).

References: attention from its definition in float64 (softmax(q k^T / sqrt(d) + causal mask) v);
the float32 ``sdpa`` path itself (on float32 inputs the upcast is the identity, so the two must be
bitwise equal). No GPU here: the device rule is tested on ``torch.device("cuda")`` objects only.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
from torch import nn

from xdistill.distributed import DistEnv
from xdistill.student.attention import (FLOAT32_SDPA, float32_sdpa_forward, register_float32_sdpa,
                                        use_float32_attention, wants_float32_attention)
from xdistill.student.build import build_student
from xdistill.student.config import StudentConfig
from xdistill.student.model import build_causal_lm

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)
CPU_ENV = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)


def reference_attention(q, k, v):
    """Causal attention from the definition in float64; q, k, v [B, H, T, D]."""
    q, k, v = q.double(), k.double(), v.double()
    T = q.shape[2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


def _qkv(dtype, B=2, H=4, T=24, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g).to(dtype).requires_grad_() for _ in range(3)]


class _Module(nn.Module):   # what transformers' sdpa reads from the attention module
    is_causal = True
    num_key_value_groups = 1


def test_float32_sdpa_matches_the_definition_better_than_bf16_sdpa():
    q, k, v = _qkv(torch.bfloat16)
    ref = reference_attention(q, k, v).detach()
    out, _ = float32_sdpa_forward(_Module(), q, k, v, None, is_causal=True)
    assert out.dtype == torch.bfloat16
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    err_f32 = float((out.detach().double() - ref.transpose(1, 2)).abs().max())  # sdpa returns [B, T, H, D]
    err_bf16 = float((plain.detach().double() - ref).abs().max())
    assert err_f32 <= 2 ** -7 * float(ref.abs().max())  # the output's bf16 rounding only
    assert err_f32 <= err_bf16


def test_float32_sdpa_gradients_match_the_definition():
    q, k, v = _qkv(torch.bfloat16, seed=1)
    out, _ = float32_sdpa_forward(_Module(), q, k, v, None, is_causal=True)
    g_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(out.dtype)
    got = torch.autograd.grad(out, (q, k, v), g_out)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference_attention(q64, k64, v64).transpose(1, 2)
    want = torch.autograd.grad(ref, (q64, k64, v64), g_out.double())
    for a, b in zip(got, want):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a.double(), b, rtol=3e-2, atol=3e-2)


def test_float32_model_is_bitwise_unchanged():
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(3))
    plain = build_causal_lm("llama", TINY, seed=5, attn_implementation="sdpa")
    upcast = build_causal_lm("llama", TINY, seed=5, attn_implementation=FLOAT32_SDPA)
    assert upcast.config._attn_implementation == FLOAT32_SDPA
    assert torch.equal(plain(input_ids=ids).logits, upcast(input_ids=ids).logits)


@pytest.mark.parametrize("setting,current,dtype,device,want", [
    ("", "sdpa", torch.bfloat16, "cpu", True),
    ("", "sdpa", torch.float16, "cpu", True),
    ("", "sdpa", torch.float32, "cpu", False),           # nothing to gain
    ("", "sdpa", torch.bfloat16, "cuda", False),         # fast bf16 attention kernels there
    ("sdpa", "sdpa", torch.bfloat16, "cpu", False),      # an explicit setting wins
    ("eager", "eager", torch.bfloat16, "cpu", False),
    ("", "eager", torch.bfloat16, "cpu", False),         # a model without sdpa keeps its own
])
def test_when_the_student_gets_float32_attention(setting, current, dtype, device, want):
    assert wants_float32_attention(setting, current, dtype, torch.device(device)) is want


def test_bf16_student_on_cpu_gets_float32_attention_and_logs_it(caplog):
    cfg = StudentConfig(model_type="llama", model_config=dict(TINY), param_dtype="bfloat16")
    with caplog.at_level(logging.INFO, logger="xdistill.student.attention"):
        model = build_student(cfg, CPU_ENV, torch.device("cpu"))
    assert model.config._attn_implementation == FLOAT32_SDPA
    assert any(FLOAT32_SDPA in r.getMessage() for r in caplog.records)
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(4))
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    assert out.logits.dtype == torch.bfloat16
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("overrides,want", [
    ({"param_dtype": "float32"}, "sdpa"),
    ({"param_dtype": "bfloat16", "attn_implementation": "eager"}, "eager"),
    ({"param_dtype": "bfloat16", "attn_implementation": "sdpa"}, "sdpa"),
])
def test_other_students_keep_their_attention(overrides, want):
    cfg = StudentConfig(model_type="llama", model_config=dict(TINY), **overrides)
    model = build_student(cfg, CPU_ENV, torch.device("cpu"))
    assert model.config._attn_implementation == want


def test_generation_with_a_cache_works_through_float32_attention():
    model = build_causal_lm("llama", TINY, seed=6, dtype=torch.bfloat16).eval()
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(7))
    want = model.generate(input_ids=ids, max_new_tokens=6, do_sample=False)
    assert use_float32_attention(model, "", torch.bfloat16, "cpu")
    got = model.generate(input_ids=ids, max_new_tokens=6, do_sample=False)
    assert got.shape == want.shape
    # float32 attention rounds differently from bf16 attention; greedy tokens mostly agree
    assert float((got == want).float().mean()) > 0.8


def test_register_is_idempotent():
    assert register_float32_sdpa() == register_float32_sdpa() == FLOAT32_SDPA
