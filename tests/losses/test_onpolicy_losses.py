"""On-policy losses: float64 references of k1/k3/clamps/chunk log-ratios, gradcheck, zero at
teacher == student for every loss kind, reward weighting and normalisation.

Legend: B batch, Ts/Tt student/teacher tokens, V vocabulary, C chunks, K top-k.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from xdistill.losses import ChunkAlignment
from xdistill.losses.onpolicy_kinds import KINDS_2026
from xdistill.losses.onpolicy import (ONPOLICY_LOSSES, Clamps, OnPolicyLossSpec,
                                      count_onpolicy_units, input_token_logprobs, onpolicy_loss,
                                      reward_weights, sampled_loss)


def _logsoftmax(z):
    z = np.asarray(z, np.float64)
    m = z.max()
    return z - m - math.log(np.exp(z - m).sum())


def _token_logp_ref(z_BTV, ids_BT):
    """log p(ids[b,i] | ...) at input positions from logits at output positions (float64)."""
    z, ids = z_BTV.detach().double().numpy(), ids_BT.numpy()
    out = np.zeros(ids.shape)
    for b in range(ids.shape[0]):
        for i in range(1, ids.shape[1]):
            out[b, i] = _logsoftmax(z[b, i - 1])[ids[b, i]]
    return out


def _sampled_ref(kind, s_units, t_units, w_units, count, logp_min=None, loss_max=10.0,
                 exp_clip=20.0):
    """sum_u w_u * loss_u / count from the definitions; s/t_units are lists of token log-prob lists
    (``logp_min`` None: no floor)."""
    if logp_min is None:
        logp_min = -math.inf
    total = 0.0
    fired = {"logp_floor_student": 0, "logp_floor_teacher": 0, "exp_clip": 0, "loss_clamp": 0}
    for s_tok, t_tok, w in zip(s_units, t_units, w_units):
        fired["logp_floor_student"] += sum(x < logp_min for x in s_tok)
        fired["logp_floor_teacher"] += sum(x < logp_min for x in t_tok)
        ls = sum(max(x, logp_min) for x in s_tok)
        lt = sum(max(x, logp_min) for x in t_tok)
        r = lt - ls
        if kind == "k1":
            fired["loss_clamp"] += abs(r) > loss_max
            value = -min(max(r, -loss_max), loss_max) * ls
        else:
            fired["exp_clip"] += abs(r) > exp_clip
            rc = min(max(r, -exp_clip), exp_clip)
            k3 = math.exp(rc) - 1 - rc
            fired["loss_clamp"] += abs(k3) > loss_max
            value = min(max(k3, -loss_max), loss_max)
        total += w * value
    return total / count, fired


def _inputs(seed=0, B=2, T=7, V=11, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    zs = (torch.randn(B, T, V, generator=g, dtype=torch.float64) * scale)
    zt = (torch.randn(B, T, V, generator=g, dtype=torch.float64) * scale)
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.rand(B, T, generator=g) < 0.8
    return zs, zt, ids, mask


def test_clamp_defaults_have_no_logprob_floor():
    """The log-prob floor is off by default (a floor rewards units both models reject); the
    advantage/loss clamp (10) and the exponent clip (20) stay on, in the spec and the config."""
    from xdistill.train.onpolicy_config import OnPolicyLossConfig
    assert Clamps() == Clamps(logp_min=None, loss_max=10.0, exp_clip=20.0)
    assert OnPolicyLossSpec("k1").clamps.logp_min is None
    cfg = OnPolicyLossConfig()
    assert (cfg.logp_min, cfg.loss_max, cfg.exp_clip) == (None, 10.0, 20.0)


def test_default_k1_ranks_an_impossible_unit_below_an_unlikely_one():
    """Without the floor a unit both models find impossible (log p = log q = -30 would tie at
    r = 0 under a -10 floor) keeps its true log-ratio, and a unit the teacher finds less likely
    than the student gets a negative advantage however small both log-probs are."""
    s_logp = torch.tensor([[0.0, -30.0, -6.0]], dtype=torch.float64, requires_grad=True)
    t_logp = torch.tensor([[0.0, -40.0, -5.0]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    out = sampled_loss("k1", s_logp, t_logp, mask, clamps=Clamps(), num_valid=2)
    (g,) = torch.autograd.grad(out.loss, s_logp)
    # loss = -(A_1 log p_1 + A_2 log p_2) / 2, A = clamp(r, +-10) = (-10, +1)
    assert g[0, 1].item() == pytest.approx(10.0 / 2) and g[0, 2].item() == pytest.approx(-1.0 / 2)
    assert out.counters["logp_floor_student"] == out.counters["logp_floor_teacher"] == 0
    floored = sampled_loss("k1", s_logp, t_logp, mask, clamps=Clamps(logp_min=-10.0), num_valid=2)
    (g_floor,) = torch.autograd.grad(floored.loss, s_logp)
    assert g_floor[0, 1].item() == 0.0  # the floor: r = 0 and no gradient at the impossible unit


@pytest.mark.parametrize("kind", ["k1", "k3"])
@pytest.mark.parametrize("clamps", [Clamps(), Clamps(-10.0, 10.0, 20.0), Clamps(-2.0, 1.5, 0.5)])
def test_same_tokenizer_sampled_matches_float64_reference(kind, clamps):
    zs, zt, ids, mask = _inputs(1)
    w_B = torch.tensor([0.5, 2.0], dtype=torch.float64)
    spec = OnPolicyLossSpec(kind, clamps=clamps)
    out = onpolicy_loss(spec, zs, ids, mask, teacher_logits_BTtV=zt, sample_weight_B=w_B,
                        num_valid=13)
    s_ref, t_ref = _token_logp_ref(zs, ids), _token_logp_ref(zt, ids)
    units = [(b, i) for b in range(2) for i in range(1, 7) if mask[b, i]]
    ref, fired = _sampled_ref(kind, [[s_ref[u]] for u in units], [[t_ref[u]] for u in units],
                              [float(w_B[u[0]]) for u in units], 13, clamps.logp_min,
                              clamps.loss_max, clamps.exp_clip)
    assert float(out.loss) == pytest.approx(ref, rel=1e-9, abs=1e-12)
    assert out.counters == fired and out.units == len(units)
    if clamps.loss_max == 1.5:
        assert sum(fired.values()) > 0  # the tight clamps actually fire


def test_k1_mean_baseline_matches_float64_reference():
    """baseline "mean": A_u = clamp(r_u - mean_v r_v); loss = -sum_u w_u A_u log p(u) / count."""
    zs, zt, ids, mask = _inputs(5)
    clamps = Clamps(-10.0, 1.0, 20.0)  # a floor and a tight clamp, applied after the centring
    out = sampled_loss("k1", input_token_logprobs(zs, ids, mask), input_token_logprobs(zt, ids),
                       mask, clamps=clamps, num_valid=9, baseline="mean")
    s_ref, t_ref = _token_logp_ref(zs, ids), _token_logp_ref(zt, ids)
    units = [(b, i) for b in range(2) for i in range(1, 7) if mask[b, i]]
    r = [max(t_ref[u], -10.0) - max(s_ref[u], -10.0) for u in units]
    mean = sum(r) / len(r)
    ref = sum(-min(max(x - mean, -1.0), 1.0) * max(s_ref[u], -10.0) for x, u in zip(r, units)) / 9
    assert float(out.loss) == pytest.approx(ref, rel=1e-9, abs=1e-12)
    assert out.counters["loss_clamp"] == sum(abs(x - mean) > 1.0 for x in r) > 0
    assert out.mean_logratio == pytest.approx(mean, rel=1e-9)  # the diagnostic stays uncentred


def test_k1_baseline_turns_all_negative_advantages_into_both_signs():
    """A teacher that rates every sample far below the student: uncentred, every sampled token's
    log-prob gets pushed down; centred, the better-rated half is pushed up."""
    zs, _, ids, mask = _inputs(6)
    s_logp = input_token_logprobs(zs.clone().requires_grad_(True), ids, mask)
    t_logp = s_logp.detach() - 5.0 - torch.rand(s_logp.shape, generator=torch.Generator().manual_seed(0),
                                                dtype=torch.float64)
    for baseline, want_pos in (("none", False), ("mean", True)):
        s = s_logp.detach().clone().requires_grad_(True)
        sampled_loss("k1", s, t_logp, mask, clamps=Clamps(None, None, None), baseline=baseline
                     ).loss.backward()
        g = s.grad[:, 1:][mask[:, 1:]]
        assert bool((g < 0).any()) == want_pos and bool((g > 0).any())  # grad > 0: pushed down
    s = s_logp.detach().clone().requires_grad_(True)
    out = sampled_loss("k1", s, s.detach(), mask, baseline="mean")  # self-teacher: zero
    out.loss.backward()
    assert float(out.loss.detach()) == 0.0 and float(s.grad.abs().max()) == 0.0


def test_baseline_is_validated():
    with pytest.raises(ValueError, match="baseline"):
        OnPolicyLossSpec("k1", baseline="median")


def _chunked_units(seed: int):
    """(alignment, student and teacher sampled-token log-probs, loss mask, per unit: the
    student's and the teacher's summed log-probs and its student tokens) over
    :func:`_chunked_alignment`'s seven units, from the definition."""
    al = _chunked_alignment()
    g = torch.Generator().manual_seed(seed)
    s_logp = -torch.rand(2, 7, generator=g, dtype=torch.float64) * 9
    t_logp = -torch.rand(2, 9, generator=g, dtype=torch.float64) * 9
    mask = torch.ones(2, 7, dtype=torch.bool)
    units = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2)]
    s_u = [sum(float(s_logp[b, i]) for i in range(7) if al.s_chunk_BTs[b, i] == c) for b, c in units]
    t_u = [sum(float(t_logp[b, j]) for j in range(9) if al.t_chunk_BTt[b, j] == c) for b, c in units]
    n_u = [sum(1 for i in range(7) if al.s_chunk_BTs[b, i] == c) for b, c in units]
    return al, s_logp, t_logp, mask, s_u, t_u, n_u


