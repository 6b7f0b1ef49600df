"""BPM and ESCD losses: float64 references from the byte-prefix definitions on small synthetic
vocabularies, gradcheck, self-teacher invariance (synthetic and gpt2), the whitespace mask, masks,
normalisation, and a real pair (gpt2 student, qwen2 teacher) end to end.

Legend: B batch, Ts/Tt student/teacher tokens, Vs/Vt vocabularies.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from loss_refs import random_alignment
from onpolicy_refs import byteprefix_ref, identity_alignment, synthetic_tables

from xdistill.losses import BytePrefixTables, bpm, count_byteprefix_units, escd
from xdistill.projection.byteprefix import build_byteprefix_map
from xdistill.tokenization.table import ROLE_EOS, TokenByteTable

S_TAB, T_TAB = synthetic_tables()
S_STOP = [i for i, r in enumerate(S_TAB[1]) if r == ROLE_EOS]
T_STOP = [i for i, r in enumerate(T_TAB[1]) if r == ROLE_EOS]
VS, VT = len(S_TAB[0]), len(T_TAB[0])


def _tables(s_tab=S_TAB, t_tab=T_TAB) -> BytePrefixTables:
    m = build_byteprefix_map(TokenByteTable.from_bytes_list(*s_tab),
                             TokenByteTable.from_bytes_list(*t_tab))
    return BytePrefixTables.from_map(m)


TABLES = _tables()


def _case(seed, dtype=torch.float64, B=3, n_chunks=14):
    rng = np.random.default_rng(seed)
    align, s_len, t_len = random_alignment(rng, B, n_chunks=n_chunks)
    Ts, Tt = align.s_chunk_BTs.shape[1], align.t_chunk_BTt.shape[1]
    g = torch.Generator().manual_seed(seed)
    zs = (torch.randn(B, Ts, VS, generator=g, dtype=torch.float64) * 2).to(dtype)
    zt = (torch.randn(B, Tt, VT, generator=g, dtype=torch.float64) * 2).to(dtype)
    # sampled student tokens: text tokens, biased to ones with child groups and whitespace
    pool = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 14, 10, 4, 1, 11, 3])
    ids = pool[torch.randint(0, pool.numel(), (B, Ts), generator=g)]
    s_mask = (torch.arange(Ts) < torch.as_tensor(s_len)[:, None]) & \
        (torch.rand(B, Ts, generator=g) < 0.9)
    t_mask = torch.rand(B, Tt, generator=g) < 0.93
    return zs, zt, align, ids, s_mask, t_mask


def _ref(zs, zt, align, ids, s_mask, t_mask, **kw):
    return byteprefix_ref(zs, zt, align, ids, S_TAB, T_TAB, s_stop=S_STOP, t_stop=T_STOP,
                          s_mask=s_mask, t_mask=t_mask, **kw)


@pytest.mark.parametrize("fn,child", [(bpm, False), (escd, True)])
@pytest.mark.parametrize("tau,ws", [(1.0, False), (1.6, True)])
def test_matches_float64_reference(fn, child, tau, ws):
    zs, zt, align, ids, s_mask, t_mask = _case(3)
    loss, stats = fn(zs, zt, align, TABLES, ids, s_loss_mask_BTs=s_mask, t_loss_mask_BTt=t_mask,
                     mask_whitespace=ws, temperature=tau, chunk_size=4)
    ref, units, masked, empty = _ref(zs, zt, align, ids, s_mask, t_mask, tau=tau, child=child,
                                     mask_whitespace=ws)
    assert units > 10 and stats.units == units and stats.whitespace_masked == masked
    assert stats.units == count_byteprefix_units(align, ids, TABLES, s_mask, t_mask,
                                                 mask_whitespace=ws)
    assert (masked > 0) == ws
    assert float(loss) == pytest.approx(ref / units, rel=1e-10)
    if child:
        assert stats.child_units > 0 and stats.child_groups > 0
        assert stats.empty_groups == empty > 0 and stats.skipped_mass > 0
    assert 0 < stats.teacher_bot_mass < 1 and stats.bot_floor == 0


def test_float32_close_to_reference():
    zs, zt, align, ids, s_mask, t_mask = _case(8, torch.float32)
    loss, _ = escd(zs, zt, align, TABLES, ids, s_loss_mask_BTs=s_mask)
    ref, units, _, _ = _ref(zs, zt, align, ids, s_mask, None, child=True)
    assert float(loss) == pytest.approx(ref / units, rel=2e-5)


@pytest.mark.parametrize("fn", [bpm, escd])
def test_gradcheck(fn):
    zs, zt, align, ids, s_mask, t_mask = _case(34, B=1, n_chunks=3)
    zs.requires_grad_(True)
    out = fn(zs, zt, align, TABLES, ids, s_loss_mask_BTs=s_mask, mask_whitespace=True)[1]
    assert out.units >= 2 and (fn is bpm or out.child_groups > 0)
    # escd = bpm's root term + the child term: full check; bpm's root code path again in the
    # (random-projection) fast mode
    assert torch.autograd.gradcheck(
        lambda z: fn(z, zt, align, TABLES, ids, s_loss_mask_BTs=s_mask, temperature=1.4,
                     mask_whitespace=True, chunk_size=2)[0], (zs,), fast_mode=fn is bpm)


def _self_teacher(tables, V, ids_pool, B=2, T=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    zs = (torch.randn(B, T, V, generator=g) * 3).requires_grad_(True)
    ids = ids_pool[torch.randint(0, ids_pool.numel(), (B, T), generator=g)]
    align = identity_alignment(B, T)
    for fn in (bpm, escd):
        loss, stats = fn(zs, zs.detach().clone(), align, tables, ids)
        (g_,) = torch.autograd.grad(loss, zs)
        assert stats.units == B * (T - 1) and stats.child_groups == 0
        assert abs(float(loss.detach())) < 1e-5 and float(g_.abs().max()) < 1e-6


def test_self_teacher_synthetic():
    _self_teacher(_tables(S_TAB, S_TAB), VS, torch.arange(VS))


def test_self_teacher_gpt2(get_tokenizer):
    tok = get_tokenizer("gpt2")
    m = build_byteprefix_map(tok, tok)
    tables = BytePrefixTables.from_arrays(**m.arrays())
    _self_teacher(tables, tok.vocab_size, torch.tensor([262, 1169, 220, 198, 50256, 13, 11]),
                  B=1, T=6)


def test_masks_rows_and_num_valid():
    zs, zt, align, ids, s_mask, t_mask = _case(6)
    kw = dict(s_loss_mask_BTs=s_mask, t_loss_mask_BTt=t_mask)
    loss, stats = escd(zs, zt, align, TABLES, ids, **kw)
    loss4, _ = escd(zs, zt, align, TABLES, ids, num_valid=4, **kw)
    assert float(loss4) * 4 == pytest.approx(float(loss) * stats.units, rel=1e-12)
    # only root rows (s_start - 1, t_start - 1) and child rows (s_start) are read
    from xdistill.losses.chunks import chunk_bounds, loss_chunks
    ok = loss_chunks(align, s_mask, t_mask)
    s_start, _ = chunk_bounds(align.s_chunk_BTs, align.num_chunks)
    t_start, _ = chunk_bounds(align.t_chunk_BTt, align.num_chunks)
    b, c = torch.nonzero(ok, as_tuple=True)
    keep_s = torch.zeros(zs.shape[:2], dtype=torch.bool)
    keep_s[b, s_start[b, c] - 1] = True
    keep_s[b, s_start[b, c]] = True
    keep_t = torch.zeros(zt.shape[:2], dtype=torch.bool)
    keep_t[b, t_start[b, c] - 1] = True
    zs2 = torch.where(keep_s[..., None], zs, torch.randn_like(zs) * 4)
    zt2 = torch.where(keep_t[..., None], zt, torch.randn_like(zt) * 4)
    assert float(escd(zs2, zt2, align, TABLES, ids, **kw)[0]) == pytest.approx(float(loss),
                                                                                rel=1e-12)


def test_wider_logits_are_bot_and_complement_floor():
    """Logit columns beyond the tables (padded vocabularies) are bot on both sides."""
    zs, zt, align, ids, s_mask, _ = _case(7)
    pad_s = torch.randn(*zs.shape[:2], 3, dtype=zs.dtype)
    pad_t = torch.randn(*zt.shape[:2], 2, dtype=zt.dtype)
    loss, _ = bpm(torch.cat([zs, pad_s], -1), torch.cat([zt, pad_t], -1), align, TABLES, ids,
                  s_loss_mask_BTs=s_mask)
    s_tab = (S_TAB[0] + [b"q"] * 3, S_TAB[1] + [0] * 3)     # "q" prefixes no teacher token
    t_tab = (T_TAB[0] + [b"\x01"] * 2, T_TAB[1] + [0] * 2)  # "\x01" has no student prefix
    ref, units, _, _ = byteprefix_ref(torch.cat([zs, pad_s], -1), torch.cat([zt, pad_t], -1),
                                      align, ids, s_tab, t_tab, s_stop=S_STOP, t_stop=T_STOP,
                                      s_mask=s_mask)
    assert float(loss) == pytest.approx(ref / units, rel=1e-10)
    # a student whose every column is a coordinate has qbar(bot) = 0: floored, counted, finite
    full = _tables((S_TAB[0][1:9], S_TAB[1][1:9]), T_TAB)   # ids 1..8 of the student, no roles
    z8 = zs[..., 1:9].clone().requires_grad_(True)
    ids8 = (ids % 8)
    loss8, stats8 = bpm(z8, zt, align, full, ids8, s_loss_mask_BTs=s_mask)
    (g,) = torch.autograd.grad(loss8, z8)
    assert stats8.bot_floor == stats8.units > 0
    assert torch.isfinite(loss8) and torch.isfinite(g).all()


def test_real_pair_gpt2_student_qwen2_teacher(get_tokenizer):
    """End to end on real vocabularies: finite, positive, matching a float64 rerun, and ESCD's
    child term present for a student token that teacher tokens extend."""
    s_tok, t_tok = get_tokenizer("gpt2"), get_tokenizer("qwen2")
    m = build_byteprefix_map(s_tok, t_tok)
    tables = BytePrefixTables.from_arrays(**m.arrays())
    a = s_tok.encode(" the", add_special_tokens=False).ids[0]
    assert int(tables.a_ptr[a + 1] - tables.a_ptr[a]) > 0
    B, T = 1, 5
    g = torch.Generator().manual_seed(0)
    zs = torch.randn(B, T, s_tok.vocab_size, generator=g)
    zt = torch.randn(B, T, t_tok.vocab_size + 128, generator=g)  # padded teacher logits
    ids = torch.tensor([[262, a, 318, a, 13]])
    align = identity_alignment(B, T)
    out32 = [fn(zs, zt, align, tables, ids) for fn in (bpm, escd)]
    l64, _ = escd(zs.double(), zt.double(), align, tables, ids)
    assert all(torch.isfinite(loss) and float(loss) > 0 for loss, _ in out32)
    assert float(out32[1][0]) == pytest.approx(float(l64), rel=1e-4)
    assert out32[1][1].child_units == 4 and float(out32[1][0]) > float(out32[0][0])


def test_no_units_gives_zero_and_a_zero_gradient():
    zs, zt, align, ids, s_mask, _ = _case(9)
    zs.requires_grad_(True)
    for fn in (bpm, escd):
        loss, stats = fn(zs, zt, align, TABLES, ids, s_loss_mask_BTs=torch.zeros_like(s_mask))
        (g,) = torch.autograd.grad(loss, zs)
        assert stats.units == 0 and float(loss.detach()) == 0 and not g.any()
    assert TABLES.to("cpu") is TABLES
