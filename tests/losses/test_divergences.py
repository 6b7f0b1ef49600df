"""Same-tokenizer divergences against float64 references; gradients; invariances; -inf safety."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from loss_refs import ce_ref, jsd, kl, same_tok_ref, softmax, topk_tail_kl

from xdistill.losses import (count_valid_tokens, cross_entropy, forward_kl, jsd as jsd_loss,
                             reverse_kl, topk_forward_kl)

B, T, V, K = 3, 7, 11, 4
# tolerance of the float32 implementation against the float64 reference
RTOL32 = 2e-5


def _inputs(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    zs = (torch.randn(B, T, V, generator=g) * 2).to(dtype)
    zt = (torch.randn(B, T, V, generator=g) * 2).to(dtype)
    mask = torch.rand(B, T, generator=g) < 0.7
    mask[:, -2:] = False  # padding
    return zs, zt, mask


def _topk(zt, k=K, tau=1.0):
    logp = torch.log_softmax(zt.double() / tau, -1)
    vals, idx = logp.topk(k, dim=-1)
    return vals.float(), idx


LOSSES = {
    "forward_kl": (lambda zs, zt, m, **kw: forward_kl(zs, zt, m, **kw), lambda p, q: kl(q, p)),
    "reverse_kl": (lambda zs, zt, m, **kw: reverse_kl(zs, zt, m, **kw), lambda p, q: kl(p, q)),
    "jsd_0.3": (lambda zs, zt, m, **kw: jsd_loss(zs, zt, m, beta=0.3, **kw),
                lambda p, q: jsd(p, q, 0.3)),
    "jsd_0": (lambda zs, zt, m, **kw: jsd_loss(zs, zt, m, beta=0.0, **kw), lambda p, q: kl(q, p)),
    "jsd_1": (lambda zs, zt, m, **kw: jsd_loss(zs, zt, m, beta=1.0, **kw), lambda p, q: kl(p, q)),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("tau", [1.0, 2.0])
def test_full_teacher_losses_match_reference(name, tau):
    fn, div = LOSSES[name]
    zs, zt, mask = _inputs()
    ref = same_tok_ref(zs, zt, mask, div, tau)
    got = fn(zs, zt, mask, temperature=tau, chunk_size=4)
    assert got.dtype == torch.float32
    assert float(got) == pytest.approx(ref, rel=RTOL32)
    got64 = fn(zs.double(), zt.double(), mask, temperature=tau, chunk_size=4)
    assert float(got64) == pytest.approx(ref, rel=1e-10)


@pytest.mark.parametrize("tau", [1.0, 2.0])
def test_topk_kl_matches_reference(tau):
    zs, zt, mask = _inputs(1)
    vals, idx = _topk(zt, tau=tau)

    def div_at(b, i):
        return topk_tail_kl(softmax(zs[b, i].double().numpy(), tau),
                            softmax(zt[b, i].double().numpy(), tau), idx[b, i].numpy())

    terms = [div_at(b, i - 1) for b in range(B) for i in range(1, T) if mask[b, i]]
    ref = tau ** 2 * sum(terms) / len(terms)
    got = topk_forward_kl(zs, vals, idx, mask, temperature=tau, chunk_size=5)
    assert float(got) == pytest.approx(ref, rel=RTOL32)


def _teacher_topk(zt, k):
    """What the teacher worker sends for top-k: float32 log-probs, ids, tail log-mass."""
    from xdistill.teacher.outputs import topk_logprobs

    vals, idx, tail = topk_logprobs(zt.reshape(-1, zt.shape[-1]), k, 1.0)
    shape = zt.shape[:2]
    return vals.reshape(*shape, -1), idx.reshape(*shape, -1), tail.reshape(shape)


def _rounded_teacher_ref(zs, vals, idx, tail, mask, k):
    """The tail-bucket KL of the teacher side as stored (``vals`` rounded to their dtype), made a
    distribution: with ``tail``, ``q_K`` and ``q_R`` normalised jointly; ``k == V``: the tail is
    empty and ``q_K`` sums to 1."""
    terms = []
    for b in range(B):
        for i in range(1, T):
            if not mask[b, i]:
                continue
            p = softmax(zs[b, i - 1].double().numpy(), 1.0)
            q_K = np.exp(vals[b, i - 1].double().numpy())
            q_R = 0.0 if k == V else (math.exp(float(tail[b, i - 1])) if tail is not None
                                      else max(0.0, 1.0 - q_K.sum()))
            z = q_K.sum() + q_R if (tail is not None or k == V) else max(1.0, q_K.sum())
            q = np.append(q_K, q_R) / z
            ids = idx[b, i - 1].numpy()
            terms.append(kl(q, np.append(p[ids], 1.0 - p[ids].sum() if k < V else 0.0)))
    return sum(terms) / len(terms)


@pytest.mark.parametrize("k", [K, V])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_tail", [False, True])
def test_topk_kl_with_teacher_outputs_matches_reference(k, dtype, with_tail):
    """The teacher worker's top-k output (K < V, and K = V: an empty tail), log-probs stored in
    float32 or bf16, with or without its tail log-mass. Against the float64 reference of the
    true teacher (the top-k KL; for K = V the full KL) within the storage rounding, and against
    the definition on the stored values tightly. An empty tail contributes exactly 0: before,
    its ``q_R`` (rounding residue) multiplied the ``-1e4`` log floor (here, K = V: 2.20933 for
    2.20887 in float32, 2.525 in bf16)."""
    zs, zt, mask = _inputs(1)
    zt = zt * 1.5
    vals, idx, tail = _teacher_topk(zt, k)
    stored = vals.to(dtype)
    tail_in = tail if with_tail else None
    got = float(topk_forward_kl(zs, stored, idx, mask, teacher_tail_logmass_BT=tail_in,
                                chunk_size=5))

    def true_div(b, i):
        p, q = softmax(zs[b, i].double().numpy(), 1.0), softmax(zt[b, i].double().numpy(), 1.0)
        return kl(q, p) if k == V else topk_tail_kl(p, q, idx[b, i].numpy())

    terms = [true_div(b, i - 1) for b in range(B) for i in range(1, T) if mask[b, i]]
    ref = sum(terms) / len(terms)
    # bf16 keeps 8 significant bits: ~4e-3 relative on each stored log-prob
    tol = 1e-6 if dtype == torch.float32 else 3e-3
    assert abs(got - ref) <= tol * (1 + abs(ref)), (got, ref)
    exact = _rounded_teacher_ref(zs, stored.float(), idx, tail_in, mask, k)
    assert got == pytest.approx(exact, rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("k", [3, 7])
def test_topk_kl_gradcheck_with_tail_log_mass(k):
    """float64 gradcheck with the teacher's tail log-mass, K < V and K = V (empty tail)."""
    zs, zt, mask = _inputs(8, torch.float64)
    zs = zs[:2, :5, :7].clone().requires_grad_(True)
    logq = torch.log_softmax(zt[:2, :5, :7] * 1.5, -1)
    vals, idx = logq.topk(k, -1)
    rest = logq.scatter(-1, idx, -math.inf).logsumexp(-1)
    for tail in (rest, None):
        assert torch.autograd.gradcheck(
            lambda x: topk_forward_kl(x, vals, idx, mask[:2, :5], teacher_tail_logmass_BT=tail,
                                      chunk_size=3, temperature=1.5), (zs,))


