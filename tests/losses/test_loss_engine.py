"""Numerical helpers of the chunking engine: -inf safety of log-space primitives, gradients."""

from __future__ import annotations

import math

import torch

from xdistill.losses.engine import (log1mexp, log_softmax_safe, row_block_sum, safe_logsumexp,
                                    token_logprobs)


def test_log_softmax_safe_with_dead_rows_has_finite_gradients():
    z = torch.tensor([[0.0, 1.0, -math.inf], [-math.inf] * 3], requires_grad=True)
    out = log_softmax_safe(z)
    assert torch.allclose(out[0, :2], torch.log_softmax(torch.tensor([0.0, 1.0]), -1))
    assert torch.isneginf(out[1]).all()
    torch.where(torch.isfinite(out), out, torch.zeros_like(out)).sum().backward()
    assert torch.isfinite(z.grad).all()


def test_safe_logsumexp_and_log1mexp():
    x = torch.tensor([[-math.inf, -math.inf], [0.0, math.log(3.0)]], dtype=torch.float64,
                     requires_grad=True)
    lse = safe_logsumexp(x, -1)
    assert torch.isneginf(lse[0]) and abs(float(lse[1].detach()) - math.log(4.0)) < 1e-12
    lse[1].backward()
    assert torch.isfinite(x.grad).all()
    y = torch.tensor([-1e-12, -0.1, -0.7, -5.0, -50.0], dtype=torch.float64, requires_grad=True)
    ref = torch.log(1 - torch.exp(y.detach().to(torch.float64)))
    ref[0] = math.log(1e-12)  # 1 - exp(-1e-12) loses digits in the naive formula
    assert torch.allclose(log1mexp(y), ref, rtol=1e-6)
    assert torch.autograd.gradcheck(log1mexp, (y[1:].detach().requires_grad_(True),))
    assert torch.isneginf(log1mexp(torch.tensor([0.0])))


def test_row_block_sum_gradient_and_no_grad_path():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(2, 5, 4, dtype=torch.float64, generator=g, requires_grad=True)
    b, t = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 3, 1, 4])
    w = torch.randn(4, 4, dtype=torch.float64, generator=g)

    def term(rows, sl):
        return (rows.tanh() * w[sl]).sum()

    assert torch.autograd.gradcheck(lambda x: row_block_sum(x, b, t, term, 3), (z,))
    with torch.no_grad():
        val = row_block_sum(z, b, t, term, 1)
    assert abs(float(val.detach()) - float((z[b, t].tanh() * w).sum().detach())) < 1e-12


def test_token_logprobs_gradcheck_and_ignored_targets():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(2, 4, 6, dtype=torch.float64, generator=g, requires_grad=True)
    tgt = torch.tensor([[1, -1, 5, 0], [-1, -1, 2, 3]])
    out = token_logprobs(z, tgt, 1.7, 3)
    ref = torch.log_softmax(z / 1.7, -1).gather(2, tgt.clamp_min(0).unsqueeze(2)).squeeze(2)
    assert torch.allclose(out, torch.where(tgt >= 0, ref, torch.zeros_like(ref)))
    assert torch.autograd.gradcheck(lambda x: token_logprobs(x, tgt, 1.7, 3), (z,))
