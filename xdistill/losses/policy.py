"""Sampled-token policy losses across tokenizers: DPCA and SimpleOPD, both PPO clipped.

Legend: B batch, Ts/Tt student/teacher tokens, Vs vocabulary, C chunks, N units (student tokens).

Inputs at *input* positions (the distribution predicting token ``i`` is the output at ``i - 1``):
``student_ids_BTs`` the sampled tokens ``y``; ``behaviour_logp_BTs[b, i] = l_i = log q_old(y_i)``,
the rollout-time log-prob; ``teacher_token_logp_BTt[b, j] = log p(t_j)`` the teacher's log-prob
of its own token ``j`` (constants, floored at ``LOGP_FLOOR``). The current log-prob
``log q(y_i) = log softmax(z_s[i - 1] / tau)[y_i]`` is the only differentiable quantity.

**Clipped policy loss** (dual-clip PPO), per student token with a fixed advantage ``A_i``::

    rho_i  = exp(clip(log q(y_i) - l_i, -log_ratio_max, log_ratio_max))
    l_clip = max(-A_i * rho_i, -A_i * clip(rho_i, 1 - eps_low, 1 + eps_high))
    loss_i = min(l_clip, -c * A_i)   if A_i < 0 and dual clip c is set (c > 1)
    loss_i = l_clip                  otherwise

i.e. ``-min(rho A, clip(rho) A)``, and for negative advantages the loss is bounded by ``-c A``
(the ratio's influence is capped at ``c``). Counters: ``ratio_clipped`` (the clipped branch is the
larger, so its gradient is 0), ``dual_clipped`` (the ``-c A`` bound is active), and
``log_ratio_clamped``. ``A_i`` is clamped to ``[-adv_clamp, adv_clamp]`` first (``adv_clamped``).

**DPCA** (chunk-level credit). For each loss chunk ``c`` (:func:`loss_chunks`) with ``m`` student
tokens: ``L_T = sum_{j in T_c} log p(t_j)``, ``L_S = sum_{i in S_c} l_i`` and

    A_i = (L_T / L_S - 1) * l_i          (so sum_i A_i = L_T - L_S)
    A_i = (L_T - L_S) / m                when |L_S| < eps (uniform fallback, counted)

Units: the student tokens of the loss chunks (token mean).

**SimpleOPD** (exact positions only). ``A_i = log p(t_j) - l_i`` when student token ``i`` forms an
exact 1:1 loss chunk with teacher token ``j``; ``A_i = 0`` at every other student loss token and at
stop tokens (``stop_BTs``: EOS / end-of-turn, whatever the alignment). Student reference KL
(one of SimpleOPD's two stabilisers, on by default with the published ``beta = 0.5`` of He et al.,
arXiv 2608.14277, used for Qwen and Intern students; 1.5 for GLM; ``ref_beta = 0`` turns it off),
``+ beta * k3_i`` with ``r_i = clip(log q_init(y_i) - log q(y_i), +-ref_exp_clip)`` and
``k3_i = e^{r_i} - 1 - r_i`` (differentiable in ``q``; ``ref_logp_BTs`` = ``log q_init`` at input
positions). Units: every student loss token ``i >= 1`` (token mean; zero-advantage tokens count).

Both losses: the sum over units divided by ``num_valid`` (the trainer's global count from
:func:`count_dpca_units` / :func:`count_simple_opd_units`) or the local count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from xdistill.losses.chunks import (ChunkAlignment, chunk_bounds, chunk_sum, loss_chunks,
                                    resolve_count)
from xdistill.losses.engine import DEFAULT_CHUNK_SIZE, LOGP_FLOOR, shift_targets, token_logprobs

# SimpleOPD's published weight of the student reference KL (He et al., arXiv 2608.14277)
SIMPLE_OPD_REF_BETA = 0.5


@dataclass(frozen=True)
class PPOClip:
    """The clipped policy loss's knobs (module doc); DPCA's published defaults."""

    # lower clip of the ratio: rho is clipped below at 1 - eps_low
    eps_low: float = 0.2
    # upper clip of the ratio: rho is clipped above at 1 + eps_high
    eps_high: float = 0.28
    # dual-clip constant c (> 1) bounding the loss of negative advantages at -c * A; None = off
    dual_clip: float | None = 10.0
    # clamp of the log-ratio log q - l before exp (keeps rho finite)
    log_ratio_max: float = 20.0

    def __post_init__(self):
        if not (0 <= self.eps_low < 1 and self.eps_high >= 0):
            raise ValueError(f"need 0 <= eps_low < 1 and eps_high >= 0, got {self.eps_low}, "
                             f"{self.eps_high}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1 (or None), got {self.dual_clip}")
        if self.log_ratio_max <= 0:
            raise ValueError(f"log_ratio_max must be > 0, got {self.log_ratio_max}")


@dataclass(frozen=True)
class PolicyStats:
    """Diagnostics of one DPCA / SimpleOPD call (python numbers, local to this rank)."""

    # student tokens in the loss (the local normaliser)
    units: int
    # units whose advantage comes from the teacher (DPCA: all; SimpleOPD: exact non-stop tokens)
    scored: int
    # clamps and clips that fired (module doc)
    adv_clamped: int
    ratio_clipped: int
    dual_clipped: int
    log_ratio_clamped: int
    # DPCA: loss chunks that used the uniform split (|L_S| < eps)
    uniform_fallbacks: int = 0
    # SimpleOPD: exact-chunk tokens whose advantage was zeroed because they are stop tokens
    stop_zeroed: int = 0
    # mean (clamped) advantage and mean ratio over the scored units (nan when none)
    mean_advantage: float = math.nan
    mean_ratio: float = math.nan
    # SimpleOPD: mean k3 reference-KL estimate over the units (nan when off)
    ref_kl: float = math.nan


def ppo_token_losses(logp_N: torch.Tensor, behaviour_N: torch.Tensor, adv_N: torch.Tensor,
                     ppo: PPOClip) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(per-token clipped loss [N] differentiable in ``logp_N``, ratio [N] detached, counters)."""
    adv_N = adv_N.detach().to(logp_N.dtype)
    raw = logp_N - behaviour_N.detach().to(logp_N.dtype)
    lr = raw.clamp(-ppo.log_ratio_max, ppo.log_ratio_max)
    rho = torch.exp(lr)
    l1 = -adv_N * rho
    l2 = -adv_N * rho.clamp(1.0 - ppo.eps_low, 1.0 + ppo.eps_high)
    loss = torch.maximum(l1, l2)
    counts = {"ratio_clipped": int((l2.detach() > l1.detach()).sum()), "dual_clipped": 0,
              "log_ratio_clamped": int((raw.detach().abs() > ppo.log_ratio_max).sum())}
    if ppo.dual_clip is not None:
        l3 = -adv_N * ppo.dual_clip
        dual = (adv_N < 0) & (l3 < loss.detach())
        counts["dual_clipped"] = int(dual.sum())
        loss = torch.where(adv_N < 0, torch.minimum(loss, l3), loss)
    return loss, rho.detach(), counts