def test_cross_entropy_matches_reference():
    zs, _, mask = _inputs(2)
    labels = torch.randint(0, V, (B, T))
    labels[~mask] = -100
    assert float(cross_entropy(zs, labels, chunk_size=3)) == pytest.approx(
        ce_ref(zs, labels.numpy()), rel=RTOL32)


def _all_losses(zs, zt, mask, **kw):
    vals, idx = _topk(zt)
    labels = torch.where(mask, torch.arange(T).expand(B, T) % V, torch.full((B, T), -100))
    return {name: fn(zs, zt, mask, **kw) for name, (fn, _) in LOSSES.items()} | {
        "topk": topk_forward_kl(zs, vals.to(zs.dtype), idx, mask, **kw),
        "ce": cross_entropy(zs, labels, **kw)}


def test_gradcheck_float64():
    zs, zt, mask = _inputs(3, torch.float64)
    vals, idx = _topk(zt)
    zs = zs[:2, :5, :7].clone().requires_grad_(True)
    zt, mask, vals, idx = zt[:2, :5, :7], mask[:2, :5], vals[:2, :5].double(), idx[:2, :5]
    idx = idx.clamp_max(6)
    for name, (fn, _) in LOSSES.items():
        assert torch.autograd.gradcheck(lambda x: fn(x, zt, mask, chunk_size=3, temperature=1.5),
                                        (zs,)), name
    idx = torch.log_softmax(zt, -1).topk(3, -1).indices
    vals = torch.log_softmax(zt, -1).gather(-1, idx)
    assert torch.autograd.gradcheck(lambda x: topk_forward_kl(x, vals, idx, mask, chunk_size=3),
                                    (zs,))
    labels = torch.randint(0, 7, (2, 5))
    assert torch.autograd.gradcheck(lambda x: cross_entropy(x, labels, chunk_size=3), (zs,))


