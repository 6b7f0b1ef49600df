"""DPCA and SimpleOPD (PPO clipped, sampled-token): float64 references with every clamp firing,
the DPCA split identity, gradcheck, self-teacher invariance, stop tokens, reference KL, masks and
normalisation.

Legend: B batch, Ts/Tt student/teacher tokens, V vocabulary, C chunks.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from loss_refs import random_alignment
from onpolicy_refs import dpca_ref, identity_alignment, ppo_ref, simple_opd_ref, token_logp

from xdistill.losses import (PPOClip, count_dpca_units, count_simple_opd_units, dpca,
                             simple_opd)
from xdistill.losses.chunks import loss_chunks
from xdistill.losses.policy import dpca_advantages, ppo_token_losses

V = 9


def _case(seed, B=3, scale=2.0, n_chunks=30):
    rng = np.random.default_rng(seed)
    align, s_len, t_len = random_alignment(rng, B, n_chunks=n_chunks, exact_p=0.9)
    Ts, Tt = align.s_chunk_BTs.shape[1], align.t_chunk_BTt.shape[1]
    g = torch.Generator().manual_seed(seed)
    zs = torch.randn(B, Ts, V, generator=g, dtype=torch.float64) * scale
    ids = torch.randint(0, V, (B, Ts), generator=g)
    cur = torch.from_numpy(token_logp(zs, ids))
    # behaviour: near the current policy for most tokens, far for some (ratio and dual clips)
    far = torch.rand(B, Ts, generator=g) < 0.3
    beh = torch.where(far, cur - 3 * torch.rand(B, Ts, generator=g, dtype=torch.float64) - 2.5,
                      cur + 0.3 * torch.randn(B, Ts, generator=g, dtype=torch.float64))
    beh = beh.clamp(max=-1e-3)
    t_logp = -torch.rand(B, Tt, generator=g, dtype=torch.float64) * 6
    t_logp[0, 1] = -40.0                                   # forces an advantage clamp
    s_mask = (torch.arange(Ts) < torch.as_tensor(s_len)[:, None]) & \
        (torch.rand(B, Ts, generator=g) < 0.9)
    t_mask = torch.rand(B, Tt, generator=g) < 0.92
    stop = torch.rand(B, Ts, generator=g) < 0.15
    return dict(zs=zs, ids=ids, beh=beh, t_logp=t_logp, align=align, s_mask=s_mask,
                t_mask=t_mask, stop=stop)


def test_ppo_formula_cases():
    """Hand-checked dual-clip PPO values (rho = e^{logp - beh})."""
    logp = torch.tensor([0.0, math.log(2.0), math.log(0.5), math.log(20.0), math.log(20.0)],
                        dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0], dtype=torch.float64)
    loss, rho, counts = ppo_token_losses(logp, torch.zeros(5, dtype=torch.float64), adv, PPOClip())
    # A>0, rho=1: -1; A>0, rho=2: clipped at 1.28 -> -1.28; A<0, rho=.5: clipped at .8 -> .8;
    # A<0, rho=20: max(20, 1.28) = 20 > c=10 -> 10; A>0, rho=20: -1.28
    assert torch.allclose(loss, torch.tensor([-1.0, -1.28, 0.8, 10.0, -1.28], dtype=torch.float64))
    assert counts == {"ratio_clipped": 3, "dual_clipped": 1, "log_ratio_clamped": 0}
    for i in range(5):
        assert float(loss[i]) == pytest.approx(ppo_ref(float(logp[i]), 0.0, float(adv[i]))[0])


@pytest.mark.parametrize("tau,baseline", [(1.0, "none"), (0.7, "none"), (1.0, "mean"),
                                          (1.0, "clipped_mean")])
def test_dpca_matches_float64_reference(tau, baseline):
    c = _case(1)
    loss, stats = dpca(c["zs"], c["ids"], c["beh"], c["t_logp"], c["align"],
                       s_loss_mask_BTs=c["s_mask"], t_loss_mask_BTt=c["t_mask"],
                       temperature=tau, chunk_size=5, baseline=baseline)
    cur = token_logp(c["zs"], c["ids"], tau)
    ref, units, fired = dpca_ref(cur, c["beh"], c["t_logp"], c["align"], s_mask=c["s_mask"],
                                 t_mask=c["t_mask"], baseline=baseline)
    assert stats.units == units == count_dpca_units(c["align"], c["s_mask"], c["t_mask"]) > 5
    assert float(loss) == pytest.approx(ref / units, rel=1e-10)
    assert (stats.adv_clamped, stats.ratio_clipped, stats.dual_clipped, stats.uniform_fallbacks) \
        == (fired["adv_clamped"], fired["ratio_clipped"], fired["dual_clipped"],
            fired["uniform_fallbacks"])
    assert fired["adv_clamped"] and fired["ratio_clipped"] and fired["dual_clipped"]


def test_dpca_split_preserves_chunk_logratio_and_uniform_fallback():
    c = _case(2)
    align = c["align"]
    beh = c["beh"].clone()
    ok = loss_chunks(align, c["s_mask"], c["t_mask"])
    # one multi-token loss chunk gets L_S = 0: the uniform split
    b, k = next((b, k) for b, k in zip(*torch.nonzero(ok, as_tuple=True))
                if int((align.s_chunk_BTs[b] == k).sum()) > 1)
    beh[b][align.s_chunk_BTs[b] == k] = 0.0
    sel, adv, uniform = dpca_advantages(beh, c["t_logp"], align, ok)
    assert uniform == 1
    for bb, kk in zip(*torch.nonzero(ok, as_tuple=True)):
        S = align.s_chunk_BTs[bb] == kk
        LT = float(c["t_logp"][bb][align.t_chunk_BTt[bb] == kk].sum())
        LS = float(beh[bb][S].sum())
        assert float(adv[bb][S].sum()) == pytest.approx(LT - LS, rel=1e-12, abs=1e-12)
        assert bool(sel[bb][S].all())
    S = align.s_chunk_BTs[b] == k
    assert torch.allclose(adv[b][S], adv[b][S][0].expand(int(S.sum())))  # uniform
    loss, stats = dpca(c["zs"], c["ids"], beh, c["t_logp"], align, s_loss_mask_BTs=c["s_mask"],
                       t_loss_mask_BTt=c["t_mask"])
    cur = token_logp(c["zs"], c["ids"])
    ref, units, fired = dpca_ref(cur, beh, c["t_logp"], align, s_mask=c["s_mask"],
                                 t_mask=c["t_mask"])
    assert stats.uniform_fallbacks == fired["uniform_fallbacks"] == 1
    assert float(loss) == pytest.approx(ref / units, rel=1e-10)


@pytest.mark.parametrize("beta,baseline", [(0.0, "none"), (0.3, "none"), (0.3, "mean"),
                                           (0.3, "clipped_mean")])
def test_simple_opd_matches_float64_reference(beta, baseline):
    c = _case(3)
    g = torch.Generator().manual_seed(30)
    ref_logp = c["beh"] + 0.5 * torch.randn(c["beh"].shape, generator=g, dtype=torch.float64)
    kw = dict(ref_logp_BTs=ref_logp, ref_beta=beta) if beta else {"ref_beta": 0.0}
    loss, stats = simple_opd(c["zs"], c["ids"], c["beh"], c["t_logp"], c["align"], c["stop"],
                             c["s_mask"], t_loss_mask_BTt=c["t_mask"], chunk_size=4,
                             ppo=PPOClip(0.1, 0.2, 3.0), adv_clamp=2.0, baseline=baseline, **kw)
    cur = token_logp(c["zs"], c["ids"])
    ref, units, scored = simple_opd_ref(cur, c["beh"], c["t_logp"], c["align"], c["stop"],
                                        c["s_mask"], t_mask=c["t_mask"], adv_clamp=2.0,
                                        ref_logp=ref_logp, beta=beta, ppo=(0.1, 0.2, 3.0),
                                        baseline=baseline)
    assert stats.units == units == count_simple_opd_units(c["s_mask"])
    assert stats.scored == scored and 3 < scored < units and stats.stop_zeroed > 0
    assert float(loss) == pytest.approx(ref / units, rel=1e-10)
    assert math.isnan(stats.ref_kl) == (beta == 0.0)


def test_gradcheck_both():
    c = _case(4, B=1, scale=1.0, n_chunks=6)
    zs = c["zs"].clone().requires_grad_(True)
    ref_logp = c["beh"] - 0.2

    def f_dpca(z):
        return dpca(z, c["ids"], c["beh"], c["t_logp"], c["align"], s_loss_mask_BTs=c["s_mask"],
                    temperature=1.3, chunk_size=3)[0]

    def f_simple(z):
        return simple_opd(z, c["ids"], c["beh"], c["t_logp"], c["align"], c["stop"], c["s_mask"],
                          ref_logp_BTs=ref_logp, ref_beta=0.5, chunk_size=3)[0]

    assert torch.autograd.gradcheck(f_dpca, (zs,))
    assert torch.autograd.gradcheck(f_simple, (zs,))


def test_policy_gradient_direction():
    """Unclipped (rho = 1): d loss / d log q(y_i) = -A_i / units for both losses."""
    c = _case(5, B=2)
    cur = torch.from_numpy(token_logp(c["zs"], c["ids"]))
    zs = c["zs"].clone().requires_grad_(True)
    loss, stats = dpca(zs, c["ids"], cur, c["t_logp"], c["align"], s_loss_mask_BTs=c["s_mask"],
                       adv_clamp=None)
    ok = loss_chunks(c["align"], c["s_mask"])
    sel, adv, _ = dpca_advantages(cur, c["t_logp"], c["align"], ok)
    lp = torch.log_softmax(zs, -1)[:, :-1].gather(2, c["ids"][:, 1:, None]).squeeze(2)
    surrogate = -(adv[:, 1:] * lp)[sel[:, 1:]].sum() / stats.units
    g, = torch.autograd.grad(loss, zs)
    g_ref, = torch.autograd.grad(surrogate, zs)
    assert stats.ratio_clipped == 0 and torch.allclose(g, g_ref, atol=1e-12)


def _self_teacher(B=2, T=8, seed=0):
    zs = (torch.randn(B, T, V, generator=torch.Generator().manual_seed(seed)) * 3)
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed + 1))
    cur = torch.from_numpy(token_logp(zs, ids)).float()
    return zs.requires_grad_(True), ids, cur


def test_self_teacher_gives_zero_loss_and_gradient():
    zs, ids, cur = _self_teacher()
    B, T = ids.shape
    align = identity_alignment(B, T)
    mask = torch.ones(B, T, dtype=torch.bool)
    stop = torch.zeros(B, T, dtype=torch.bool)
    stop[:, -1] = True
    outs = [dpca(zs, ids, cur, cur, align, s_loss_mask_BTs=mask),
            simple_opd(zs, ids, cur, cur, align, stop, mask, ref_logp_BTs=cur, ref_beta=0.7)]
    for loss, stats in outs:
        (g,) = torch.autograd.grad(loss, zs)
        assert stats.units == B * (T - 1)
        assert abs(float(loss.detach())) < 1e-6 and float(g.abs().max()) < 1e-6


def test_masks_and_num_valid():
    c = _case(6)
    kw = dict(s_loss_mask_BTs=c["s_mask"], t_loss_mask_BTt=c["t_mask"])
    loss, stats = dpca(c["zs"], c["ids"], c["beh"], c["t_logp"], c["align"], **kw)
    loss9, _ = dpca(c["zs"], c["ids"], c["beh"], c["t_logp"], c["align"], num_valid=9, **kw)
    assert float(loss9) * 9 == pytest.approx(float(loss) * stats.units, rel=1e-12)
    # teacher log-probs of masked teacher tokens, and their chunks, do not matter
    t2 = torch.where(c["t_mask"], c["t_logp"], torch.full_like(c["t_logp"], -99.0))
    assert float(dpca(c["zs"], c["ids"], c["beh"], t2, c["align"], **kw)[0]) == \
        pytest.approx(float(loss), rel=1e-12)
    ref = dict(ref_logp_BTs=c["beh"] - 0.3)
    sl, sstats = simple_opd(c["zs"], c["ids"], c["beh"], c["t_logp"], c["align"], c["stop"],
                            c["s_mask"], t_loss_mask_BTt=c["t_mask"], **ref)
    sl2, _ = simple_opd(c["zs"], c["ids"], c["beh"], t2, c["align"], c["stop"], c["s_mask"],
                        t_loss_mask_BTt=c["t_mask"], num_valid=5, **ref)
    assert float(sl2) * 5 == pytest.approx(float(sl) * sstats.units, rel=1e-12)


def test_bad_inputs_raise():
    c = _case(7)
    with pytest.raises(ValueError, match="ref_logp_BTs"):
        simple_opd(c["zs"], c["ids"], c["beh"], c["t_logp"], c["align"], c["stop"], c["s_mask"],
                   ref_beta=0.1)
    with pytest.raises(ValueError, match="ref_beta=0"):  # on by default: needs log q_init
        simple_opd(c["zs"], c["ids"], c["beh"], c["t_logp"], c["align"], c["stop"], c["s_mask"])
    with pytest.raises(ValueError, match="teacher_token_logp_BTt"):
        dpca(c["zs"], c["ids"], c["beh"], c["t_logp"][:, :-1], c["align"])
    with pytest.raises(ValueError, match="dual_clip"):
        PPOClip(dual_clip=1.0)


def test_no_units_gives_zero_and_a_zero_gradient():
    c = _case(8)
    zs = c["zs"].clone().requires_grad_(True)
    none = torch.zeros_like(c["s_mask"])
    for loss, stats in (dpca(zs, c["ids"], c["beh"], c["t_logp"], c["align"],
                             s_loss_mask_BTs=none),
                        simple_opd(zs, c["ids"], c["beh"], c["t_logp"], c["align"], c["stop"],
                                   none, ref_beta=0.0)):
        (g,) = torch.autograd.grad(loss, zs)
        assert stats.units == 0 and float(loss.detach()) == 0 and not g.any()


def test_simple_opd_reference_kl_is_on_by_default_as_published():
    """SimpleOPD's student reference KL is on with the published weight 0.5 (He et al.) in the
    loss function, the kind's parameters and the trainer config; the default call equals the
    explicit beta = 0.5 one and differs from beta = 0."""
    from xdistill.losses.onpolicy_kinds import KindParams
    from xdistill.losses.policy import SIMPLE_OPD_REF_BETA
    from xdistill.train.onpolicy_config import OnPolicyTeacherLoss
    assert SIMPLE_OPD_REF_BETA == 0.5
    assert KindParams().ref_beta == 0.5 and OnPolicyTeacherLoss().ref_beta == 0.5
    c = _case(9)
    ref_logp = c["beh"] - 0.4
    args = (c["zs"], c["ids"], c["beh"], c["t_logp"], c["align"], c["stop"], c["s_mask"])
    default, stats = simple_opd(*args, ref_logp_BTs=ref_logp)
    explicit, _ = simple_opd(*args, ref_logp_BTs=ref_logp, ref_beta=0.5)
    off, _ = simple_opd(*args, ref_beta=0.0)
    assert float(default) == float(explicit) and float(default) != pytest.approx(float(off))
    assert stats.ref_kl > 0
