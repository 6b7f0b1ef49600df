"""k1 with a discount (``loss.discount``): the advantage of a unit is the discounted return of the
log-ratios of its sample's later units. Float64 references from the definition, gradcheck, the
tokenization invariance of ``gamma = 1``, zeroed stop units, the self-teacher and the errors.

Legend: B batch, Ts student tokens, C chunks, N loss units.
"""

from __future__ import annotations

import pytest
import torch

from xdistill.losses import ChunkAlignment
from xdistill.losses.onpolicy import (Clamps, OnPolicyLossSpec, input_token_logprobs,
                                      sampled_loss)
from xdistill.losses.onpolicy_sampled import discounted_returns, sampled_unit_losses


def _returns_ref(r, b, gamma, keep=None):
    """G_n = sum over later units m of n's sample of gamma^(m - n) r_m (python floats)."""
    r = [float(x) if keep is None or keep[i] else 0.0 for i, x in enumerate(r)]
    out = []
    for n in range(len(r)):
        later = [m for m in range(n, len(r)) if b[m] == b[n]]
        out.append(sum(gamma ** (m - n) * r[m] for m in later))
    return out


@pytest.mark.parametrize("gamma", [0.0, 0.3, 0.9, 1.0])
def test_discounted_returns_match_the_definition(gamma):
    g = torch.Generator().manual_seed(3)
    b_N = torch.tensor([0, 0, 0, 2, 2, 3, 5, 5, 5, 5])      # samples of 3, 2, 1 and 4 units
    r_N = torch.randn(10, generator=g, dtype=torch.float64) * 4
    keep_N = torch.tensor([True, False, True, True, True, True, True, True, False, True])
    for keep in (None, keep_N):
        got = discounted_returns(r_N, b_N, gamma, keep)
        ref = _returns_ref(r_N.tolist(), b_N.tolist(), gamma,
                           None if keep is None else keep.tolist())
        assert got.dtype == torch.float64
        assert got.tolist() == pytest.approx(ref, rel=1e-12, abs=1e-12)


def test_discounted_returns_errors_and_empty():
    r = torch.ones(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="non-decreasing"):
        discounted_returns(r, torch.tensor([1, 0, 1]), 1.0)
    with pytest.raises(ValueError, match=r"discount must lie in \[0, 1\]"):
        discounted_returns(r, torch.tensor([0, 0, 1]), 1.5)
    empty = torch.zeros(0, dtype=torch.float64)
    assert discounted_returns(empty, torch.zeros(0, dtype=torch.int64), 1.0).numel() == 0


def _chunk(ids):
    n = max(ids) + 1
    return ChunkAlignment(torch.tensor([ids]), torch.tensor([ids]),
                          torch.ones(1, n, dtype=torch.bool), torch.ones(1, n, dtype=torch.bool))


def test_gamma_one_credits_a_unit_independently_of_how_later_text_is_cut():
    """One sample of four student tokens, scored as four units or as two chunks (the last two
    tokens merged, as a teacher whose stop merges with the period would): under ``gamma = 1`` the
    units the two cuttings share (the first two tokens) get the same advantage, and that
    advantage is the log-ratio of all the text from the unit on. Under ``gamma = 0`` it is not."""
    s_logp = torch.tensor([[0.0, -1.0, -3.0, -0.5, -6.0]], dtype=torch.float64)
    t_logp = torch.tensor([[0.0, -2.0, -2.5, -1.7, -9.0]], dtype=torch.float64)
    mask = torch.ones(1, 5, dtype=torch.bool)
    split, merged = _chunk([-1, 0, 1, 2, 3]), _chunk([-1, 0, 1, 2, 2])
    r = (t_logp - s_logp)[0, 1:]
    for gamma, same in ((1.0, True), (0.0, False)):
        grads = []
        for al in (split, merged):
            s = s_logp.clone().requires_grad_(True)
            sampled_loss("k1", s, t_logp, mask, align=al, clamps=Clamps(None, None, None),
                         num_valid=1, discount=gamma).loss.backward()
            grads.append(-s.grad[0, 1:])   # the advantage of each student token's unit
        assert torch.allclose(grads[0][:2], grads[1][:2], atol=1e-12)
        if gamma == 1.0:
            assert float(grads[0][0]) == pytest.approx(float(r.sum()), abs=1e-12)
            assert float(grads[0][1]) == pytest.approx(float(r[1:].sum()), abs=1e-12)
        # the token the merge moved: under gamma 0 its chunk credit is r[2] + r[3], not r[2]
        assert bool(torch.isclose(grads[0][2], grads[1][2], atol=1e-12)) == same


