"""Cross-tokenizer losses against float64 references over random real-looking alignments."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from loss_refs import alm_ref, cross_ref, jsd, kl, random_alignment, random_projection, sorted_l1

from xdistill.losses import (ChunkAlignment, alm, count_loss_chunks, exact_kl, forward_kl,
                             gold_hybrid, projected_kl, projection_from_csr, uld)
from xdistill.losses.chunks import chunk_bounds, loss_chunks

B, VS, VT = 3, 9, 13
RTOL32 = 2e-5
SHARED_S = torch.tensor([1, 2, 4, 7])
SHARED_T = torch.tensor([3, 0, 5, 12])


def _case(seed=0, dtype=torch.float32, n_rows=B, n_chunks=10):
    rng = np.random.default_rng(seed)
    align, s_len, t_len = random_alignment(rng, n_rows, n_chunks)
    B = n_rows
    Ts, Tt = align.s_chunk_BTs.shape[1], align.t_chunk_BTt.shape[1]
    g = torch.Generator().manual_seed(seed)
    zs = (torch.randn(B, Ts, VS, generator=g) * 2).to(dtype)
    zt = (torch.randn(B, Tt, VT, generator=g) * 2).to(dtype)
    s_ids = torch.randint(0, VS, (B, Ts), generator=g)
    t_ids = torch.randint(0, VT, (B, Tt), generator=g)
    s_mask = torch.arange(Ts).expand(B, Ts) < torch.as_tensor(s_len)[:, None]
    s_mask &= torch.rand(B, Ts, generator=g) < 0.85
    W = random_projection(rng, VS, VT)
    return dict(zs=zs, zt=zt, s_ids=s_ids, t_ids=t_ids, align=align, s_mask=s_mask, W=W,
                lens=(s_len, t_len))


def _proj(W):
    import scipy.sparse as sp
    csr = sp.csr_matrix(W)
    return projection_from_csr(csr.indptr, csr.indices, csr.data, csr.shape)


def _pkl_div(W, direction="forward"):
    support = W.sum(0) > 0

    def div(p, q):
        m = p @ W
        P, Q = m[support] / m[support].sum(), q[support] / q[support].sum()
        return kl(Q, P) if direction == "forward" else kl(P, Q)
    return div


def _exact_div(p, q):
    P, Q = p[SHARED_S.numpy()], q[SHARED_T.numpy()]
    return kl(Q / Q.sum(), P / P.sum())


def _gold_div(p, q, wc=1.0, wu=0.5):
    us = np.setdiff1d(np.arange(VS), SHARED_S.numpy())
    ut = np.setdiff1d(np.arange(VT), SHARED_T.numpy())
    return wc * _exact_div(p, q) + wu * sorted_l1(p[us], q[ut])


def _loss_fns(c, **kw):
    """name -> f(student logits) for every cross loss on case ``c``."""
    zt, align, m = c["zt"], c["align"], c["s_mask"]
    P = _proj(c["W"])

    def pkl(zs, **more):
        P_ = P.to(torch.float64 if zs.dtype == torch.float64 else torch.float32)
        return projected_kl(zs, zt, align, P_, s_loss_mask_BTs=m, **more, **kw)

    def alm_(zs, **more):
        return alm(zs, c["s_ids"], align, teacher_logits_BTtVt=zt, teacher_ids_BTt=c["t_ids"],
                   s_loss_mask_BTs=m, **more, **kw)
    return {
        "exact": lambda zs: exact_kl(zs, zt, align, SHARED_S, SHARED_T, s_loss_mask_BTs=m, **kw),
        "pkl": pkl,
        "pkl_rev": lambda zs: pkl(zs, direction="reverse"),
        "pkl_jsd": lambda zs: pkl(zs, direction="jsd", beta=0.3),
        "uld": lambda zs: uld(zs, zt, align, s_loss_mask_BTs=m, **kw),
        "gold": lambda zs: gold_hybrid(zs, zt, align, SHARED_S, SHARED_T, s_loss_mask_BTs=m,
                                       uncommon_weight=0.5, **kw),
        "alm_bce": lambda zs: alm_(zs, alm_temperature=3.0),
        "alm_abs": lambda zs: alm_(zs, variant="abs"),
    }


def _losses(c, zs=None, **kw):
    zs = c["zs"] if zs is None else zs
    return {name: fn(zs) for name, fn in _loss_fns(c, **kw).items()}


def _refs(c):
    zs, zt, align, m, W = c["zs"], c["zt"], c["align"], c["s_mask"].numpy(), c["W"]

    def pkl_jsd(p, q):
        support = W.sum(0) > 0
        mm = p @ W
        return jsd(mm[support] / mm[support].sum(), q[support] / q[support].sum(), 0.3)
    return {
        "exact": cross_ref(zs, zt, align, _exact_div, s_mask=m, exact_only=True),
        "pkl": cross_ref(zs, zt, align, _pkl_div(W), s_mask=m),
        "pkl_rev": cross_ref(zs, zt, align, _pkl_div(W, "reverse"), s_mask=m),
        "pkl_jsd": cross_ref(zs, zt, align, pkl_jsd, s_mask=m),
        "uld": cross_ref(zs, zt, align, sorted_l1, s_mask=m),
        "gold": cross_ref(zs, zt, align, _gold_div, s_mask=m),
        "alm_bce": alm_ref(zs, c["s_ids"], zt, c["t_ids"], align, "bce", 3.0, s_mask=m),
        "alm_abs": alm_ref(zs, c["s_ids"], zt, c["t_ids"], align, "abs", s_mask=m),
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cross_losses_match_reference(seed):
    c = _case(seed)
    refs, got = _refs(c), _losses(c, chunk_size=3)
    got64 = _losses(c, zs=c["zs"].double(), chunk_size=3)
    for name, ref in refs.items():
        assert ref > 0, name
        assert float(got[name]) == pytest.approx(ref, rel=RTOL32), name
        # float64 student: the teacher stays float32, hence 1e-6 rather than 1e-12
        assert float(got64[name]) == pytest.approx(ref, rel=1e-6), name


def test_temperature_scaling():
    c = _case(3)
    W = c["W"]
    ref = cross_ref(c["zs"], c["zt"], c["align"], _pkl_div(W), s_mask=c["s_mask"].numpy(),
                    tau=2.0) * 4.0
    got = projected_kl(c["zs"], c["zt"], c["align"], _proj(W), s_loss_mask_BTs=c["s_mask"],
                       temperature=2.0)
    assert float(got) == pytest.approx(ref, rel=RTOL32)


def test_gradcheck_float64():
    c = _case(4, n_rows=2, n_chunks=5)
    c = dict(c, zt=c["zt"].double())
    zs = c["zs"].double().requires_grad_(True)
    for name, fn in _loss_fns(c, chunk_size=2).items():
        assert torch.autograd.gradcheck(fn, (zs,), atol=1e-6, fast_mode=True), name


def test_identity_projection_with_one_to_one_chunks_is_plain_kl():
    g = torch.Generator().manual_seed(5)
    T, V = 8, 10
    zs, zt = torch.randn(B, T, V, generator=g), torch.randn(B, T, V, generator=g)
    mask = torch.rand(B, T, generator=g) < 0.8
    chunk = torch.arange(T).expand(B, T).clone()
    align = ChunkAlignment(chunk, chunk.clone(), torch.ones(B, T, dtype=torch.bool),
                           torch.ones(B, T, dtype=torch.bool))
    eye = projection_from_csr(np.arange(V + 1), np.arange(V), np.ones(V), (V, V))
    plain = forward_kl(zs, zt, mask, temperature=1.5)
    assert count_loss_chunks(align, mask) == int(mask[:, 1:].sum())
    assert float(projected_kl(zs, zt, align, eye, s_loss_mask_BTs=mask, temperature=1.5)) == \
        pytest.approx(float(plain), rel=1e-6)
    everything = torch.arange(V)
    assert float(exact_kl(zs, zt, align, everything, everything, s_loss_mask_BTs=mask,
                          temperature=1.5)) == pytest.approx(float(plain), rel=1e-6)


def test_identical_distributions_give_zero():
    g = torch.Generator().manual_seed(6)
    T, V = 8, 10
    zs = torch.randn(B, T, V, generator=g)
    chunk = torch.arange(T).expand(B, T).clone()
    align = ChunkAlignment(chunk, chunk.clone(), torch.ones(B, T, dtype=torch.bool),
                           torch.ones(B, T, dtype=torch.bool))
    eye = projection_from_csr(np.arange(V + 1), np.arange(V), np.ones(V), (V, V))
    ids = torch.randint(0, V, (B, T), generator=g)
    idx = torch.arange(V)
    assert abs(float(projected_kl(zs, zs, align, eye))) < 1e-6
    assert abs(float(exact_kl(zs, zs, align, idx, idx))) < 1e-6
    assert abs(float(uld(zs, zs, align))) < 1e-6
    assert abs(float(gold_hybrid(zs, zs, align, idx[:4], idx[:4]))) < 1e-6
    assert abs(float(alm(zs, ids, align, teacher_logits_BTtVt=zs, teacher_ids_BTt=ids,
                         variant="abs"))) < 1e-6
    # BCE is minimal (zero gradient), not zero, at l^S = l^T
    x = zs.double().requires_grad_(True)
    alm(x, ids, align, teacher_logits_BTtVt=zs.double(), teacher_ids_BTt=ids).backward()
    assert x.grad.abs().max() < 1e-10


def test_no_nan_or_inf_with_minus_inf_logits_and_padding():
    c = _case(7)
    zs, zt, align = c["zs"].clone(), c["zt"].clone(), c["align"]
    zs[..., 5] = -math.inf
    zt[..., 12] = -math.inf
    zt[..., 0] = -math.inf
    # rows nobody reads: outputs at the last real token and on padding
    s_len, t_len = c["lens"]
    zs[torch.arange(zs.shape[1]).expand(B, -1) >= torch.as_tensor(s_len)[:, None] - 1] = -math.inf
    zt[torch.arange(zt.shape[1]).expand(B, -1) >= torch.as_tensor(t_len)[:, None] - 1] = math.nan
    zs_req = zs.requires_grad_(True)
    for name, loss in _losses(dict(c, zt=zt), zs=zs_req, chunk_size=2).items():
        assert torch.isfinite(loss), name
        (g,) = torch.autograd.grad(loss, zs_req)
        assert torch.isfinite(g).all(), name


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_chunked_equals_unchunked(chunk):
    c = _case(8)
    a, b = _losses(c, chunk_size=chunk), _losses(c, chunk_size=None)
    for name in a:
        assert float(a[name]) == pytest.approx(float(b[name]), rel=1e-6), name


def test_chunk_helpers():
    s = torch.tensor([[-1, 0, 0, 1, -1, 2, -1]])
    t = torch.tensor([[0, 1, 1, 2, 2, -1]])
    align = ChunkAlignment(s, t, torch.tensor([[True, True, True, False]]),
                           torch.tensor([[False, False, False, False]]))
    start, end = chunk_bounds(s, 4)
    assert start.tolist() == [[1, 3, 5, -1]] and end.tolist() == [[3, 4, 6, -1]]
    # chunk 0 starts at teacher token 0: dropped; masking student token 5 drops chunk 2
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 1]], dtype=torch.bool)
    assert loss_chunks(align, mask).tolist() == [[False, True, False, False]]
    assert count_loss_chunks(align) == 2


def test_projection_from_csr_validates():
    W = random_projection(np.random.default_rng(0), 5, 6)
    P = _proj(W)
    assert torch.allclose(P.to_dense().double(), torch.from_numpy(W), atol=1e-7)
    bad = W.copy()
    bad[2] *= 0.5
    import scipy.sparse as sp
    csr = sp.csr_matrix(bad)
    with pytest.raises(ValueError, match="row 2"):
        projection_from_csr(csr.indptr, csr.indices, csr.data, csr.shape)
    with pytest.raises(ValueError, match="does not match"):
        projected_kl(torch.zeros(1, 2, 4), torch.zeros(1, 2, 6), _case(0)["align"], P)
