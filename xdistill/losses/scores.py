"""Per-batch teacher scores for dynamic weighting, and per-teacher loss units and coverage.

Legend: B batch, Ts/Tt student/teacher tokens, V teacher vocabulary, K top-k, C chunks, N scored
positions, n rows of one block.

A teacher's scored positions are the teacher tokens ``j >= 1`` whose prediction its loss uses: the
student loss tokens for a same-tokenizer teacher (no alignment), the teacher tokens of the loss
chunks otherwise. Each is predicted by teacher output row ``j - 1``. Scores are taken from the
teacher's outputs as given (at the teacher's temperature) and are never differentiated.
"""

from __future__ import annotations

import math

import torch

from xdistill.losses.chunks import loss_chunks
from xdistill.losses.engine import (DEFAULT_CHUNK_SIZE, LOGP_FLOOR, log1mexp, log_softmax_safe,
                                    safe_logsumexp, xlogx_minus_xlogy)


def scored_positions(inp, s_ids_BTs, s_loss_mask_BTs, exact_only: bool = False):
    """(b_N, token position j_N, token id_N) of the teacher's scored positions (module doc);
    ``exact_only``: only inside exact chunks (an ``exact_kl`` teacher's loss units)."""
    if inp.alignment is None:
        mask_BT = s_loss_mask_BTs.bool().clone()
        ids_BT = s_ids_BTs if inp.input_ids_BTt is None else inp.input_ids_BTt
    else:
        align = inp.alignment
        ok_BC = loss_chunks(align, s_loss_mask_BTs, inp.loss_mask_BTt, exact_only=exact_only)
        C = align.num_chunks
        padded_BC = torch.cat([ok_BC, torch.zeros_like(ok_BC[:, :1])], dim=1)
        idx_BT = torch.where(align.t_chunk_BTt >= 0, align.t_chunk_BTt,
                             torch.full_like(align.t_chunk_BTt, C))
        mask_BT = padded_BC.gather(1, idx_BT)
        ids_BT = inp.input_ids_BTt
    mask_BT[:, 0] = False
    b_N, j_N = torch.nonzero(mask_BT, as_tuple=True)
    tok_N = ids_BT[b_N, j_N].long() if ids_BT is not None else None
    return b_N, j_N, tok_N


def _row_stats(logq_nV: torch.Tensor, tok_n: torch.Tensor | None, kind: str) -> torch.Tensor:
    if kind == "neg_ce":
        if tok_n is None:
            raise ValueError("score 'neg_ce' needs the teacher's token ids or token log-probs")
        return logq_nV.gather(1, tok_n.unsqueeze(1)).squeeze(1)
    if kind == "neg_entropy":
        return xlogx_minus_xlogy(logq_nV, torch.zeros_like(logq_nV)).sum(-1)  # sum q log q = -H
    return torch.exp(logq_nV.amax(-1))


def _topk_logq(inp, b, r):
    """log-probs of the K+1 outcomes (top-k ids, tail bucket), [n, K+1]: the teacher's own tail
    log-mass when it sent one (``1 - sum exp(top-k)`` rounds to 0 for a confident teacher)."""
    logq_K = inp.topk_logp_BTtK[b, r].float()
    if getattr(inp, "tail_logmass_BTt", None) is not None:
        logq_R = inp.tail_logmass_BTt[b, r].float()
    else:
        # floored: a tail that rounds to 0 would make a text token outside the top-k score
        # -inf, and a -inf score takes a teacher out of the dynamic weighting altogether
        logq_R = log1mexp(safe_logsumexp(logq_K, -1).clamp_max(0.0)).clamp_min(LOGP_FLOOR)
    return torch.cat([logq_K, logq_R.unsqueeze(1)], dim=1)


@torch.no_grad()
def teacher_score(inp, kind: str, s_ids_BTs, s_loss_mask_BTs,
                  chunk_size: int | None = DEFAULT_CHUNK_SIZE, exact_only: bool = False
                  ) -> torch.Tensor:
    """Mean score of one teacher over its scored positions, a float32 0-d tensor (NaN if none);
    ``exact_only``: score inside exact chunks only (an ``exact_kl`` teacher's loss units)."""
    if kind not in ("neg_ce", "neg_entropy", "confidence"):
        raise ValueError(f"unknown score {kind!r}; allowed: neg_ce, neg_entropy, confidence")
    b_N, j_N, tok_N = scored_positions(inp, s_ids_BTs, s_loss_mask_BTs, exact_only)
    if b_N.numel() == 0:
        return torch.full((), math.nan, dtype=torch.float32, device=b_N.device)
    if kind == "neg_ce" and inp.token_logp_BTt is not None:
        return inp.token_logp_BTt[b_N, j_N].float().mean()
    size = b_N.numel() if chunk_size is None else int(chunk_size)
    total = torch.zeros((), dtype=torch.float64, device=b_N.device)
    for lo in range(0, b_N.numel(), size):
        b, r = b_N[lo:lo + size], j_N[lo:lo + size] - 1
        tok = None if tok_N is None else tok_N[lo:lo + size]
        if inp.logits_BTtV is not None:
            vals = _row_stats(log_softmax_safe(inp.logits_BTtV[b, r].float()), tok, kind)
        elif inp.topk_logp_BTtK is not None:
            logq = _topk_logq(inp, b, r)
            if kind == "neg_ce":
                if tok is None:
                    raise ValueError(f"teacher {inp.name!r}: score 'neg_ce' needs input_ids_BTt")
                hit = inp.topk_idx_BTtK[b, r].long() == tok.unsqueeze(1)
                hit = torch.cat([hit, ~hit.any(1, keepdim=True)], dim=1)
                vals = torch.where(hit, logq, torch.zeros_like(logq)).sum(1)
            elif kind == "confidence":    # the top-1 token, never the tail bucket (not a token)
                vals = torch.exp(logq[:, :-1].amax(-1))
            else:
                vals = _row_stats(logq, None, kind)
        else:
            raise ValueError(f"teacher {inp.name!r}: scores need logits or top-k outputs")
        total += vals.double().sum()
    return (total / b_N.numel()).float()


def loss_units(inp, s_loss_mask_BTs, exact_only: bool = False) -> int:
    """Local count of the teacher's loss units: tokens (same tokenizer) or loss chunks."""
    if inp.alignment is None:
        return int(s_loss_mask_BTs[:, 1:].bool().sum())
    return int(loss_chunks(inp.alignment, s_loss_mask_BTs, inp.loss_mask_BTt,
                           exact_only=exact_only).sum())


def coverage(inp, s_loss_mask_BTs, exact_only: bool = False) -> torch.Tensor:
    """Fraction of student loss tokens (``i >= 1``) inside the teacher's loss units (0 without
    any), a 0-dim float64 tensor on the mask's device (read by no host sync here)."""
    s_mask = s_loss_mask_BTs.bool().clone()
    s_mask[:, 0] = False
    total = s_mask.sum().double()
    if inp.alignment is None:
        return (total > 0).double()
    align = inp.alignment
    ok_BC = loss_chunks(align, s_loss_mask_BTs, inp.loss_mask_BTt, exact_only=exact_only)
    padded_BC = torch.cat([ok_BC, torch.zeros_like(ok_BC[:, :1])], dim=1)
    idx_BT = torch.where(align.s_chunk_BTs >= 0, align.s_chunk_BTs,
                         torch.full_like(align.s_chunk_BTs, align.num_chunks))
    covered = padded_BC.gather(1, idx_BT) & s_mask
    return covered.sum().double() / total.clamp_min(1)
