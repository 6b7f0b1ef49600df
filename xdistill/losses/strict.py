"""Strict top-k: reverse KL at exact 1:1 chunks over the student's top-k of the shared vocabulary.

Legend: B batch, Ts/Tt student/teacher tokens, Vs/Vt vocabularies, C chunks, N shared vocabulary
pairs, K top-k, n rows of a block.

Units are the *exact* loss chunks (one student and one teacher token with identical bytes,
:func:`xdistill.losses.chunks.loss_chunks` with ``exact_only``), compared at their root position
(student row ``s_start - 1``, teacher row ``t_start - 1``). ``shared_s_idx_N[n]`` and
``shared_t_idx_N[n]`` are a student and a teacher text token with identical bytes (as in
:func:`xdistill.losses.cross.exact_kl`). Per unit, with ``q = softmax(z_s / tau)`` and
``p = softmax(z_t / tau)``:

* ``K`` = the ``k`` shared pairs with the largest student probability ``q(s_n)`` (indices, not
  differentiated; ``k >= N`` means every shared pair, ties broken by ``torch.topk``);
* ``q~(n) = q(s_n) / sum_{m in K} q(s_m)`` and ``p~(n) = p(t_n) / sum_{m in K} p(t_m)`` on ``K``;
* ``loss = tau^2 * KL(q~ || p~) = tau^2 * sum_{n in K} q~(n) log(q~(n) / p~(n))``.

Gradients reach the student logits through ``q~`` only. A teacher probability of exactly 0 on
``K`` is floored at ``LOGP_FLOOR`` in the log (large, finite). The sum over units is divided by
``num_valid`` (the trainer's global count from :func:`count_strict_units`) or the local count.
Only the teacher's full logits at the root rows are read (the probabilities of student-chosen
ids, which a sampled-token teacher cannot provide).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xdistill.losses.chunks import ChunkAlignment, chunk_start_rows, loss_chunks, resolve_count
from xdistill.losses.engine import (DEFAULT_CHUNK_SIZE, log_softmax_safe, row_block_sum,
                                    xlogx_minus_xlogy)

DEFAULT_TOP_K = 16


@dataclass(frozen=True)
class StrictStats:
    """Diagnostics of one :func:`strict_topk` call (python numbers, local to this rank)."""

    # exact loss chunks that carried loss
    units: int
    # size of the compared set (min(k, shared pairs))
    k: int
    # mean over units of the student's full probability inside its top-k set
    student_topk_mass: float
    # mean over units of the teacher's full probability on the mapped top-k set
    teacher_topk_mass: float
    # mean over units of the teacher's full probability on the whole shared vocabulary
    teacher_shared_mass: float


def count_strict_units(align: ChunkAlignment, s_loss_mask_BTs=None, t_loss_mask_BTt=None) -> int:
    """Local units of :func:`strict_topk`: exact 1:1 loss chunks."""
    return int(loss_chunks(align, s_loss_mask_BTs, t_loss_mask_BTt, exact_only=True).sum())


def _shared(shared_s_idx_N, shared_t_idx_N, Vs: int, Vt: int, device):
    s_idx, t_idx = shared_s_idx_N.long().to(device), shared_t_idx_N.long().to(device)
    if s_idx.ndim != 1 or s_idx.shape != t_idx.shape or s_idx.numel() == 0:
        raise ValueError(f"shared index maps must be equal-length, 1-D and non-empty, got "
                         f"{tuple(s_idx.shape)} and {tuple(t_idx.shape)}")
    if int(s_idx.min()) < 0 or int(s_idx.max()) >= Vs or int(t_idx.min()) < 0 \
            or int(t_idx.max()) >= Vt:
        raise ValueError(f"shared ids outside the logits' vocabularies ({Vs}, {Vt})")
    return s_idx, t_idx


def _check(student_logits_BTsVs, teacher_logits_BTtVt, align):
    B, Ts, _ = student_logits_BTsVs.shape
    if tuple(align.s_chunk_BTs.shape) != (B, Ts):
        raise ValueError(f"alignment s_chunk {tuple(align.s_chunk_BTs.shape)} does not fit "
                         f"student logits [B,T]={(B, Ts)}")
    if tuple(teacher_logits_BTtVt.shape[:2]) != tuple(align.t_chunk_BTt.shape):
        raise ValueError(f"teacher logits {tuple(teacher_logits_BTtVt.shape)} do not fit t_chunk "
                         f"{tuple(align.t_chunk_BTt.shape)}")


def strict_topk(student_logits_BTsVs, teacher_logits_BTtVt, align: ChunkAlignment,
                shared_s_idx_N, shared_t_idx_N, *, s_loss_mask_BTs=None, t_loss_mask_BTt=None,
                top_k: int = DEFAULT_TOP_K, temperature: float = 1.0, num_valid=None,
                chunk_size=DEFAULT_CHUNK_SIZE) -> tuple[torch.Tensor, StrictStats]:
    """``tau^2 / count * sum_{exact loss chunks} KL(q~ || p~)`` on the student's top-k (module doc).

    ``teacher_logits_BTtVt``: the teacher's full logits (temperature 1, constants). Returns the
    scalar loss and :class:`StrictStats`.
    """
    _check(student_logits_BTsVs, teacher_logits_BTtVt, align)
    if int(top_k) < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    tau = float(temperature)
    Vs, Vt = student_logits_BTsVs.shape[2], teacher_logits_BTtVt.shape[2]
    s_idx, t_idx = _shared(shared_s_idx_N, shared_t_idx_N, Vs, Vt, student_logits_BTsVs.device)
    k = min(int(top_k), int(s_idx.numel()))
    ok_BC = loss_chunks(align, s_loss_mask_BTs, t_loss_mask_BTt, exact_only=True)
    b_N, s_row_N, t_row_N = chunk_start_rows(align, ok_BC)
    teacher = teacher_logits_BTtVt.detach()
    masses: dict = {}

    def term(rows_nV, sl):
        logq_nV = log_softmax_safe(rows_nV / tau)
        lq_nS = logq_nV.index_select(1, s_idx)
        with torch.no_grad():
            logp_nV = log_softmax_safe(teacher[b_N[sl], t_row_N[sl]].to(rows_nV.dtype) / tau)
            lp_nS = logp_nV.index_select(1, t_idx)
            pick_nK = (torch.topk(lq_nS, k, dim=1).indices if k < s_idx.numel()
                       else torch.arange(k, device=lq_nS.device).expand(lq_nS.shape[0], k))
            lp_nK = lp_nS.gather(1, pick_nK)
            masses[sl.start] = (float(lq_nS.gather(1, pick_nK).exp().sum()),
                                float(lp_nK.exp().sum()), float(lp_nS.exp().sum()))
        lq_nK = lq_nS.gather(1, pick_nK)
        return xlogx_minus_xlogy(log_softmax_safe(lq_nK), log_softmax_safe(lp_nK)).sum()

    total = row_block_sum(student_logits_BTsVs, b_N, s_row_N, term, chunk_size)
    units = int(b_N.numel())
    loss = total * tau ** 2 / resolve_count(num_valid, units)
    per = max(units, 1)
    sums = [sum(v[j] for v in masses.values()) / per for j in range(3)]
    return loss, StrictStats(units, k, *sums)


__all__ = ["DEFAULT_TOP_K", "StrictStats", "count_strict_units", "strict_topk"]