def test_k1_token_mean_baseline_matches_float64_reference():
    """baseline "token_mean" over chunks: A_u = clamp(r_u - n_u * sum_v r_v / sum_v n_v), n_u the
    unit's student tokens; a same-tokenizer teacher (one token per unit) gives "mean" exactly."""
    al, s_logp, t_logp, mask, s_u, t_u, n_u = _chunked_units(11)
    clamps = Clamps(None, 2.0, None)
    out = sampled_loss("k1", s_logp, t_logp, mask, align=al, clamps=clamps, num_valid=7,
                       baseline="token_mean")
    assert sorted(set(n_u)) == [1, 2]           # units of one and of two student tokens
    r = [t - s for s, t in zip(s_u, t_u)]
    per_tok = sum(r) / sum(n_u)
    adv = [min(max(x - n * per_tok, -2.0), 2.0) for x, n in zip(r, n_u)]
    ref = sum(-a * s for a, s in zip(adv, s_u)) / 7
    assert float(out.loss) == pytest.approx(ref, rel=1e-9, abs=1e-12)
    assert out.counters["loss_clamp"] == sum(abs(x - n * per_tok) > 2.0 for x, n in zip(r, n_u))
    # one token per unit: token_mean is mean
    zs, zt, ids, m = _inputs(5)
    a, b = (sampled_loss("k1", input_token_logprobs(zs, ids, m), input_token_logprobs(zt, ids), m,
                         clamps=clamps, baseline=bl).loss for bl in ("mean", "token_mean"))
    assert float(a) == float(b)


