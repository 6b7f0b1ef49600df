"""The fast P-KL kernels against the previous autograd formulation (dense @ sparse CSR) in float64.

Legend: B batch, Ts/Tt student/teacher tokens, Vs/Vt vocabularies, S support of W, n rows.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from loss_refs import random_alignment, random_projection

from xdistill.losses import projected_kl, projection_from_csr
from xdistill.losses.divergences import forward_kl_rows, jsd_rows, reverse_kl_rows
from xdistill.losses.engine import log_softmax_safe
from xdistill.losses.projection_ops import (prepare_projection, projected_forward_kl_sum,
                                            projected_logp, teacher_logq)

VS, VT = 11, 17


def _safe_log(x):
    pos = x > 0
    return torch.where(pos, torch.log(torch.where(pos, x, torch.ones_like(x))),
                       torch.full_like(x, -math.inf))


def _old_support(W_csr):
    support_Vt = torch.zeros(W_csr.shape[1], dtype=torch.bool)
    support_Vt[W_csr.col_indices()[W_csr.values() > 0]] = True
    return support_Vt


def _old_projected_logp(z_nVs, W_csr, support_Vt):
    """The previous formulation, verbatim: autograd through ``p @ W``, [n, Vt]."""
    p = torch.exp(log_softmax_safe(z_nVs))
    m = p @ W_csr
    m = torch.where(support_Vt, m, torch.zeros_like(m))
    return _safe_log(m) - _safe_log(m.sum(-1, keepdim=True))


def _old_rows(z_s, z_t, W_csr, direction="forward", tau=1.0, tau_t=1.0, beta=0.5):
    support = _old_support(W_csr)
    logp = _old_projected_logp(z_s / tau, W_csr, support)
    logq = log_softmax_safe((z_t / tau_t).masked_fill(~support, -math.inf))
    div = {"forward": forward_kl_rows, "reverse": reverse_kl_rows,
           "jsd": lambda a, b: jsd_rows(a, b, beta)}[direction]
    return div(logp, logq).sum()


def _W(seed=0, Vs=VS, Vt=VT, dtype=torch.float64):
    """CSR projection: rows sum to 1, row 0 unmapped, column Vt-1 unreached (outside support)."""
    W = random_projection(np.random.default_rng(seed), Vs, Vt, density=0.25)
    rows, cols = np.nonzero(W)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=Vs))])
    csr = projection_from_csr(indptr, cols, W[rows, cols], (Vs, Vt))
    return csr, torch.sparse_csr_tensor(csr.crow_indices(), csr.col_indices(),
                                        csr.values().to(dtype), size=csr.shape), W


def _rows(seed=0, n=6, dtype=torch.float64, minus_inf=True):
    g = torch.Generator().manual_seed(seed)
    z_s = (torch.randn(n, VS, generator=g) * 2).to(dtype)
    z_t = (torch.randn(n, VT, generator=g) * 2).to(dtype)
    if minus_inf:
        z_s[0, 3] = -math.inf  # a student token with no mass
        z_t[1, 5] = -math.inf
    return z_s, z_t


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # sparse CSR beta
        yield


def test_prepared_projection_restricts_to_support_and_caches():
    proj, W64, W = _W(1)
    prep = prepare_projection(proj, torch.float64)
    assert prepare_projection(proj, torch.float64) is prep
    assert prepare_projection(proj, torch.float32) is not prep
    support = np.nonzero(W.sum(0) > 0)[0]
    assert prep.support_S.tolist() == support.tolist() and VT - 1 not in support
    np.testing.assert_allclose(prep.wt_SVs.to_dense().numpy(), W[:, support].T, rtol=1e-6)
    np.testing.assert_allclose(prep.w_VsS.to_dense().numpy(), W[:, support], rtol=1e-6)
    np.testing.assert_allclose(prep.rowsum_Vs.numpy(), W.sum(1), rtol=1e-6)
    assert prep.rowsum_Vs[0] == 0  # the unmapped student token
    # dense and COO inputs give the same prepared matrices
    for other in (torch.as_tensor(W), torch.as_tensor(W).to_sparse()):
        o = prepare_projection(other, torch.float64)
        assert torch.equal(o.support_S, prep.support_S)
        torch.testing.assert_close(o.w_VsS.to_dense(), prep.w_VsS.to_dense(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("tau", [1.0, 1.7])
def test_projected_logp_equals_old_formulation(tau):
    _, W64, _ = _W(2)
    prep = prepare_projection(W64, torch.float64)
    z_s, _ = _rows(2)
    old = _old_projected_logp(z_s / tau, W64, _old_support(W64))
    new = projected_logp(z_s, prep, tau)
    S = prep.support_S
    assert torch.isneginf(old[:, ~_old_support(W64)]).all()
    fin = torch.isfinite(old[:, S])
    assert torch.equal(fin, torch.isfinite(new))
    torch.testing.assert_close(new[fin], old[:, S][fin], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("direction", ["forward", "reverse", "jsd"])
@pytest.mark.parametrize("tau,tau_t", [(1.0, 1.0), (2.0, 0.7)])
def test_row_terms_and_gradients_equal_old_formulation(direction, tau, tau_t):
    _, W64, _ = _W(3)
    prep = prepare_projection(W64, torch.float64)
    z_s, z_t = _rows(3)
    x_old, x_new = z_s.clone().requires_grad_(), z_s.clone().requires_grad_()
    old = _old_rows(x_old, z_t, W64, direction, tau, tau_t)
    if direction == "forward":
        new = projected_forward_kl_sum(x_new, z_t[:, prep.support_S], prep, tau, tau_t)
    else:
        div = reverse_kl_rows if direction == "reverse" else (lambda a, b: jsd_rows(a, b, 0.5))
        logq = teacher_logq(z_t[:, prep.support_S], tau_t)
        new = div(projected_logp(x_new, prep, tau), logq).sum()
    assert float(new) == pytest.approx(float(old), rel=1e-12, abs=1e-12)
    (g_old,), (g_new,) = torch.autograd.grad(old, x_old), torch.autograd.grad(new, x_new)
    torch.testing.assert_close(g_new, g_old, rtol=1e-10, atol=1e-12)


def test_teacher_mass_where_student_mass_is_zero_is_finite_and_matches():
    """A support column whose student tokens all have -inf logits: m_t = 0, q_t > 0."""
    _, W64, W = _W(4)
    prep = prepare_projection(W64, torch.float64)
    z_s, z_t = _rows(4, minus_inf=False)
    t = int(prep.support_S[0])
    z_s[:, np.nonzero(W[:, t])[0]] = -math.inf
    x_old, x_new = z_s.clone().requires_grad_(), z_s.clone().requires_grad_()
    old = _old_rows(x_old, z_t, W64)
    new = projected_forward_kl_sum(x_new, z_t[:, prep.support_S], prep)
    assert torch.isfinite(new) and float(new) == pytest.approx(float(old), rel=1e-12)
    (g_old,), (g_new,) = torch.autograd.grad(old, x_old), torch.autograd.grad(new, x_new)
    assert torch.isfinite(g_new).all()
    torch.testing.assert_close(g_new, g_old, rtol=1e-10, atol=1e-12)


def test_gradcheck_projected_logp_and_fused_forward_kl():
    _, W64, _ = _W(5)
    prep = prepare_projection(W64, torch.float64)
    z_s, z_t = _rows(5, n=3, minus_inf=False)
    weights = torch.randn(3, prep.n_support, dtype=torch.float64,
                          generator=torch.Generator().manual_seed(0))
    x = z_s.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda z: (projected_logp(z, prep, 1.3) * weights).sum(), (x,))
    zt_S = z_t[:, prep.support_S]
    assert torch.autograd.gradcheck(lambda z: projected_forward_kl_sum(z, zt_S, prep, 1.3, 0.8),
                                    (x,))


@pytest.mark.parametrize("direction", ["forward", "reverse", "jsd"])
def test_projected_kl_end_to_end_equals_old_formulation(direction):
    """The public loss over a real-looking alignment, in float64, value and gradient."""
    import xdistill.losses.cross as cross

    rng = np.random.default_rng(6)
    align, s_len, t_len = random_alignment(rng, 3, 8)
    Ts, Tt = align.s_chunk_BTs.shape[1], align.t_chunk_BTt.shape[1]
    g = torch.Generator().manual_seed(6)
    zs = torch.randn(3, Ts, VS, generator=g, dtype=torch.float64) * 2
    zt = torch.randn(3, Tt, VT, generator=g, dtype=torch.float64) * 2
    proj, W64, _ = _W(6)
    kw = dict(direction=direction, temperature=1.5, chunk_size=3)

    def old_fn(z):
        rows = lambda a, b: _old_rows(a, b, W64, direction, 1.5, 1.5)  # noqa: E731
        return cross._chunk_start_loss(z, zt, align, None, None, rows, exact_only=False,
                                       num_valid=None, chunk_size=3, scale=1.5 ** 2)

    x_old, x_new = zs.clone().requires_grad_(), zs.clone().requires_grad_()
    old, new = old_fn(x_old), projected_kl(x_new, zt, align, proj, **kw)
    assert float(new) == pytest.approx(float(old), rel=1e-12)
    old.backward()
    new.backward()
    torch.testing.assert_close(x_new.grad, x_old.grad, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(lambda z: projected_kl(z, zt, align, proj, **kw),
                                    (zs.clone().requires_grad_(),), fast_mode=True)


def test_float32_matches_float64_and_empty_support_gives_zero():
    proj, W64, _ = _W(7)
    z_s, z_t = _rows(7)
    p32, p64 = prepare_projection(proj, torch.float32), prepare_projection(proj, torch.float64)
    S = p64.support_S
    v32 = projected_forward_kl_sum(z_s.float(), z_t[:, S].float(), p32)
    v64 = projected_forward_kl_sum(z_s, z_t[:, S], p64)
    assert float(v32) == pytest.approx(float(v64), rel=1e-5)
    empty = projection_from_csr(np.zeros(VS + 1, dtype=np.int64), np.zeros(0, dtype=np.int64),
                                np.zeros(0), (VS, VT))
    B, T = 2, 4
    chunk = torch.arange(T).expand(B, T).clone()
    from xdistill.losses import ChunkAlignment
    align = ChunkAlignment(chunk, chunk.clone(), torch.ones(B, T, dtype=torch.bool),
                           torch.ones(B, T, dtype=torch.bool))
    zs = torch.randn(B, T, VS, requires_grad=True)
    loss = projected_kl(zs, torch.randn(B, T, VT), align, empty)
    loss.backward()
    assert float(loss) == 0.0 and torch.equal(zs.grad, torch.zeros_like(zs))


def test_row_groups_do_not_change_results(monkeypatch):
    """Tiny GROUP_BYTES: every block is split into groups of a row or two (values, gradients)."""
    import xdistill.losses.projection_ops as ops

    rng = np.random.default_rng(8)
    align, _, _ = random_alignment(rng, 2, 8)
    g = torch.Generator().manual_seed(8)
    zs = torch.randn(2, align.s_chunk_BTs.shape[1], VS, generator=g, dtype=torch.float64)
    zt = torch.randn(2, align.t_chunk_BTt.shape[1], VT, generator=g, dtype=torch.float64)
    proj, _, _ = _W(8)
    out = {}
    for name, size in (("whole", ops.GROUP_BYTES), ("groups", 8 * VT + 1)):
        monkeypatch.setattr(ops, "GROUP_BYTES", size)
        for direction in ("forward", "reverse"):
            x = zs.clone().requires_grad_()
            loss = projected_kl(x, zt, align, proj, direction=direction, chunk_size=4)
            loss.backward()
            out[name, direction] = (loss.detach(), x.grad)
    assert ops.group_rows(10, VS, VT, itemsize=8) == 1
    for direction in ("forward", "reverse"):
        torch.testing.assert_close(out["groups", direction], out["whole", direction],
                                   rtol=1e-12, atol=1e-14)


def test_prepared_projection_per_device_is_cached():
    proj, _, _ = _W(9)
    prep = prepare_projection(proj, torch.float32)
    assert prepare_projection(proj, torch.float32, "cpu") is prep


@pytest.mark.gpu
def test_cuda_matches_cpu_with_a_cpu_projection():
    rng = np.random.default_rng(10)
    align, _, _ = random_alignment(rng, 2, 8)
    g = torch.Generator().manual_seed(10)
    zs = torch.randn(2, align.s_chunk_BTs.shape[1], VS, generator=g)
    zt = torch.randn(2, align.t_chunk_BTt.shape[1], VT, generator=g)
    proj, _, _ = _W(10)
    for direction in ("forward", "reverse"):
        xc, xg = zs.clone().requires_grad_(), zs.cuda().requires_grad_()
        lc = projected_kl(xc, zt, align, proj, direction=direction)
        align_g = type(align)(*(t.cuda() for t in (align.s_chunk_BTs, align.t_chunk_BTt,
                                                   align.chunk_valid_BC, align.chunk_exact_BC)))
        lg = projected_kl(xg, zt.cuda(), align_g, proj, direction=direction)
        lc.backward()
        lg.backward()
        assert float(lg) == pytest.approx(float(lc), rel=1e-5)
        torch.testing.assert_close(xg.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-6)
