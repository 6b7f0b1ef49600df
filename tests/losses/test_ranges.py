"""Range masses of byte-sorted rows (xdistill/losses/ranges.py) against 60-digit sums.

A mass far below the float64 resolution of a cumulative sum keeps its relative precision, in
value and gradient; chunked gathers give the same result as one; empty and all ``-inf`` ranges
give ``-inf`` without NaN.
"""

from __future__ import annotations

import math

import mpmath
import pytest
import torch

from xdistill.losses.ranges import RESUM_BELOW, range_log_masses, range_logsumexp

mpmath.mp.dps = 60


def _rows(n=3, V=500, seed=0):
    """Log-probability rows where a few entries hold almost all the mass and the rest is tiny
    (down to e^-150: below a float32 exp, far below a cumulative sum's resolution)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, V, generator=g, dtype=torch.float64) * 3 - 120
    z[:, ::97] = 10.0
    return torch.log_softmax(z, -1)


def _ref(x_nV, r, lo, hi):
    vals = [mpmath.mpf(float(v)) for v in x_nV[r, lo:hi].tolist()]
    if not vals or all(v == -mpmath.inf for v in vals):
        return -math.inf
    return float(mpmath.log(mpmath.fsum(mpmath.exp(v) for v in vals)))


RANGES = [(0, 0, 500), (0, 1, 97), (1, 98, 194), (2, 5, 6), (2, 300, 300), (1, 490, 500),
          (0, 96, 98), (2, 195, 290)]


@pytest.mark.parametrize("chunk", [1, 7, 100, 1 << 22])
def test_range_logsumexp_matches_the_exact_sum_in_any_chunking(chunk):
    x = _rows()
    r, lo, hi = (torch.tensor(c) for c in zip(*RANGES))
    got = range_logsumexp(x, r, lo, hi, chunk=chunk)
    for j, (rr, a, b) in enumerate(RANGES):
        want = _ref(x, rr, a, b)
        if math.isinf(want):
            assert got[j] == -math.inf
        else:
            assert float(got[j]) == pytest.approx(want, abs=1e-12), (j, float(got[j]), want)


def test_range_log_masses_keeps_tiny_masses_and_matches_large_ones():
    x = _rows(seed=1)
    r, lo, hi = (torch.tensor(c) for c in zip(*RANGES))
    got = range_log_masses(x.float(), r, lo, hi)      # float32 log-probs: exp would underflow
    x32 = x.float().double()
    for j, (rr, a, b) in enumerate(RANGES):
        want = _ref(x32, rr, a, b)
        if math.isinf(want):
            assert got[j] == -math.inf
            continue
        assert want < math.log(RESUM_BELOW) or want > -5   # both regimes are exercised
        assert float(got[j]) == pytest.approx(want, abs=1e-9), (j, float(got[j]), want)
    assert min(_ref(x32, *c) for c in RANGES if c[1] < c[2]) < -100


def test_range_log_masses_gradient_is_that_of_the_exact_log_mass():
    """d log M / d x_c = exp(x_c) / M inside the range, 0 outside: checked by finite
    differences in float64, for a tiny range (direct sum) and a large one (cumulative sum)."""
    x = _rows(n=2, V=60, seed=2).clone().requires_grad_(True)
    r, lo, hi = torch.tensor([0, 1]), torch.tensor([1, 0]), torch.tensor([40, 60])
    assert torch.autograd.gradcheck(lambda t: range_log_masses(t, r, lo, hi), (x,),
                                    eps=1e-6, atol=1e-7)
    out = range_log_masses(x, r, lo, hi)
    (g,) = torch.autograd.grad(out[0], x)
    want = torch.zeros_like(x)
    want[0, 1:40] = torch.exp(x[0, 1:40] - out[0]).detach()
    assert torch.allclose(g, want, rtol=1e-9, atol=1e-300)


def test_empty_and_impossible_ranges_are_minus_inf_without_nan():
    x = torch.full((1, 10), -math.inf, dtype=torch.float64)
    x[0, 5] = 0.0
    x.requires_grad_(True)
    r, lo, hi = torch.tensor([0, 0, 0]), torch.tensor([0, 3, 4]), torch.tensor([5, 3, 6])
    out = range_log_masses(x, r, lo, hi)
    v = out.detach()
    assert v[0] == -math.inf and v[1] == -math.inf and float(v[2]) == 0.0
    (g,) = torch.autograd.grad(out[2], x)
    assert not torch.isnan(g).any() and float(g[0, 5]) == pytest.approx(1.0)
