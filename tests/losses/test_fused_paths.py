"""Hand-fused loss paths: the analytic top-k tail-bucket KL and the gradient-over-logits mode.

Both are checked against float64 references (autograd through the plain formula, or the ordinary
path) and with ``gradcheck``; the overwrite mode also against other loss terms on the same logits.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from loss_refs import ce_ref, softmax, topk_tail_kl

from xdistill.losses import ChunkAlignment, alm, cross_entropy, forward_kl, topk_forward_kl
from xdistill.losses.divergences import topk_tail_kl_block, topk_tail_kl_rows
from xdistill.losses.engine import token_logprobs


def _topk_case(seed=0, n=9, V=13, K=5):
    """Student rows and a teacher top-k with the awkward cases a real teacher can produce."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, V, generator=g, dtype=torch.float64) * 2
    zt = torch.randn(n, V, generator=g, dtype=torch.float64) * 2
    vals, idx = torch.log_softmax(zt, -1).topk(K, -1)
    vals[1, 3:] = -math.inf                 # padding entries (id 0 may also be a real member)
    idx[1, 3:] = 0
    vals[2, :] = -math.inf                  # no real entry at all
    idx[3, 4] = idx[3, 0]                   # a duplicated id
    vals[4] = vals[4] + 1e-3                # bf16-style rounding: mass slightly above 1 ...
    vals[4, 0] = math.log(0.9)              # ... (after renormalisation the tail is empty)
    z[5, idx[5, 0]] = -math.inf             # a top-k id the student gives probability 0
    z[6, 2] = -math.inf                     # a vocabulary-masked column
    z[7] = -40.0                            # student concentrated on the top-k: tiny tail
    z[7, idx[7]] = 40.0
    return z, vals, idx


def test_fused_topk_block_matches_autograd_formula_in_float64():
    z, vals, idx = _topk_case()
    z_req = z.clone().requires_grad_(True)
    ref = topk_tail_kl_rows(z_req, vals, idx).sum()
    (g_ref,) = torch.autograd.grad(ref, z_req)
    value, g = topk_tail_kl_block(z.clone(), vals, idx, need_grad=True)
    assert float(value) == pytest.approx(float(ref.detach()), rel=1e-12)
    assert torch.isfinite(g).all()
    torch.testing.assert_close(g, g_ref, rtol=1e-9, atol=1e-12)
    value_only, none = topk_tail_kl_block(z.clone(), vals, idx, need_grad=False)
    assert none is None and float(value_only) == float(value)


def test_fused_topk_rows_match_the_numpy_definition():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(6, 13, generator=g, dtype=torch.float64) * 2
    vals, idx = torch.log_softmax(torch.randn(6, 13, generator=g, dtype=torch.float64) * 2,
                                  -1).topk(5, -1)
    for i in range(6):
        value, _ = topk_tail_kl_block(z[i:i + 1].clone(), vals[i:i + 1], idx[i:i + 1], False)
        q = np.zeros(13)
        q[idx[i].numpy()] = np.exp(vals[i].numpy())
        ref = topk_tail_kl(softmax(z[i].numpy(), 1.0), q, idx[i].numpy())
        assert float(value) == pytest.approx(ref, rel=1e-10)


def test_fused_topk_tail_is_accurate_when_the_student_puts_all_mass_on_the_top_k():
    z, vals, idx = _topk_case(2)
    row = z[7:8].clone()
    value, _ = topk_tail_kl_block(row.clone(), vals[7:8], idx[7:8], False)
    value32, _ = topk_tail_kl_block(row.float(), vals[7:8].float(), idx[7:8], False)
    assert math.isfinite(float(value32)) and float(value32) > 0
    assert float(value32) == pytest.approx(float(value), rel=1e-5)


@pytest.mark.parametrize("tau", [1.0, 2.5])
def test_topk_forward_kl_gradcheck_with_padding_and_duplicates(tau):
    z, vals, idx = _topk_case(3, n=8, V=7, K=5)
    # finite logits (gradcheck perturbs every entry); the teacher-side cases stay
    zs = torch.where(torch.isinf(z), torch.full_like(z, -3.0), z).reshape(2, 4, 7)
    zs = zs.requires_grad_(True)
    vals, idx = vals.reshape(2, 4, 5), idx.reshape(2, 4, 5)
    mask = torch.ones(2, 4, dtype=torch.bool)
    assert torch.autograd.gradcheck(
        lambda x: topk_forward_kl(x, vals, idx, mask, temperature=tau, chunk_size=3), (zs,))


def _lm_inputs(seed=0, B=2, T=6, V=9):
    g = torch.Generator().manual_seed(seed)
    zs = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2
    zt = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2
    labels = torch.randint(0, V, (B, T), generator=g)
    labels[0, 3] = -100
    return zs, zt, labels


@pytest.mark.parametrize("tau", [1.0, 2.0])
def test_overwrite_logits_gives_the_ordinary_value_and_gradient(tau):
    zs, _, labels = _lm_inputs()
    base = zs.clone().requires_grad_(True)
    ref = cross_entropy(base, labels, temperature=tau, chunk_size=4)
    (3.0 * ref).backward()
    leaf = zs.clone().requires_grad_(True)
    got = cross_entropy(leaf * 1.0, labels, temperature=tau, chunk_size=4, overwrite_logits=True)
    assert float(got.detach()) == pytest.approx(ce_ref(zs, labels, tau), rel=1e-12)
    (3.0 * got).backward()
    torch.testing.assert_close(leaf.grad, base.grad, rtol=1e-12, atol=1e-14)


