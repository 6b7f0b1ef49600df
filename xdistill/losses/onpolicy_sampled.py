"""The sampled-token estimators of on-policy distillation (k1, k3) over loss units.

Legend: B batch, Ts/Tt student/teacher tokens, C chunks, N loss units.

A unit is a student loss token (same tokenizer, or student-token units under byte credit) or an
aligned loss chunk (cross tokenizer); ``r_u = log q(u) - log p(u)`` compares the teacher's and
the student's log-likelihoods of the unit. k1 is the policy-gradient form (advantage ``r_u``, or
with a discount ``gamma`` the discounted sum of the log-ratios from ``u`` to the end of its sample,
optionally centred by a baseline and clamped), k3 the ``e^r - 1 - r`` estimator of the reverse
KL. :mod:`xdistill.losses.onpolicy` documents the estimators, the clamps and where they come from,
and calls these functions; they are re-exported there.
"""

from __future__ import annotations

import math

from dataclasses import dataclass

import torch

from xdistill.losses.chunks import ChunkAlignment, chunk_sum, loss_chunks, resolve_count
from xdistill.losses.policy import center_advantages


@dataclass(frozen=True)
class Clamps:
    """Clamps of the sampled estimators (None disables one)."""

    # floor of every sampled-token log-prob (student and teacher) before forming r; off by
    # default (module doc: it rewards units both models find impossible)
    logp_min: float | None = None
    # symmetric clamp of the per-unit loss value (k3) or of the advantage (k1)
    loss_max: float | None = 10.0
    # clip of the log-ratio r inside e^r (k3)
    exp_clip: float | None = 20.0



@dataclass(frozen=True)
class OnPolicyLossOutput:
    """The loss plus diagnostics (python numbers)."""

    # scalar loss (differentiable in the student logits)
    loss: torch.Tensor
    # local number of loss units (tokens or chunks) that carried loss
    units: int
    # how often each clamp fired, over the loss units (keys: COUNTERS); empty for full losses
    counters: dict
    # mean log-ratio r over the units (sampled estimators), else nan
    mean_logratio: float = float("nan")
    # byte-level credit: summed measured error log P_ub - log P_lb of the teacher side over the
    # units (0 when none), nan when byte credit is off; _seg: without re-spellings (byte_bounds)
    credit_gap_sum: float = float("nan")
    credit_gap_seg_sum: float = float("nan")