def test_identical_distributions_give_zero():
    zs, _, mask = _inputs(4)
    vals, idx = _topk(zs)
    for name, (fn, _) in LOSSES.items():
        assert abs(float(fn(zs, zs.clone(), mask))) < 1e-6, name
    assert abs(float(topk_forward_kl(zs, vals, idx, mask))) < 1e-6


def test_tail_bucket_kl_is_nonnegative():
    g = torch.Generator().manual_seed(5)
    for k in (1, 2, 5, V):
        for scale in (0.1, 3.0, 30.0):
            zs = torch.randn(4, 6, V, generator=g) * scale
            zt = torch.randn(4, 6, V, generator=g) * scale
            vals, idx = _topk(zt, k)
            mask = torch.ones(4, 6, dtype=torch.bool)
            b, i = torch.nonzero(mask[:, 1:], as_tuple=True)
            for bb, ii in zip(b.tolist(), i.tolist()):
                one = torch.zeros_like(mask)
                one[bb, ii + 1] = True
                assert float(topk_forward_kl(zs, vals, idx, one)) >= -1e-7


def test_masks_remove_exactly_the_masked_tokens():
    zs, zt, mask = _inputs(6)
    zs_req = zs.clone().requires_grad_(True)
    for name, (fn, _) in LOSSES.items():
        total = fn(zs_req, zt, mask)
        singles = []
        for b, i in torch.nonzero(mask[:, 1:]).tolist():
            one = torch.zeros_like(mask)
            one[b, i + 1] = True
            singles.append(float(fn(zs, zt, one)))
        n = count_valid_tokens(mask)
        assert float(total.detach()) * n == pytest.approx(sum(singles), rel=1e-5), name
        (g,) = torch.autograd.grad(total, zs_req)
        used = torch.zeros(B, T, dtype=torch.bool)
        used[:, :-1] = mask[:, 1:]
        assert torch.all(g[~used] == 0), name
        assert torch.all(g[used].abs().sum(-1) > 0), name


def test_no_nan_or_inf_with_minus_inf_logits_and_padding():
    zs, zt, mask = _inputs(7)
    zs[..., 3] = -math.inf          # vocabulary masked on both sides
    zt[..., 3] = -math.inf
    zt[..., 5] = -math.inf          # teacher-only zero probabilities
    pad_s = torch.zeros(B, T, dtype=torch.bool)
    pad_s[:, :-1] = ~mask[:, 1:]
    zs[pad_s] = -math.inf           # garbage in rows nobody reads
    zt[pad_s] = float("nan")
    zs_req = zs.clone().requires_grad_(True)
    for name, loss in _all_losses(zs_req, zt, mask, chunk_size=4).items():
        assert torch.isfinite(loss), name
        (g,) = torch.autograd.grad(loss, zs_req)
        assert torch.isfinite(g).all(), name


