"""Strict top-k reverse KL at exact chunks: float64 reference, top-k = whole shared vocabulary,
gradcheck, self-teacher invariance, masks and normalisation.

Legend: B batch, Ts/Tt student/teacher tokens, Vs/Vt vocabularies, N shared pairs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from loss_refs import random_alignment
from onpolicy_refs import identity_alignment, strict_ref

from xdistill.losses import count_strict_units, exact_kl, strict_topk

VS, VT = 11, 14
SHARED_S = torch.tensor([1, 2, 4, 5, 7, 8, 10])
SHARED_T = torch.tensor([3, 0, 5, 12, 6, 9, 1])


def _case(seed, dtype=torch.float64, B=3):
    rng = np.random.default_rng(seed)
    align, s_len, t_len = random_alignment(rng, B, n_chunks=12, exact_p=0.8)
    Ts, Tt = align.s_chunk_BTs.shape[1], align.t_chunk_BTt.shape[1]
    g = torch.Generator().manual_seed(seed)
    zs = (torch.randn(B, Ts, VS, generator=g, dtype=torch.float64) * 2).to(dtype)
    zt = (torch.randn(B, Tt, VT, generator=g, dtype=torch.float64) * 2).to(dtype)
    s_mask = (torch.arange(Ts) < torch.as_tensor(s_len)[:, None]) & \
        (torch.rand(B, Ts, generator=g) < 0.85)
    t_mask = torch.rand(B, Tt, generator=g) < 0.9
    return zs, zt, align, s_mask, t_mask


@pytest.mark.parametrize("k", [1, 3, 16])
@pytest.mark.parametrize("tau", [1.0, 1.7])
def test_matches_float64_reference(k, tau):
    zs, zt, align, s_mask, t_mask = _case(k)
    loss, stats = strict_topk(zs, zt, align, SHARED_S, SHARED_T, s_loss_mask_BTs=s_mask,
                              t_loss_mask_BTt=t_mask, top_k=k, temperature=tau, chunk_size=4)
    ref, units = strict_ref(zs, zt, align, SHARED_S.tolist(), SHARED_T.tolist(), k,
                            s_mask=s_mask, t_mask=t_mask, tau=tau)
    assert units > 3 and stats.units == units
    assert stats.units == count_strict_units(align, s_mask, t_mask)
    assert stats.k == min(k, SHARED_S.numel())
    assert float(loss) == pytest.approx(ref / units, rel=1e-10, abs=1e-12)
    assert 0 < stats.student_topk_mass <= 1
    assert 0 < stats.teacher_topk_mass <= stats.teacher_shared_mass


def test_float32_close_to_reference():
    zs, zt, align, s_mask, t_mask = _case(5, torch.float32)
    loss, stats = strict_topk(zs, zt, align, SHARED_S, SHARED_T, s_loss_mask_BTs=s_mask, top_k=4)
    ref, units = strict_ref(zs, zt, align, SHARED_S.tolist(), SHARED_T.tolist(), 4, s_mask=s_mask)
    assert float(loss) == pytest.approx(ref / units, rel=2e-5)


def test_k_at_least_shared_is_reverse_exact_kl():
    """k >= N: the whole shared vocabulary, i.e. exact_kl's reverse direction."""
    zs, zt, align, s_mask, _ = _case(9)
    loss, _ = strict_topk(zs, zt, align, SHARED_S, SHARED_T, s_loss_mask_BTs=s_mask, top_k=100,
                          temperature=1.3)
    ref = exact_kl(zs, zt, align, SHARED_S, SHARED_T, s_loss_mask_BTs=s_mask, direction="reverse",
                   temperature=1.3)
    assert float(loss) == pytest.approx(float(ref), rel=1e-12)


def test_gradcheck():
    zs, zt, align, s_mask, t_mask = _case(2, B=1)
    zs.requires_grad_(True)

    def f(z):
        return strict_topk(z, zt, align, SHARED_S, SHARED_T, s_loss_mask_BTs=s_mask,
                           t_loss_mask_BTt=t_mask, top_k=3, temperature=1.5, chunk_size=3)[0]

    assert torch.autograd.gradcheck(f, (zs,))


def test_self_teacher_gives_zero_loss_and_gradient():
    B, T, V = 2, 9, 13
    zs = (torch.randn(B, T, V, generator=torch.Generator().manual_seed(0)) * 3).requires_grad_(True)
    ids = torch.arange(V)
    for k in (4, V):
        loss, stats = strict_topk(zs, zs.detach().clone(), identity_alignment(B, T), ids, ids,
                                  top_k=k)
        (g,) = torch.autograd.grad(loss, zs)
        assert stats.units == B * (T - 1)
        assert abs(float(loss.detach())) < 1e-6 and float(g.abs().max()) < 1e-6


def test_masked_rows_do_not_matter_and_num_valid_normalises():
    zs, zt, align, s_mask, t_mask = _case(4)
    kw = dict(s_loss_mask_BTs=s_mask, t_loss_mask_BTt=t_mask, top_k=3)
    loss, stats = strict_topk(zs, zt, align, SHARED_S, SHARED_T, **kw)
    loss7, _ = strict_topk(zs, zt, align, SHARED_S, SHARED_T, num_valid=7, **kw)
    assert float(loss7) * 7 == pytest.approx(float(loss) * stats.units, rel=1e-12)
    # rows that are no unit's root: changing them (both sides) changes nothing
    from xdistill.losses.chunks import chunk_start_rows, loss_chunks
    ok = loss_chunks(align, s_mask, t_mask, exact_only=True)
    b_N, s_N, t_N = chunk_start_rows(align, ok)
    keep_s = torch.zeros(zs.shape[:2], dtype=torch.bool)
    keep_s[b_N, s_N] = True
    keep_t = torch.zeros(zt.shape[:2], dtype=torch.bool)
    keep_t[b_N, t_N] = True
    zs2 = torch.where(keep_s[..., None], zs, torch.randn_like(zs) * 5)
    zt2 = torch.where(keep_t[..., None], zt, torch.randn_like(zt) * 5)
    assert float(strict_topk(zs2, zt2, align, SHARED_S, SHARED_T, **kw)[0]) == \
        pytest.approx(float(loss), rel=1e-12)


def test_bad_inputs_raise():
    zs, zt, align, _, _ = _case(1)
    with pytest.raises(ValueError, match="top_k"):
        strict_topk(zs, zt, align, SHARED_S, SHARED_T, top_k=0)
    with pytest.raises(ValueError, match="equal-length"):
        strict_topk(zs, zt, align, SHARED_S, SHARED_T[:-1])
    with pytest.raises(ValueError, match="outside"):
        strict_topk(zs, zt, align, SHARED_S, SHARED_T + VT)


def test_no_units_gives_zero_and_a_zero_gradient():
    zs, zt, align, s_mask, _ = _case(3)
    zs.requires_grad_(True)
    loss, stats = strict_topk(zs, zt, align, SHARED_S, SHARED_T,
                              s_loss_mask_BTs=torch.zeros_like(s_mask))
    (g,) = torch.autograd.grad(loss, zs)
    assert stats.units == 0 and float(loss.detach()) == 0 and not g.any()