def _floor(x: torch.Tensor, lo: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    if lo is None:
        return x, torch.zeros_like(x, dtype=torch.bool)
    return x.clamp_min(lo), x < lo


def unit_logprobs(s_logp_BTs: torch.Tensor, t_logp_BTt: torch.Tensor, s_loss_mask_BTs,
                  align: ChunkAlignment | None, t_loss_mask_BTt=None, logp_min=None,
                  t_chunk_logp_BC=None):
    """Per loss unit: (b_N, student log p(u) [N] differentiable, teacher log q(u) [N], counters).

    Inputs are sampled-token log-probs at input positions. Same tokenizer (``align`` None): units
    are the student loss tokens ``i >= 1`` and ``t_logp_BTt`` is indexed like the student.
    Cross tokenizer: units are the loss chunks (:func:`xdistill.losses.chunks.loss_chunks`) and
    each side's floored log-probs are summed over the chunk's tokens; ``t_chunk_logp_BC``
    [B, C] replaces the teacher's sums (byte-level credit).
    """
    s_floor, s_fired = _floor(s_logp_BTs, logp_min)
    t_floor, t_fired = _floor(t_logp_BTt.to(s_logp_BTs.dtype), logp_min)
    if align is None:
        if t_logp_BTt.shape != s_logp_BTs.shape:
            raise ValueError(f"same-tokenizer teacher log-probs {tuple(t_logp_BTt.shape)} must "
                             f"match the student's {tuple(s_logp_BTs.shape)}")
        sel = s_loss_mask_BTs.bool().clone()
        sel[:, 0] = False
        b_N, i_N = torch.nonzero(sel, as_tuple=True)
        counts = {"logp_floor_student": int(s_fired[sel].sum()),
                  "logp_floor_teacher": int(t_fired[sel].sum())}
        return b_N, s_floor[b_N, i_N], t_floor[b_N, i_N].detach(), counts
    C = align.num_chunks
    ok_BC = loss_chunks(align, s_loss_mask_BTs, t_loss_mask_BTt)
    b_N, c_N = torch.nonzero(ok_BC, as_tuple=True)
    s_sum_BC = chunk_sum(s_floor, align.s_chunk_BTs, C)
    t_sum_BC = chunk_sum(t_floor.detach(), align.t_chunk_BTt, C)
    if t_chunk_logp_BC is not None:
        t_sum_BC, t_fired = t_chunk_logp_BC.detach().to(s_floor.dtype), torch.zeros_like(t_fired)
    s_in = (chunk_sum(s_fired.to(s_floor.dtype), align.s_chunk_BTs, C) * ok_BC).sum()
    t_in = (chunk_sum(t_fired.to(s_floor.dtype), align.t_chunk_BTt, C) * ok_BC).sum()
    counts = {"logp_floor_student": int(s_in), "logp_floor_teacher": int(t_in)}
    return b_N, s_sum_BC[b_N, c_N], t_sum_BC[b_N, c_N], counts


def unit_token_counts(s_loss_mask_BTs, align: ChunkAlignment | None = None,
                      t_loss_mask_BTt=None) -> torch.Tensor:
    """[N] student tokens of each loss unit, in the unit order of :func:`unit_logprobs` (ones
    for a same-tokenizer teacher: its units are the student's tokens)."""
    if align is None:
        sel = s_loss_mask_BTs.bool().clone()
        sel[:, 0] = False
        return torch.ones(int(sel.sum()), dtype=torch.int64, device=sel.device)
    ok_BC = loss_chunks(align, s_loss_mask_BTs, t_loss_mask_BTt)
    ones = torch.ones(align.s_chunk_BTs.shape, dtype=torch.int64, device=ok_BC.device)
    return chunk_sum(ones, align.s_chunk_BTs, align.num_chunks)[ok_BC]


def discounted_returns(r_N: torch.Tensor, b_N: torch.Tensor, gamma: float,
                       scored_N: torch.Tensor | None = None) -> torch.Tensor:
    """``G_n = sum_{m >= n in n's sample} gamma^(m - n) r_m`` over the units of each sample, ``m - n``
    counted in units (``b_N``: each unit's sample, non-decreasing, units in text order as
    :func:`unit_logprobs` returns them). Units outside ``scored_N`` contribute no log-ratio.
    ``gamma = 0``: ``r`` itself; ``gamma = 1``: the log-ratio of everything from ``u`` to the end,
    which under exact credit does not depend on how a tokenization cuts that suffix into units."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"discount must lie in [0, 1], got {gamma}")
    r_N = r_N if scored_N is None else torch.where(scored_N, r_N, torch.zeros_like(r_N))
    if gamma == 0.0 or r_N.numel() == 0:
        return r_N
    if bool((b_N[1:] < b_N[:-1]).any()):
        raise ValueError("discounted returns need the units grouped by sample in text order "
                         "(b_N non-decreasing)")
    _, counts = torch.unique_consecutive(b_N, return_counts=True)
    start_N = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    pos_N = torch.arange(r_N.numel(), device=r_N.device) - start_N
    row_N = torch.repeat_interleave(torch.arange(counts.numel(), device=r_N.device), counts)
    R = r_N.new_zeros(int(counts.numel()), int(counts.max()))
    R[row_N, pos_N] = r_N
    if gamma == 1.0:
        G = R.flip(1).cumsum(1).flip(1)
    else:
        G = torch.zeros_like(R)
        G[:, -1] = R[:, -1]
        for j in range(R.shape[1] - 2, -1, -1):
            G[:, j] = R[:, j] + gamma * G[:, j + 1]
    return G[row_N, pos_N]


def sampled_unit_losses(kind: str, s_unit_N: torch.Tensor, t_unit_N: torch.Tensor,
                        clamps: Clamps, baseline: str = "none", tokens_N=None, scored_N=None,
                        discount: float = 0.0, b_N=None
                        ) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(per-unit loss [N], log-ratio r [N] (detached), counters) of ``k1`` (PG) or ``k3``.
    ``discount`` (k1; needs ``b_N``, each unit's sample) replaces each advantage by the
    discounted return :func:`discounted_returns`. ``baseline`` centres k1's advantages before the
    clamp (:func:`center_advantages`; ``tokens_N``: each unit's student tokens, for
    ``"token_mean"``; ``scored_N``: the units the baseline is computed over and whose log-ratios
    enter the returns, all when None)."""
    r_N = t_unit_N - s_unit_N
    counts = {"exp_clip": 0, "loss_clamp": 0}
    hi = clamps.loss_max
    if discount and kind != "k1":
        raise ValueError(f"a discount applies to the k1 advantage only, not to {kind!r}")
    if kind == "k1":
        adv_N = r_N.detach()
        if discount:
            if b_N is None:
                raise ValueError("a discount needs b_N, each unit's sample")
            adv_N = discounted_returns(adv_N, b_N, discount, scored_N)
        adv_N = center_advantages(adv_N, baseline, scored_N=scored_N, tokens_N=tokens_N,
                                  clip=hi)
        if hi is not None:
            counts["loss_clamp"] = int((adv_N.abs() > hi).sum())
            adv_N = adv_N.clamp(-hi, hi)
        return -adv_N * s_unit_N, r_N.detach(), counts
    if kind != "k3":
        raise ValueError(f"sampled estimator must be 'k1' or 'k3', got {kind!r}")
    rc_N = r_N
    if clamps.exp_clip is not None:
        counts["exp_clip"] = int((r_N.detach().abs() > clamps.exp_clip).sum())
        rc_N = r_N.clamp(-clamps.exp_clip, clamps.exp_clip)
    if hi is not None:
        # k3(2 log(1 + hi) + 1) > hi: only units the loss clamp fires on are capped here, so
        # expm1 cannot overflow to inf (whose gradient times the clamp's 0 is NaN)
        rc_N = rc_N.clamp_max(2.0 * math.log1p(hi) + 1.0)
    k3_N = torch.expm1(rc_N) - rc_N
    if hi is not None:
        counts["loss_clamp"] = int((k3_N.detach().abs() > hi).sum())
        k3_N = k3_N.clamp(-hi, hi)
    return k3_N, r_N.detach(), counts


def unit_flags(flag_BTs: torch.Tensor, s_loss_mask_BTs, align: ChunkAlignment | None = None,
               t_loss_mask_BTt=None) -> torch.Tensor:
    """bool ``[N]`` in the unit order of :func:`unit_logprobs`: the unit holds a flagged student
    token (e.g. a stop token)."""
    flag = flag_BTs.bool()
    if align is None:
        sel = s_loss_mask_BTs.bool().clone()
        sel[:, 0] = False
        return flag[sel]
    ok_BC = loss_chunks(align, s_loss_mask_BTs, t_loss_mask_BTt)
    hit_BC = chunk_sum(flag.to(torch.float32), align.s_chunk_BTs, align.num_chunks) > 0
    return hit_BC[ok_BC]


def sampled_loss(kind: str, s_logp_BTs, t_logp_BTt, s_loss_mask_BTs, *, align=None,
                 t_loss_mask_BTt=None, clamps: Clamps = Clamps(), sample_weight_B=None,
                 num_valid=None, zero_BTs=None, baseline: str = "none",
                 t_chunk_logp_BC=None, discount: float = 0.0) -> OnPolicyLossOutput:
    """``1/num_valid * sum_u w_b(u) * loss_u`` of ``k1`` (policy gradient) or ``k3`` (module doc).

    ``s_logp_BTs`` (differentiable) and ``t_logp_BTt`` are sampled-token log-probs at input
    positions (:func:`input_token_logprobs`); the teacher side is treated as a constant.
    ``zero_BTs``: units holding such a student token get zero advantage / loss (still counted).
    ``t_chunk_logp_BC``: per-chunk teacher log-probs replacing the sums (byte-level credit).
    ``discount``: k1's advantage is the discounted return over the sample's units
    (:func:`discounted_returns`; zeroed units add no log-ratio).
    """
    b_N, s_N, t_N, counts = unit_logprobs(s_logp_BTs, t_logp_BTt, s_loss_mask_BTs, align,
                                          t_loss_mask_BTt, clamps.logp_min, t_chunk_logp_BC)
    tokens_N = (unit_token_counts(s_loss_mask_BTs, align, t_loss_mask_BTt)
                if baseline == "token_mean" else None)
    zero_N = (None if zero_BTs is None
              else unit_flags(zero_BTs, s_loss_mask_BTs, align, t_loss_mask_BTt))
    # zeroed units stay out of the baseline too: the teacher's view of where to stop must not
    # shift every other unit's advantage
    loss_N, r_N, more = sampled_unit_losses(kind, s_N, t_N, clamps, baseline, tokens_N,
                                            None if zero_N is None else ~zero_N, discount, b_N)
    if zero_N is not None:
        loss_N = torch.where(zero_N, torch.zeros_like(loss_N), loss_N)
        more["zero_stop"] = int(zero_N.sum())
    if sample_weight_B is not None:
        loss_N = loss_N * sample_weight_B.to(loss_N.dtype)[b_N]
    total = loss_N.sum() / resolve_count(num_valid, b_N.numel())
    mean_r = float(r_N.mean()) if r_N.numel() else float("nan")
    return OnPolicyLossOutput(total, int(b_N.numel()), {**counts, **more}, mean_r)


__all__ = ["Clamps", "OnPolicyLossOutput", "discounted_returns", "sampled_loss", "sampled_unit_losses", "unit_flags", "unit_logprobs",
           "unit_token_counts"]