def test_overwrite_logits_vjp_matches_finite_differences_and_backward_runs_once():
    """gradcheck needs repeated backwards of one graph, which this mode forbids (it raises), so
    the vector-Jacobian product is checked against central differences along random directions
    (gradcheck's fast mode, by hand)."""
    zs, _, labels = _lm_inputs(1, T=5, V=7)
    target = labels.clamp_min(-1)
    target[1, 2] = -1
    g = torch.Generator().manual_seed(7)
    w = torch.randn(target.shape, generator=g, dtype=torch.float64)

    def f(a):
        return (token_logprobs(a, target, 1.5, 3) * w).sum()

    for _ in range(3):
        u = torch.randn(zs.shape, generator=g, dtype=torch.float64)
        x = zs.clone().requires_grad_(True)
        out = (token_logprobs(x * 1.0, target, 1.5, 3, overwrite_logits=True) * w).sum()
        out.backward(retain_graph=True)
        eps = 1e-6
        numeric = (f(zs + eps * u) - f(zs - eps * u)) / (2 * eps)
        assert float((x.grad * u).sum()) == pytest.approx(float(numeric), rel=1e-7, abs=1e-9)
        with pytest.raises(RuntimeError, match="inplace"):
            out.backward()


def test_overwrite_logits_writes_the_gradient_into_the_logits_storage():
    zs, _, labels = _lm_inputs(1, T=5, V=7)
    target = labels.clamp_min(-1)
    x = zs.clone().requires_grad_(True)
    logits = (x * 1.0)
    ptr = logits.data_ptr()
    seen = {}
    logits.register_hook(lambda g: seen.update(ptr=g.data_ptr()))
    token_logprobs(logits, target, 1.0, 3, overwrite_logits=True).sum().backward()
    assert seen["ptr"] == ptr               # the gradient *is* the logits' storage: no new buffer


def test_overwrite_logits_with_other_terms_on_the_same_logits():
    """MultiTeacherLoss-style sums: terms that form their gradient in forward stay exact; a term
    that re-reads the logits in backward gets autograd's in-place error, never a wrong value."""
    zs, zt, labels = _lm_inputs(2)
    mask = labels >= 0
    base = zs.clone().requires_grad_(True)
    (cross_entropy(base, labels) + 0.5 * forward_kl(base, zt, mask)).backward()
    leaf = zs.clone().requires_grad_(True)
    logits = leaf * 1.0
    (cross_entropy(logits, labels, overwrite_logits=True) + 0.5 * forward_kl(logits, zt, mask)
     ).backward()
    torch.testing.assert_close(leaf.grad, base.grad, rtol=1e-12, atol=1e-14)
    leaf2 = zs.clone().requires_grad_(True)
    logits2 = leaf2 * 1.0
    saver = (logits2 ** 2).mean()           # saves the logits for its backward; created first
    loss = saver + cross_entropy(logits2, labels, overwrite_logits=True)
    with pytest.raises(RuntimeError, match="inplace"):
        loss.backward()


def test_alm_overwrite_logits_and_narrow_teacher_blocks_match():
    g = torch.Generator().manual_seed(4)
    B, T, Vs, Vt = 2, 8, 7, 23
    zs = torch.randn(B, T, Vs, generator=g, dtype=torch.float64)
    zt = torch.randn(B, T, Vt, generator=g, dtype=torch.float64)
    s_ids = torch.randint(0, Vs, (B, T), generator=g)
    t_ids = torch.randint(0, Vt, (B, T), generator=g)
    chunk = torch.arange(T).div(2, rounding_mode="floor").expand(B, T).clone()
    chunk[1, -1] = -1
    align = ChunkAlignment(chunk, chunk.clone(), torch.ones(B, T // 2, dtype=torch.bool),
                           torch.zeros(B, T // 2, dtype=torch.bool))
    kw = dict(teacher_logits_BTtVt=zt, teacher_ids_BTt=t_ids)
    base = zs.clone().requires_grad_(True)
    ref = alm(base, s_ids, align, chunk_size=None, **kw)
    ref.backward()
    leaf = zs.clone().requires_grad_(True)
    got = alm(leaf * 1.0, s_ids, align, chunk_size=3, overwrite_logits=True, **kw)
    got.backward()
    assert float(got.detach()) == pytest.approx(float(ref.detach()), rel=1e-12)
    torch.testing.assert_close(leaf.grad, base.grad, rtol=1e-10, atol=1e-14)


def test_non_contiguous_logits_are_read_row_by_row():
    """``logits[:, :-1]`` cannot be viewed as [B*T, V]; the blocks gather (b, t) pairs instead."""
    zs, zt, labels = _lm_inputs(5, T=7)
    mask = labels >= 0
    vals, idx = torch.log_softmax(zt, -1).topk(3, -1)
    full = zs.clone().requires_grad_(True)
    cut = full[:, :-1]
    assert not cut.is_contiguous()
    for fn in (lambda z, sl: cross_entropy(z, labels[:, sl], chunk_size=4),
               lambda z, sl: forward_kl(z, zt[:, sl], mask[:, sl], chunk_size=4),
               lambda z, sl: topk_forward_kl(z, vals[:, sl], idx[:, sl], mask[:, sl],
                                             chunk_size=4)):
        (g_cut,) = torch.autograd.grad(fn(cut, slice(0, -1)), full)
        ref_in = zs[:, :-1].contiguous().requires_grad_(True)
        (g_ref,) = torch.autograd.grad(fn(ref_in, slice(0, -1)), ref_in)
        torch.testing.assert_close(g_cut[:, :-1], g_ref, rtol=1e-12, atol=1e-14)
        assert torch.all(g_cut[:, -1] == 0)