BASELINES = ("none", "mean", "token_mean", "clipped_mean")


def center_advantages(adv_N: torch.Tensor, baseline: str, scored_N: torch.Tensor | None = None,
                      tokens_N: torch.Tensor | None = None, clip: float | None = None
                      ) -> torch.Tensor:
    """``adv_N`` minus a baseline computed over the (``scored_N``) units of this micro-batch.

    ``"mean"``: their mean (a constant baseline: the gradient's expectation is unchanged, its
    variance falls; with a teacher that rates nearly every sample below the student's own
    likelihood, all advantages are negative and, uncentred, push down whatever was sampled).
    ``"token_mean"``: ``tokens_N[u] * b`` with ``b = sum(adv) / sum(tokens)`` the mean advantage
    per *student token* (``tokens_N``: the student tokens of each unit, ones when None). A unit of
    several student tokens (a cross-tokenizer chunk) gets the baseline of that many tokens, so the
    baseline does not depend on how a teacher's tokenization groups the student's tokens into
    units; with one token per unit it equals ``"mean"``. ``"clipped_mean"``: the advantages are
    first clamped to ``[-clip, clip]`` (the caller's advantage clamp), then centred on *their*
    mean: one extreme unit (a wrong answer a sharp teacher scores at -20 nats) moves the baseline
    by at most ``2 clip / n``, where under ``"mean"`` it drags the baseline down until wrong answers
    of moderate score land above it and are reinforced; = ``"mean"`` when ``clip`` is None. The
    caller clamps the centred advantages again. Units outside ``scored_N`` keep their advantage
    (zero)."""
    if baseline == "none":
        return adv_N
    if baseline not in BASELINES:
        raise ValueError(f"unknown advantage baseline {baseline!r}; allowed: {BASELINES}")
    sel = torch.ones_like(adv_N, dtype=torch.bool) if scored_N is None else scored_N
    if not bool(sel.any()):
        return adv_N
    if baseline == "clipped_mean":
        clipped_N = adv_N if clip is None else adv_N.clamp(-clip, clip)
        return torch.where(sel, clipped_N - clipped_N.detach()[sel].mean(), adv_N)
    if baseline == "mean" or tokens_N is None:
        return torch.where(sel, adv_N - adv_N.detach()[sel].mean(), adv_N)
    tok_N = tokens_N.to(adv_N.dtype)
    per_token = adv_N.detach()[sel].sum() / tok_N[sel].sum().clamp_min(1.0)
    return torch.where(sel, adv_N - tok_N * per_token, adv_N)