def test_token_mean_baseline_does_not_depend_on_how_units_group_tokens():
    """Merging two student tokens into one unit (a teacher chunk spanning both) leaves the
    baseline's per-token value unchanged under "token_mean" and moves it under "mean"; a
    self-teacher (r = 0 everywhere) gives zero loss and zero gradient."""
    s_logp = torch.tensor([[0.0, -1.0, -3.0, -0.5, -6.0]], dtype=torch.float64)
    t_logp = torch.tensor([[0.0, -2.0, -3.5, -0.7, -14.0]], dtype=torch.float64)
    mask = torch.ones(1, 5, dtype=torch.bool)
    split = ChunkAlignment(torch.tensor([[-1, 0, 1, 2, 3]]), torch.tensor([[-1, 0, 1, 2, 3]]),
                           torch.ones(1, 4, dtype=torch.bool), torch.ones(1, 4, dtype=torch.bool))
    merged = ChunkAlignment(torch.tensor([[-1, 0, 1, 1, 2]]), torch.tensor([[-1, 0, 1, 1, 2]]),
                            torch.ones(1, 3, dtype=torch.bool), torch.ones(1, 3, dtype=torch.bool))
    r = (t_logp - s_logp)[0, 1:]
    for baseline, same in (("token_mean", True), ("mean", False)):
        grads = []
        for al in (split, merged):
            s = s_logp.clone().requires_grad_(True)
            sampled_loss("k1", s, t_logp, mask, align=al, clamps=Clamps(None, None, None),
                         num_valid=1, baseline=baseline).loss.backward()
            grads.append(s.grad[0, 1:])
        # the first unit (one token, untouched by the merge): its advantage is -grad
        assert (float(grads[0][0]) == pytest.approx(float(grads[1][0]), abs=1e-12)) == same
    assert float(-grads[0][0]) == pytest.approx(float(r[0] - r.mean()), abs=1e-12)
    s = s_logp.clone().requires_grad_(True)
    out = sampled_loss("k1", s, s.detach(), mask, align=merged, baseline="token_mean")
    out.loss.backward()
    assert float(out.loss.detach()) == 0.0 and float(s.grad.abs().max()) == 0.0