def test_topk_with_minus_inf_padding_entries_is_finite():
    zs, zt, mask = _inputs(8)
    vals, idx = _topk(zt, 6)
    vals[..., 4:] = -math.inf       # a teacher that returned only 4 real entries, padded
    idx[..., 4:] = 0
    ref_vals, ref_idx = _topk(zt, 4)
    zs_req = zs.clone().requires_grad_(True)
    got = topk_forward_kl(zs_req, vals, idx, mask)
    want = float(topk_forward_kl(zs, ref_vals, ref_idx, mask))
    assert float(got.detach()) == pytest.approx(want, rel=1e-6)
    (g,) = torch.autograd.grad(got, zs_req)
    assert torch.isfinite(g).all()


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_chunked_equals_unchunked(chunk):
    zs, zt, mask = _inputs(9)
    a = _all_losses(zs, zt, mask, chunk_size=chunk)
    b = _all_losses(zs, zt, mask, chunk_size=None)
    for name in a:
        assert float(a[name]) == pytest.approx(float(b[name]), rel=1e-6), name


def test_num_valid_normalisation_and_empty_mask():
    zs, zt, mask = _inputs(10)
    n = count_valid_tokens(mask)
    local = forward_kl(zs, zt, mask)
    glob = forward_kl(zs, zt, mask, num_valid=4 * n)
    assert float(glob) == pytest.approx(float(local) / 4, rel=1e-6)
    empty = torch.zeros_like(mask)
    zs_req = zs.clone().requires_grad_(True)
    zero = forward_kl(zs_req, zt, empty)
    zero.backward()
    assert float(zero.detach()) == 0.0 and torch.all(zs_req.grad == 0)


def test_bf16_inputs_compute_in_fp32():
    zs, zt, mask = _inputs(11)
    got = forward_kl(zs.bfloat16(), zt.bfloat16(), mask)
    ref = forward_kl(zs.bfloat16().float(), zt.bfloat16().float(), mask)
    assert got.dtype == torch.float32 and float(got) == pytest.approx(float(ref), rel=1e-6)
    zs_req = zs.bfloat16().requires_grad_(True)
    forward_kl(zs_req, zt, mask).backward()
    assert zs_req.grad.dtype == torch.bfloat16 and torch.isfinite(zs_req.grad.float()).all()


def test_bad_shapes_raise():
    zs, zt, mask = _inputs(12)
    with pytest.raises(ValueError, match="equal vocabularies"):
        forward_kl(zs, zt[..., :5], mask)
    with pytest.raises(ValueError, match="beta"):
        jsd_loss(zs, zt, mask, beta=1.5)
    with pytest.raises(ValueError, match="loss mask"):
        forward_kl(zs, zt, mask[:, :3])
    assert np.isfinite(float(forward_kl(zs, zt, mask)))


def test_repeated_backward_recomputes_the_gradient():
    zs, zt, mask = _inputs(13)
    zs_req = zs.clone().requires_grad_(True)
    loss = forward_kl(zs_req, zt, mask, chunk_size=4) * 3.0
    (g1,) = torch.autograd.grad(loss, zs_req, retain_graph=True)
    (g2,) = torch.autograd.grad(loss, zs_req)
    ref = zs.clone().requires_grad_(True)
    (g_ref,) = torch.autograd.grad(3.0 * forward_kl(ref, zt, mask, chunk_size=None), ref)
    assert torch.allclose(g1, g_ref, rtol=1e-5, atol=1e-7)
    assert torch.allclose(g2, g_ref, rtol=1e-5, atol=1e-7)