def _clamp_adv(adv_N: torch.Tensor, adv_clamp: float | None) -> tuple[torch.Tensor, int]:
    if adv_clamp is None:
        return adv_N, 0
    return adv_N.clamp(-adv_clamp, adv_clamp), int((adv_N.abs() > adv_clamp).sum())


def _current_logp(student_logits_BTsVs, student_ids_BTs, sel_BTs, tau, chunk_size):
    """``log q(y_i)`` at input positions where ``sel_BTs`` (0 elsewhere), differentiable."""
    out = token_logprobs(student_logits_BTsVs, shift_targets(student_ids_BTs, sel_BTs), tau,
                         chunk_size)
    return torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)


def _check(student_logits_BTsVs, student_ids_BTs, behaviour_logp_BTs, teacher_token_logp_BTt,
           align):
    B, Ts, _ = student_logits_BTsVs.shape
    for name, t in (("student_ids_BTs", student_ids_BTs),
                    ("behaviour_logp_BTs", behaviour_logp_BTs),
                    ("align.s_chunk_BTs", align.s_chunk_BTs)):
        if tuple(t.shape) != (B, Ts):
            raise ValueError(f"{name} {tuple(t.shape)} does not fit student logits [B,T]={(B, Ts)}")
    if tuple(teacher_token_logp_BTt.shape) != tuple(align.t_chunk_BTt.shape):
        raise ValueError(f"teacher_token_logp_BTt {tuple(teacher_token_logp_BTt.shape)} does not "
                         f"fit t_chunk {tuple(align.t_chunk_BTt.shape)}")


def _mean(x: torch.Tensor) -> float:
    return float(x.double().mean()) if x.numel() else math.nan


def count_dpca_units(align: ChunkAlignment, s_loss_mask_BTs=None, t_loss_mask_BTt=None) -> int:
    """Local units of :func:`dpca`: student tokens of the loss chunks."""
    return int(_dpca_tokens(align, loss_chunks(align, s_loss_mask_BTs, t_loss_mask_BTt)).sum())


def _dpca_tokens(align: ChunkAlignment, ok_BC: torch.Tensor) -> torch.Tensor:
    """bool [B, Ts]: student tokens of the chunks selected by ``ok_BC``."""
    c = align.s_chunk_BTs
    if ok_BC.shape[1] == 0:
        return torch.zeros_like(c, dtype=torch.bool)
    return (c >= 0) & ok_BC.gather(1, c.clamp(min=0))