def _chunked_alignment():
    """Two rows; student chunks of 1-2 tokens, teacher chunks of 1-3 tokens; some unaligned."""
    s_chunk = torch.tensor([[-1, 0, 1, 1, 2, -1, 3], [-1, -1, 0, 1, 2, 2, -1]])
    t_chunk = torch.tensor([[-1, 0, 0, 1, 2, 2, 2, 3, -1], [-1, 0, 1, 1, 2, -1, -1, -1, -1]])
    valid = torch.tensor([[True, True, True, True], [True, True, True, False]])
    exact = torch.tensor([[False, False, False, True], [True, False, False, False]])
    return ChunkAlignment(s_chunk, t_chunk, valid, exact)


@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_chunk_logratio_matches_float64_reference(kind):
    al = _chunked_alignment()
    g = torch.Generator().manual_seed(3)
    s_logp = -torch.rand(2, 7, generator=g, dtype=torch.float64) * 13
    t_logp = -torch.rand(2, 9, generator=g, dtype=torch.float64) * 13
    s_mask = torch.ones(2, 7, dtype=torch.bool)
    s_mask[1, 4] = False                        # chunk 2 of row 1 has a masked student token
    t_mask = torch.ones(2, 9, dtype=torch.bool)
    t_mask[0, 7] = False                        # chunk 3 of row 0 has a masked teacher token
    out = sampled_loss(kind, s_logp, t_logp, s_mask, align=al, t_loss_mask_BTt=t_mask)
    units = {(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)}
    s_units, t_units = [], []
    for b, c in sorted(units):
        s_units.append([float(s_logp[b, i]) for i in range(7) if al.s_chunk_BTs[b, i] == c])
        t_units.append([float(t_logp[b, j]) for j in range(9) if al.t_chunk_BTt[b, j] == c])
    ref, fired = _sampled_ref(kind, s_units, t_units, [1.0] * len(units), len(units))
    assert out.units == len(units)
    assert float(out.loss) == pytest.approx(ref, rel=1e-9)
    assert out.counters == fired


