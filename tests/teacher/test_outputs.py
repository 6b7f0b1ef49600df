"""Output math against slow float64 references written from the definitions.

Legend: N positions, V teacher vocabulary, Vs student vocabulary, K top-k.
"""

from __future__ import annotations

import math

import pytest
import torch

from teacher_fakes import random_projection
from xdistill.teacher.outputs import (LOGP_TINY, output_spec, projection_on_device,
                                      projected_logprobs, topk_logprobs)


def _ref_topk(logits_NV, k, T):
    out_v, out_i, out_tail = [], [], []
    for row in logits_NV.double().tolist():
        z = [x / T for x in row]
        m = max(z)
        lse = m + math.log(sum(math.exp(x - m) for x in z))
        logp = [x - lse for x in z]
        order = sorted(range(len(z)), key=lambda j: -logp[j])[:k]
        out_v.append([logp[j] for j in order])
        out_i.append(order)
        tail = 1.0 - sum(math.exp(logp[j]) for j in order)
        out_tail.append(math.log(tail) if tail > 0 else LOGP_TINY)
    return (torch.tensor(out_v, dtype=torch.float64), torch.tensor(out_i),
            torch.tensor(out_tail, dtype=torch.float64))


@pytest.mark.parametrize("T", [1.0, 2.0, 0.5])
def test_topk_matches_float64_reference(T):
    torch.manual_seed(0)
    logits_NV = torch.randn(7, 50) * 3
    v, i, tail = topk_logprobs(logits_NV, 5, T)
    rv, ri, rtail = _ref_topk(logits_NV, 5, T)
    torch.testing.assert_close(v.double(), rv, rtol=1e-5, atol=1e-5)
    assert torch.equal(i, ri)
    torch.testing.assert_close(tail.double(), rtail, rtol=1e-4, atol=1e-5)
    # top-k mass + tail mass = 1
    total = torch.exp(v.double()).sum(-1) + torch.exp(tail.double())
    torch.testing.assert_close(total, torch.ones(7, dtype=torch.float64), rtol=1e-5, atol=1e-5)


def test_topk_tiny_tail_is_accurate_and_full_k_is_floored():
    logits_NV = torch.tensor([[30.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0]])
    v, i, tail = topk_logprobs(logits_NV, 1, 1.0)
    # tail of row 0 is 3 e^-30 / (1 + 3 e^-30): log ~ log(3) - 30, far below float32 eps of 1
    assert abs(float(tail[0]) - (math.log(3) - 30)) < 1e-3
    _, _, tail_full = topk_logprobs(logits_NV, 4, 1.0)
    assert torch.all(tail_full == LOGP_TINY)


def _ref_projected(logits_NV, proj_VsVt, T):
    W = proj_VsVt.to_dense().double()
    rows = []
    for z in logits_NV.double():
        q = torch.softmax(z / T, dim=-1)[: W.shape[1]]
        m = [sum(float(W[s, t]) * float(q[t]) for t in range(W.shape[1]))
             for s in range(W.shape[0])]
        tot = sum(m)
        rows.append([math.log(x / tot) if x > 0 else LOGP_TINY for x in m])
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("T", [1.0, 1.5])
def test_projected_matches_float64_reference(T):
    torch.manual_seed(1)
    Vt, Vs = 40, 15
    logits_NV = torch.randn(5, Vt + 3) * 2  # 3 padded logit columns beyond the projection
    proj = random_projection(Vs, Vt, seed=3)
    out = projected_logprobs(logits_NV, projection_on_device(proj, "cpu"), T)
    ref = _ref_projected(logits_NV, proj, T)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    # a distribution over the student vocabulary (floored entries carry no mass)
    mass = torch.where(out > LOGP_TINY, out.double().exp(), 0).sum(-1)
    torch.testing.assert_close(mass, torch.ones(5, dtype=torch.float64))


def test_projection_checks():
    with pytest.raises(ValueError, match="negative"):
        projection_on_device(-random_projection(4, 6), "cpu")
    with pytest.raises(ValueError, match="teacher columns"):
        projected_logprobs(torch.randn(2, 5), projection_on_device(random_projection(4, 6), "cpu"),
                           1.0)


def test_output_spec_shapes():
    spec = output_spec("topk", 2, 3, 10, top_k=20)
    assert spec["topk_logp_BTtK"][0] == (2, 3, 10)  # K is capped at V
    assert output_spec("logits", 2, 3, 10, logits_dtype=torch.bfloat16)["logits_BTtV"] == \
        ((2, 3, 10), torch.bfloat16)
    with pytest.raises(ValueError, match="unknown"):
        output_spec("nope", 1, 1, 1)