def dpca_advantages(behaviour_logp_BTs, teacher_token_logp_BTt, align: ChunkAlignment, ok_BC,
                    eps: float = 1e-6, teacher_chunk_logp_BC=None
                    ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(unit tokens bool [B, Ts], unclamped advantage [B, Ts] (0 off units), uniform fallbacks).
    ``teacher_chunk_logp_BC`` replaces the chunk sums ``L_T`` (byte-level credit)."""
    C = align.num_chunks
    beh = behaviour_logp_BTs.detach().double()
    if teacher_chunk_logp_BC is not None:
        lt_BC = teacher_chunk_logp_BC.detach().double()
    else:
        lt_BC = chunk_sum(teacher_token_logp_BTt.detach().double().clamp_min(LOGP_FLOOR),
                          align.t_chunk_BTt, C)
    ls_BC = chunk_sum(beh, align.s_chunk_BTs, C)
    m_BC = chunk_sum(torch.ones_like(beh), align.s_chunk_BTs, C)
    uniform_BC = ls_BC.abs() < eps
    sel = _dpca_tokens(align, ok_BC)
    if C == 0:
        return sel, torch.zeros_like(beh), 0
    c = align.s_chunk_BTs.clamp(min=0)
    lt, ls, m, uni = (x.gather(1, c) for x in (lt_BC, ls_BC, m_BC, uniform_BC))
    safe_ls = torch.where(uni, torch.ones_like(ls), ls)
    adv = torch.where(uni, (lt - ls) / m.clamp_min(1), (lt / safe_ls - 1.0) * beh)
    adv = torch.where(sel, adv, torch.zeros_like(adv))
    return sel, adv, int((uniform_BC & ok_BC).sum())


def dpca(student_logits_BTsVs, student_ids_BTs, behaviour_logp_BTs, teacher_token_logp_BTt,
         align: ChunkAlignment, *, s_loss_mask_BTs=None, t_loss_mask_BTt=None,
         ppo: PPOClip = PPOClip(), adv_clamp: float | None = 10.0, eps: float = 1e-6,
         temperature: float = 1.0, num_valid=None, chunk_size=DEFAULT_CHUNK_SIZE,
         baseline: str = "none", teacher_chunk_logp_BC=None) -> tuple[torch.Tensor, PolicyStats]:
    """DPCA: chunk log-ratio split over the chunk's student tokens, PPO clipped (module doc).

    Needs only token log-probs from the teacher (``teacher_token_logp_BTt``) and the rollout's
    ``behaviour_logp_BTs``; ``teacher_chunk_logp_BC`` [B, C] replaces the per-chunk teacher sums
    ``L_T`` (byte-level credit, :mod:`xdistill.losses.bytecredit`). Returns the scalar loss and
    :class:`PolicyStats`.
    """
    _check(student_logits_BTsVs, student_ids_BTs, behaviour_logp_BTs, teacher_token_logp_BTt,
           align)
    ok_BC = loss_chunks(align, s_loss_mask_BTs, t_loss_mask_BTt)
    sel, adv_BTs, uniform = dpca_advantages(behaviour_logp_BTs, teacher_token_logp_BTt, align,
                                            ok_BC, eps, teacher_chunk_logp_BC)
    b_N, i_N = torch.nonzero(sel, as_tuple=True)
    logp_BTs = _current_logp(student_logits_BTsVs, student_ids_BTs, sel, float(temperature),
                             chunk_size)
    adv_N, clamped = _clamp_adv(center_advantages(adv_BTs[b_N, i_N], baseline, clip=adv_clamp),
                                adv_clamp)
    loss_N, rho_N, counts = ppo_token_losses(logp_BTs[b_N, i_N], behaviour_logp_BTs[b_N, i_N],
                                             adv_N, ppo)
    units = int(b_N.numel())
    loss = loss_N.sum() / resolve_count(num_valid, units)
    return loss, PolicyStats(units, units, clamped, uniform_fallbacks=uniform,
                             mean_advantage=_mean(adv_N), mean_ratio=_mean(rho_N), **counts)


def count_simple_opd_units(s_loss_mask_BTs: torch.Tensor) -> int:
    """Local units of :func:`simple_opd`: student loss tokens at positions ``i >= 1``."""
    return int(s_loss_mask_BTs[:, 1:].bool().sum())


def simple_opd_advantages(behaviour_logp_BTs, teacher_token_logp_BTt, align: ChunkAlignment,
                          stop_BTs, s_loss_mask_BTs, t_loss_mask_BTt=None,
                          teacher_chunk_logp_BC=None):
    """(advantage [B, Ts] float64 (0 off exact non-stop tokens), scored [B, Ts], stop_zeroed).
    ``teacher_chunk_logp_BC`` replaces the teacher token's log-prob (byte-level credit)."""
    C = align.num_chunks
    ok_BC = loss_chunks(align, s_loss_mask_BTs, t_loss_mask_BTt, exact_only=True)
    s_start, _ = chunk_bounds(align.s_chunk_BTs, C)
    t_start, _ = chunk_bounds(align.t_chunk_BTt, C)
    b_N, c_N = torch.nonzero(ok_BC, as_tuple=True)
    i_N, j_N = s_start[b_N, c_N], t_start[b_N, c_N]
    stop_N = stop_BTs.bool()[b_N, i_N]
    keep = ~stop_N
    b_N, c_N, i_N, j_N = b_N[keep], c_N[keep], i_N[keep], j_N[keep]
    adv = torch.zeros(behaviour_logp_BTs.shape, dtype=torch.float64,
                      device=behaviour_logp_BTs.device)
    scored = torch.zeros(behaviour_logp_BTs.shape, dtype=torch.bool,
                         device=behaviour_logp_BTs.device)
    if teacher_chunk_logp_BC is not None:
        t_lp = teacher_chunk_logp_BC.detach().double()[b_N, c_N]
    else:
        t_lp = teacher_token_logp_BTt.detach().double().clamp_min(LOGP_FLOOR)[b_N, j_N]
    adv[b_N, i_N] = t_lp - behaviour_logp_BTs.detach().double()[b_N, i_N]
    scored[b_N, i_N] = True
    return adv, scored, int(stop_N.sum())


def simple_opd(student_logits_BTsVs, student_ids_BTs, behaviour_logp_BTs, teacher_token_logp_BTt,
               align: ChunkAlignment, stop_BTs, s_loss_mask_BTs, *, t_loss_mask_BTt=None,
               ppo: PPOClip = PPOClip(), adv_clamp: float | None = 10.0, ref_logp_BTs=None,
               ref_beta: float = SIMPLE_OPD_REF_BETA, ref_exp_clip: float = 20.0, temperature: float = 1.0,
               num_valid=None, chunk_size=DEFAULT_CHUNK_SIZE, baseline: str = "none",
               teacher_chunk_logp_BC=None) -> tuple[torch.Tensor, PolicyStats]:
    """SimpleOPD: teacher advantage at exact 1:1 positions only, PPO clipped, plus the k3
    reference KL weighted by ``ref_beta`` (published 0.5; 0 = off; module doc). ``stop_BTs`` (bool [B, Ts]) marks the student's stop tokens;
    ``s_loss_mask_BTs`` is required (it defines the units). Needs only teacher token log-probs;
    ``teacher_chunk_logp_BC`` replaces them at the exact chunks (byte-level credit).
    """
    _check(student_logits_BTsVs, student_ids_BTs, behaviour_logp_BTs, teacher_token_logp_BTt,
           align)
    if ref_beta and ref_logp_BTs is None:
        raise ValueError(f"simple_opd: ref_beta = {ref_beta} > 0 needs ref_logp_BTs (log q_init of "
                         "the samples); pass ref_beta=0 to turn the reference KL off")
    units_BTs = s_loss_mask_BTs.bool().clone()
    units_BTs[:, 0] = False
    adv_BTs, scored_BTs, stop_zeroed = simple_opd_advantages(
        behaviour_logp_BTs, teacher_token_logp_BTt, align, stop_BTs, units_BTs, t_loss_mask_BTt,
        teacher_chunk_logp_BC)
    b_N, i_N = torch.nonzero(units_BTs, as_tuple=True)
    logp_BTs = _current_logp(student_logits_BTsVs, student_ids_BTs, units_BTs, float(temperature),
                             chunk_size)
    logp_N, scored_N = logp_BTs[b_N, i_N], scored_BTs[b_N, i_N]
    adv_N, clamped = _clamp_adv(center_advantages(adv_BTs[b_N, i_N], baseline, scored_N,
                                                  clip=adv_clamp), adv_clamp)
    loss_N, rho_N, counts = ppo_token_losses(logp_N, behaviour_logp_BTs[b_N, i_N], adv_N, ppo)
    ref_kl = math.nan
    if ref_beta:
        r_N = ref_logp_BTs.detach().to(logp_N.dtype)[b_N, i_N] - logp_N
        r_N = r_N.clamp(-ref_exp_clip, ref_exp_clip)
        k3_N = torch.expm1(r_N) - r_N
        loss_N = loss_N + float(ref_beta) * k3_N
        ref_kl = _mean(k3_N.detach())
    units = int(b_N.numel())
    loss = loss_N.sum() / resolve_count(num_valid, units)
    return loss, PolicyStats(units, int(scored_N.sum()), clamped, stop_zeroed=stop_zeroed,
                             mean_advantage=_mean(adv_N[scored_N]),
                             mean_ratio=_mean(rho_N[scored_N]), ref_kl=ref_kl, **counts)


__all__ = ["PPOClip", "PolicyStats", "SIMPLE_OPD_REF_BETA", "count_dpca_units", "count_simple_opd_units", "dpca",
           "center_advantages", "dpca_advantages", "ppo_token_losses", "simple_opd", "simple_opd_advantages"]