def test_gradcheck_k3():
    kind = "k3"
    al = _chunked_alignment()
    g = torch.Generator().manual_seed(5)
    s_logp = (-torch.rand(2, 7, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    t_logp = -torch.rand(2, 9, generator=g, dtype=torch.float64) * 3
    mask = torch.ones(2, 7, dtype=torch.bool)
    w_B = torch.tensor([1.0, 0.3], dtype=torch.float64)

    def f(x):
        return sampled_loss(kind, x, t_logp, mask, align=al, sample_weight_B=w_B).loss

    assert torch.autograd.gradcheck(f, (s_logp,))
    zs, zt, ids, m = _inputs(7, V=5, scale=1.0)
    zs.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda z: onpolicy_loss(OnPolicyLossSpec(kind), z, ids, m, teacher_logits_BTtV=zt).loss, (zs,))


def test_k1_gradient_matches_surrogate_from_logits():
    """k1's gradient equals that of sum_u -A_u log p(u) with A_u = r_u held constant (float64)."""
    zs, zt, ids, m = _inputs(29, V=5, scale=1.0)
    zs.requires_grad_(True)
    out = onpolicy_loss(OnPolicyLossSpec("k1", clamps=Clamps(None, None, None)), zs, ids, m,
                        teacher_logits_BTtV=zt)
    (g,) = torch.autograd.grad(out.loss, zs)
    lp_s = torch.log_softmax(zs, -1)[:, :-1].gather(2, ids[:, 1:, None]).squeeze(2)
    lp_t = torch.log_softmax(zt, -1)[:, :-1].gather(2, ids[:, 1:, None]).squeeze(2)
    sel = m[:, 1:]
    surrogate = (-(lp_t - lp_s).detach() * lp_s)[sel].sum() / int(sel.sum())
    (g_ref,) = torch.autograd.grad(surrogate, zs)
    assert torch.allclose(g, g_ref, atol=1e-12)


def test_k1_gradient_is_policy_gradient():
    """d/dlogp of -sg(r) log p is -r (k1 as an advantage), not the gradient of -r."""
    s = torch.tensor([[0.0, -1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    t = torch.tensor([[0.0, -0.5, -4.0]], dtype=torch.float64)
    out = sampled_loss("k1", s, t, torch.ones(1, 3, dtype=torch.bool), num_valid=1)
    (g,) = torch.autograd.grad(out.loss, s)
    assert torch.allclose(g, torch.tensor([[0.0, -0.5, 2.0]], dtype=torch.float64))
    out3 = sampled_loss("k3", s, t, torch.ones(1, 3, dtype=torch.bool), num_valid=1)
    (g3,) = torch.autograd.grad(out3.loss, s)       # d k3 / d log p = 1 - e^r
    assert torch.allclose(g3, torch.tensor([[0.0, 1 - math.exp(0.5), 1 - math.exp(-2.0)]],
                                           dtype=torch.float64))


def test_clamps_block_gradient_and_count():
    s = torch.tensor([[0.0, -30.0, -1.0, -0.1]], dtype=torch.float64, requires_grad=True)
    t = torch.tensor([[0.0, -1.0, -25.0, -0.1]], dtype=torch.float64)
    out = sampled_loss("k3", s, t, torch.ones(1, 4, dtype=torch.bool), num_valid=1,
                       clamps=Clamps(logp_min=-10.0, loss_max=10.0, exp_clip=5.0))
    # token1: s floored -> r = 9 > exp_clip 5 -> k3 = e^5 - 6 > 10 -> loss clamped
    # token2: t floored -> r = -9 -> exp clipped to -5 -> k3 = e^-5 + 4
    assert out.counters == {"logp_floor_student": 1, "logp_floor_teacher": 1, "exp_clip": 2,
                            "loss_clamp": 1}
    assert float(out.loss.detach()) == pytest.approx(10.0 + math.exp(-5) + 4.0)
    (g,) = torch.autograd.grad(out.loss, s)
    assert g[0, 1] == 0 and g[0, 2] == 0 and g[0, 3] == 0


def _same_teacher_inputs(kind, zs, ids):
    zt = zs.detach().clone()
    kw = dict(teacher_logits_BTtV=zt)
    if kind == "topk_kl":
        lp = torch.log_softmax(zt, -1)
        kw = dict(topk_logp_BTtK=lp.topk(4, -1).values, topk_idx_BTtK=lp.topk(4, -1).indices)
    return kw


# the kinds with same-tokenizer inputs and reward weights (the 2026 kinds work on chunks and
# take no per-sample weights; their self-teacher tests are in test_strict/test_policy/
# test_byteprefix and tests/rollout/test_scoring.py)
CLASSIC = tuple(k for k in ONPOLICY_LOSSES if k not in KINDS_2026)


@pytest.mark.parametrize("kind", CLASSIC)
@pytest.mark.parametrize("clamps", [Clamps(), Clamps(None, None, None)])
def test_identical_teacher_gives_zero_loss_and_gradient(kind, clamps):
    zs, _, ids, mask = _inputs(11, scale=2.0)
    zs = zs.float().requires_grad_(True)
    w_B = torch.tensor([1.0, 0.25])
    out = onpolicy_loss(OnPolicyLossSpec(kind, clamps=clamps), zs, ids, mask,
                        sample_weight_B=w_B, **_same_teacher_inputs(kind, zs, ids))
    (g,) = torch.autograd.grad(out.loss, zs)
    assert abs(float(out.loss.detach())) < 1e-6
    assert float(g.abs().max()) < 1e-6
    assert out.units == int(mask[:, 1:].sum())


@pytest.mark.parametrize("kind", ["reverse_kl", "jsd"])
def test_full_loss_reward_weighting_is_per_row_weighted_sum(kind):
    zs, zt, ids, mask = _inputs(13)
    w_B = torch.tensor([0.2, 1.7], dtype=torch.float64)
    spec = OnPolicyLossSpec(kind, beta=0.3)
    n = count_onpolicy_units(spec, mask)
    weighted = onpolicy_loss(spec, zs, ids, mask, teacher_logits_BTtV=zt, sample_weight_B=w_B)
    rows = []
    for b in range(2):
        m = mask.clone()
        m[1 - b] = False
        rows.append(onpolicy_loss(spec, zs, ids, m, teacher_logits_BTtV=zt, num_valid=n).loss)
    assert float(weighted.loss) == pytest.approx(float(0.2 * rows[0] + 1.7 * rows[1]), rel=1e-9)


def test_normalisation_by_global_count_and_reward_weights():
    zs, zt, ids, mask = _inputs(17)
    spec = OnPolicyLossSpec("k3")
    local = onpolicy_loss(spec, zs, ids, mask, teacher_logits_BTtV=zt)
    glob = onpolicy_loss(spec, zs, ids, mask, teacher_logits_BTtV=zt, num_valid=4 * local.units)
    assert float(glob.loss) == pytest.approx(float(local.loss) / 4, rel=1e-9)
    w = reward_weights(torch.tensor([1.0, 0.0, 0.0, 1.0]), beta=0.5)
    assert float(w.sum()) == pytest.approx(4.0) and float(w[0]) > float(w[1])


def test_cross_tokenizer_needs_the_right_inputs():
    zs, zt, ids, mask = _inputs(19)
    al = ChunkAlignment(torch.full((2, 7), -1), torch.full((2, 7), -1),
                        torch.zeros(2, 1, dtype=torch.bool), torch.zeros(2, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="same-tokenizer"):
        onpolicy_loss(OnPolicyLossSpec("topk_kl"), zs, ids, mask, align=al,
                      topk_logp_BTtK=zt[..., :3], topk_idx_BTtK=ids[..., None].expand(2, 7, 3))
    with pytest.raises(ValueError, match="projection"):
        onpolicy_loss(OnPolicyLossSpec("reverse_kl"), zs, ids, mask, align=al, teacher_logits_BTtV=zt)
    with pytest.raises(ValueError, match="unknown on-policy loss"):
        OnPolicyLossSpec("k2")


def test_input_token_logprobs_matches_reference():
    zs, _, ids, _ = _inputs(23)
    got = input_token_logprobs(zs, ids, temperature=1.0)
    assert np.allclose(got.numpy(), _token_logp_ref(zs, ids), atol=1e-12)


def test_simple_opd_counts_unpaired_tokens_once():
    """SimpleOPD's units are every student loss token (i >= 1), unpaired ones included: the
    unpaired penalty adds its term to the loss but no second unit to the normaliser."""
    al = _chunked_alignment()
    B, Ts = al.s_chunk_BTs.shape
    g = torch.Generator().manual_seed(17)
    zs = torch.randn(B, Ts, 11, generator=g, dtype=torch.float64)
    ids = torch.randint(0, 11, (B, Ts), generator=g)
    mask = torch.ones(B, Ts, dtype=torch.bool)
    unpaired = (al.s_chunk_BTs < 0) & mask
    unpaired[:, 0] = False
    assert int(unpaired.sum()) == 3
    beh = input_token_logprobs(zs, ids, mask).detach()
    t_logp = -torch.rand(al.t_chunk_BTt.shape, generator=g, dtype=torch.float64) * 5
    spec = OnPolicyLossSpec("simple_opd")
    n = count_onpolicy_units(spec, mask, al, unpaired_BTs=unpaired)
    assert n == int(mask[:, 1:].sum()) == 12
    kw = dict(align=al, teacher_token_logp_BTt=t_logp, behaviour_logp_BTs=beh,
              ref_logp_BTs=beh - 0.2)
    with_pen = onpolicy_loss(spec, zs, ids, mask, unpaired_BTs=unpaired, **kw)
    without = onpolicy_loss(spec, zs, ids, mask, **kw)
    assert with_pen.units == without.units == n and with_pen.counters["unpaired"] == 3
    # the penalty term: -sg(A_i) log p(y_i) with A_i = clamp(-10 - log p(y_i), +-10), / n
    s_ref = _token_logp_ref(zs, ids)
    pen = sum(-min(max(-10.0 - s_ref[b, i], -10.0), 10.0) * s_ref[b, i]
              for b, i in zip(*np.nonzero(unpaired.numpy())))
    assert float(with_pen.loss) == pytest.approx(float(without.loss) + pen / n, rel=1e-10)


def test_k1_clipped_mean_baseline_matches_float64_reference():
    """baseline "clipped_mean" over chunks: c_u = clamp(r_u, -M, M), A_u = clamp(c_u - mean_v c_v,
    -M, M) with M = loss_max; without a clamp it is "mean" exactly; a self-teacher gives 0."""
    al, s_logp, t_logp, mask, s_u, t_u, _ = _chunked_units(12)
    clamps = Clamps(None, 2.0, None)
    out = sampled_loss("k1", s_logp, t_logp, mask, align=al, clamps=clamps, num_valid=7,
                       baseline="clipped_mean")
    clipped = [min(max(t - s, -2.0), 2.0) for s, t in zip(s_u, t_u)]
    assert any(abs(t - s) > 2.0 for s, t in zip(s_u, t_u))     # the first clamp fires
    mean = sum(clipped) / len(clipped)
    adv = [min(max(c - mean, -2.0), 2.0) for c in clipped]
    ref = sum(-a * s for a, s in zip(adv, s_u)) / 7
    assert float(out.loss) == pytest.approx(ref, rel=1e-9, abs=1e-12)
    assert out.counters["loss_clamp"] == sum(abs(c - mean) > 2.0 for c in clipped)
    zs, zt, ids, m = _inputs(5)
    no_clamp = Clamps(None, None, None)
    a, b = (sampled_loss("k1", input_token_logprobs(zs, ids, m), input_token_logprobs(zt, ids), m,
                         clamps=no_clamp, baseline=bl).loss for bl in ("mean", "clipped_mean"))
    assert float(a) == float(b)
    s = input_token_logprobs(zs, ids, m).detach().clone().requires_grad_(True)
    out = sampled_loss("k1", s, s.detach(), m, clamps=clamps, baseline="clipped_mean")
    out.loss.backward()
    assert float(out.loss.detach()) == 0.0 and float(s.grad.abs().max()) == 0.0


def test_clipped_mean_keeps_an_extreme_unit_from_reinforcing_moderate_ones():
    """One unit a sharp teacher scores at -20 nats drags "mean"'s baseline below a moderately
    wrong unit (r = -1.5), which is then reinforced; under "clipped_mean" it is not."""
    s_logp = torch.zeros(1, 5, dtype=torch.float64)
    t_logp = torch.tensor([[0.0, 0.0, 0.0, -1.5, -20.0]], dtype=torch.float64)
    mask = torch.ones(1, 5, dtype=torch.bool)
    signs = {}
    for baseline in ("mean", "clipped_mean"):
        s = s_logp.clone().requires_grad_(True)
        sampled_loss("k1", s, t_logp, mask, clamps=Clamps(None, 2.0, None), num_valid=1,
                     baseline=baseline).loss.backward()
        signs[baseline] = float(-s.grad[0, 3])      # the advantage of the r = -1.5 unit
    assert signs["mean"] > 0 > signs["clipped_mean"]
