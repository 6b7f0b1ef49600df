"""P-KL from a ``support`` teacher output (the teacher's logits at the projection's support
columns only, ``[B, Tt, S]``): the same loss and gradient as from the full logits, in float64 and
float32, through ``projected_kl`` and through ``MultiTeacherLoss``; a width that is not the
projection's support is an error naming both widths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from loss_refs import random_alignment

from xdistill.losses import projected_kl, projection_from_csr
from xdistill.losses.multi_teacher import MultiTeacherLoss, TeacherLossInput, TeacherSpec
from xdistill.teacher.outputs import support_columns

VS, VT = 11, 17


def _projection(seed=0):
    """Rows sum to 1 (row 0 unmapped); columns 2, 5, 8, ... never reached, so S < VT and the
    support is not a prefix."""
    rng = np.random.default_rng(seed)
    W = rng.random((VS, VT)) * (rng.random((VS, VT)) < 0.3)
    W[:, 2::3] = 0.0
    for s in range(VS):
        if W[s].sum() == 0:
            W[s, 0] = 1.0
    W = W / W.sum(1, keepdims=True)
    W[0] = 0.0
    rows, cols = np.nonzero(W)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=VS))])
    return projection_from_csr(indptr, cols, W[rows, cols], (VS, VT)), W


def _batch(seed, dtype):
    rng = np.random.default_rng(seed)
    align, _, _ = random_alignment(rng, 3, 8)
    Ts, Tt = align.s_chunk_BTs.shape[1], align.t_chunk_BTt.shape[1]
    g = torch.Generator().manual_seed(seed)
    zs = (torch.randn(3, Ts, VS, generator=g, dtype=torch.float64) * 2).to(dtype)
    zt = (torch.randn(3, Tt, VT, generator=g, dtype=torch.float64) * 2).to(dtype)
    return align, zs, zt


def test_support_columns_are_the_reached_teacher_ids():
    proj, W = _projection()
    S = support_columns(proj)
    assert S.dtype == torch.int64
    assert S.tolist() == sorted(np.nonzero(W.sum(0) > 0)[0].tolist())
    assert 2 not in S.tolist() and len(S) < VT
    with pytest.raises(ValueError, match="emits only 10 logits"):
        support_columns(proj, V=10)


@pytest.mark.parametrize("direction", ["forward", "reverse", "jsd"])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_support_logits_give_the_full_logits_loss_and_gradient(direction, dtype, tol):
    proj, _ = _projection(1)
    align, zs, zt = _batch(3, dtype)
    S = support_columns(proj)
    kw = dict(direction=direction, temperature=1.5, teacher_temperature=0.7, chunk_size=4)
    a, b = zs.clone().requires_grad_(), zs.clone().requires_grad_()
    full = projected_kl(a, zt, align, proj, **kw)
    sup = projected_kl(b, zt[..., S].contiguous(), align, proj, teacher_on_support=True, **kw)
    assert float(full.detach()) > 0
    assert float(sup.detach()) == pytest.approx(float(full.detach()), rel=tol, abs=tol)
    full.backward()
    sup.backward()
    torch.testing.assert_close(b.grad, a.grad, rtol=tol * 10, atol=tol)


def test_gradcheck_from_support_logits():
    proj, _ = _projection(2)
    align, zs, zt = _batch(4, torch.float64)
    zt_S = zt[..., support_columns(proj)].contiguous()
    assert torch.autograd.gradcheck(
        lambda z: projected_kl(z, zt_S, align, proj, teacher_on_support=True, chunk_size=3),
        (zs.clone().requires_grad_(),), fast_mode=True)


def test_identical_distributions_on_the_support_give_zero():
    """A teacher whose support logits are the projected student's log-probs: KL = 0."""
    proj, W = _projection(5)
    align, zs, _ = _batch(5, torch.float64)
    S = support_columns(proj)
    p = zs.softmax(-1)
    m = p @ torch.as_tensor(W)  # [B, Ts, VT] student mass in teacher space
    B, Tt = align.t_chunk_BTt.shape
    zt_S = torch.zeros(B, Tt, len(S), dtype=torch.float64)
    # every teacher position that starts a chunk gets the student chunk start's projected mass
    from xdistill.losses.cross import _loss_chunk_rows
    b_N, s_N, t_N = _loss_chunk_rows(zs, zt_S, align, None, None, False)
    zt_S[b_N, t_N] = m[b_N, s_N][:, S].log()
    loss = projected_kl(zs, zt_S, align, proj, teacher_on_support=True)
    assert abs(float(loss)) < 1e-12


def test_wrong_width_names_both_widths():
    proj, _ = _projection()
    align, zs, zt = _batch(0, torch.float64)
    n = len(support_columns(proj))
    with pytest.raises(ValueError, match=f"have {n + 1} columns but the projection's support "
                                         f"has {n}"):
        projected_kl(zs, zt[..., : n + 1], align, proj, teacher_on_support=True)


def test_multi_teacher_loss_takes_support_outputs():
    proj, _ = _projection(7)
    align, zs, zt = _batch(7, torch.float32)
    S = support_columns(proj)
    spec = TeacherSpec(name="t", loss="pkl", projection=proj)
    fn = MultiTeacherLoss([spec], ce_weight=0.0)
    mask = torch.ones(zs.shape[:2], dtype=torch.bool)
    ids = torch.zeros(zs.shape[:2], dtype=torch.long)
    full_inp = TeacherLossInput("t", logits_BTtV=zt, alignment=align)
    sup_inp = TeacherLossInput("t", support_logits_BTtS=zt[..., S].contiguous(), alignment=align)
    full, _ = fn(zs, ids, mask, [full_inp])
    sup, _ = fn(zs, ids, mask, [sup_inp])
    assert float(sup) == pytest.approx(float(full), rel=1e-6)