def test_k1_discount_with_baseline_and_clamp_matches_the_definition():
    """Two samples of unequal length through the same-tokenizer path: A = clamp(G - mean G),
    loss = -sum A log p / n, and its gradient in the student logits is -A grad log p."""
    g = torch.Generator().manual_seed(7)
    zs = torch.randn(2, 6, 9, generator=g, dtype=torch.float64)
    zt = torch.randn(2, 6, 9, generator=g, dtype=torch.float64) * 2
    ids = torch.randint(0, 9, (2, 6), generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    t = input_token_logprobs(zt, ids, mask)
    gamma, hi = 0.8, 2.0
    out = sampled_loss("k1", input_token_logprobs(zs, ids, mask), t, mask,
                       clamps=Clamps(None, hi, None), num_valid=8, baseline="mean",
                       discount=gamma)
    s = input_token_logprobs(zs, ids, mask)
    units = [(b, i) for b in range(2) for i in range(1, 6) if mask[b, i]]
    r = [float(t[b, i] - s[b, i]) for b, i in units]
    G = _returns_ref(r, [b for b, _ in units], gamma)
    mean = sum(G) / len(G)
    adv = [min(max(x - mean, -hi), hi) for x in G]
    ref = -sum(a * float(s[b, i]) for a, (b, i) in zip(adv, units)) / 8
    assert float(out.loss) == pytest.approx(ref, rel=1e-10, abs=1e-12)
    assert out.counters["loss_clamp"] == sum(abs(x - mean) > hi for x in G)

    # the gradient is -A * grad log p with A held fixed (a stop-gradient advantage): equal to
    # the gradient of the reference surrogate built from the float64 advantages above
    z = zs.clone().requires_grad_(True)
    sampled_loss("k1", input_token_logprobs(z, ids, mask), t, mask, clamps=Clamps(None, hi, None),
                 num_valid=8, baseline="mean", discount=gamma).loss.backward()
    z_ref = zs.clone().requires_grad_(True)
    s_ref = input_token_logprobs(z_ref, ids, mask)
    (-sum(a * s_ref[b, i] for a, (b, i) in zip(adv, units)) / 8).backward()
    assert torch.allclose(z.grad, z_ref.grad, rtol=1e-10, atol=1e-12)


def test_discount_self_teacher_is_zero_and_zeroed_stops_add_nothing():
    s_logp = torch.tensor([[0.0, -1.0, -3.0, -0.5, -6.0]], dtype=torch.float64)
    mask = torch.ones(1, 5, dtype=torch.bool)
    s = s_logp.clone().requires_grad_(True)
    out = sampled_loss("k1", s, s.detach(), mask, baseline="mean", discount=1.0)
    out.loss.backward()
    assert float(out.loss.detach()) == 0.0 and float(s.grad.abs().max()) == 0.0
    # a zeroed stop unit (the last token): zero advantage, and its log-ratio reaches no earlier unit
    t_logp = s_logp.clone()
    t_logp[0, 4] = -20.0
    stop = torch.tensor([[False, False, False, False, True]])
    s = s_logp.clone().requires_grad_(True)
    sampled_loss("k1", s, t_logp, mask, zero_BTs=stop, clamps=Clamps(None, None, None),
                 discount=1.0, num_valid=1).loss.backward()
    assert float(s.grad.abs().max()) == 0.0


def test_discount_applies_to_k1_only():
    s = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="k1 advantage only"):
        sampled_unit_losses("k3", s, s, Clamps(), discount=1.0, b_N=torch.zeros(3, dtype=int))
    with pytest.raises(ValueError, match="needs b_N"):
        sampled_unit_losses("k1", s, s, Clamps(), discount=1.0)
    with pytest.raises(ValueError, match="k1 only"):
        OnPolicyLossSpec(kind="k3", discount=0.5)
    with pytest.raises(ValueError, match=r"discount must lie in \[0, 1\]"):
        OnPolicyLossSpec(kind="k1", discount=-0.1)
    assert OnPolicyLossSpec(kind="k1", discount=1.0).discount == 1.0
