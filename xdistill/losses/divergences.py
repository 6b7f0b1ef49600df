"""Same-tokenizer divergences: forward/reverse KL, JSD(beta), top-k KL with a tail bucket, CE.

Legend: B batch, T tokens, V vocabulary, K top-k, N selected positions, n rows of one block.

Shared conventions:

* ``student_logits_BTV`` / ``teacher_logits_BTV`` are model outputs at *input* positions: row
  ``t`` predicts token ``t + 1``. ``loss_mask_BT`` marks the *tokens* whose prediction is
  distilled; token ``i`` is scored with output row ``i - 1``, so token 0 never carries loss and the
  last output row is never used. Masked rows are never read (padding may hold anything, ``-inf``
  included).
* Temperature ``tau``: ``p = softmax(z_s / tau)``, ``q = softmax(z_t / tau_t)`` with
  ``tau_t = teacher_temperature`` or ``tau``; the KL-type losses are multiplied by ``tau**2`` so
  their gradients keep the scale of ``tau = 1``. Top-k teacher log-probs cannot be re-tempered
  (the tail is unknown): they must already be at ``tau`` (the teacher worker applies it).
* Normalisation: the sum of per-token terms divided by ``num_valid`` (the trainer's global count of
  loss tokens over ranks and micro-batches) or, when None, by the local count
  (:func:`count_valid_tokens`); never by 0.
* ``-inf`` logits are allowed (vocabulary masking): ``0 log 0 = 0``, and a zero probability in a
  denominator is floored at ``LOGP_FLOOR`` (a huge but finite term, never inf/NaN, gradients too).
"""

from __future__ import annotations

import math

import torch

from xdistill.losses.chunks import resolve_count
from xdistill.losses.engine import (DEFAULT_CHUNK_SIZE, LOGP_FLOOR, log1mexp, log_softmax_safe, row_block_sum,
                                    safe_logsumexp, shift_targets, token_logprobs,
                                    xlogx_minus_xlogy)
from xdistill.losses.smoothing import uniform_nll


def count_valid_tokens(loss_mask_BT: torch.Tensor) -> int:
    """Loss tokens of a batch: masked-in tokens at positions >= 1 (the local ``num_valid``)."""
    return int(loss_mask_BT[:, 1:].bool().sum())


def forward_kl_rows(logp_nV: torch.Tensor, logq_nV: torch.Tensor) -> torch.Tensor:
    """``KL(q || p) = sum_v q_v (log q_v - log p_v)`` per row, [n]."""
    return xlogx_minus_xlogy(logq_nV, logp_nV).sum(-1)


def reverse_kl_rows(logp_nV: torch.Tensor, logq_nV: torch.Tensor) -> torch.Tensor:
    """``KL(p || q) = sum_v p_v (log p_v - log q_v)`` per row, [n]."""
    return xlogx_minus_xlogy(logp_nV, logq_nV).sum(-1)


def _safe_logaddexp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    both = torch.isneginf(a) & torch.isneginf(b)
    zero = torch.zeros_like(a)
    out = torch.logaddexp(torch.where(both, zero, a), torch.where(both, zero, b))
    return torch.where(both, torch.full_like(out, -math.inf), out)


def jsd_rows(logp_nV: torch.Tensor, logq_nV: torch.Tensor, beta: float) -> torch.Tensor:
    """Generalised JSD per row (TRL GKD's definition), [n].

    ``M = beta q + (1 - beta) p``, ``JSD_beta = beta KL(q || M) + (1 - beta) KL(p || M)``. As
    ``beta -> 0`` it behaves like ``beta KL(q || p)`` (forward-like), as ``beta -> 1`` like
    ``(1 - beta) KL(p || q)`` (reverse-like); the end points are therefore *defined* as the plain
    forward KL (``beta = 0``) and reverse KL (``beta = 1``), where the formula would vanish.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"JSD beta must lie in [0, 1], got {beta}")
    if beta == 0.0:
        return forward_kl_rows(logp_nV, logq_nV)
    if beta == 1.0:
        return reverse_kl_rows(logp_nV, logq_nV)
    logm = _safe_logaddexp(logq_nV + math.log(beta), logp_nV + math.log1p(-beta))
    return (beta * xlogx_minus_xlogy(logq_nV, logm).sum(-1)
            + (1.0 - beta) * xlogx_minus_xlogy(logp_nV, logm).sum(-1))


def _check_same_shape(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> None:
    if student.dim() != 3 or teacher.shape[:2] != student.shape[:2]:
        raise ValueError(f"student logits [B,T,V] {tuple(student.shape)} and teacher "
                         f"{tuple(teacher.shape)} must share B and T")
    if tuple(mask.shape) != tuple(student.shape[:2]):
        raise ValueError(f"loss mask {tuple(mask.shape)} must be [B,T] = {tuple(student.shape[:2])}")


def _full_teacher_loss(rows_fn, student_logits_BTV, teacher_logits_BTV, loss_mask_BT,
                       temperature, teacher_temperature, num_valid, chunk_size):
    _check_same_shape(student_logits_BTV, teacher_logits_BTV, loss_mask_BT)
    if teacher_logits_BTV.shape[2] != student_logits_BTV.shape[2]:
        raise ValueError(f"same-tokenizer loss needs equal vocabularies: student "
                         f"{student_logits_BTV.shape[2]} vs teacher {teacher_logits_BTV.shape[2]}")
    tau_s = float(temperature)
    tau_t = tau_s if teacher_temperature is None else float(teacher_temperature)
    b_N, t_N = torch.nonzero(loss_mask_BT[:, 1:].bool(), as_tuple=True)

    def term(rows_nV, sl):
        logp = log_softmax_safe(rows_nV / tau_s)
        logq = log_softmax_safe(teacher_logits_BTV[b_N[sl], t_N[sl]].to(rows_nV.dtype) / tau_t)
        return rows_fn(logp, logq).sum()

    total = row_block_sum(student_logits_BTV, b_N, t_N, term, chunk_size)
    return total * (tau_s ** 2) / resolve_count(num_valid, b_N.numel())


def forward_kl(student_logits_BTV, teacher_logits_BTV, loss_mask_BT, *, temperature=1.0,
               teacher_temperature=None, num_valid=None, chunk_size=DEFAULT_CHUNK_SIZE):
    """``tau^2 / num_valid * sum_i KL(q_i || p_i)`` over loss tokens (see module doc)."""
    return _full_teacher_loss(forward_kl_rows, student_logits_BTV, teacher_logits_BTV,
                              loss_mask_BT, temperature, teacher_temperature, num_valid,
                              chunk_size)


def reverse_kl(student_logits_BTV, teacher_logits_BTV, loss_mask_BT, *, temperature=1.0,
               teacher_temperature=None, num_valid=None, chunk_size=DEFAULT_CHUNK_SIZE):
    """``tau^2 / num_valid * sum_i KL(p_i || q_i)`` over loss tokens (see module doc)."""
    return _full_teacher_loss(reverse_kl_rows, student_logits_BTV, teacher_logits_BTV,
                              loss_mask_BT, temperature, teacher_temperature, num_valid,
                              chunk_size)


def jsd(student_logits_BTV, teacher_logits_BTV, loss_mask_BT, *, beta=0.5, temperature=1.0,
        teacher_temperature=None, num_valid=None, chunk_size=DEFAULT_CHUNK_SIZE):
    """``tau^2 / num_valid * sum_i JSD_beta(p_i, q_i)`` (definition in :func:`jsd_rows`)."""
    return _full_teacher_loss(lambda lp, lq: jsd_rows(lp, lq, float(beta)), student_logits_BTV,
                              teacher_logits_BTV, loss_mask_BT, temperature, teacher_temperature,
                              num_valid, chunk_size)


def topk_tail_kl_rows(z_nV: torch.Tensor, tlogp_nK: torch.Tensor, tidx_nK: torch.Tensor,
                      ttail_n: torch.Tensor | None = None) -> torch.Tensor:
    """Top-k forward KL with a tail bucket per row, [n]; ``z_nV`` are tempered student logits.

    ``sum_{v in K} q_v log(q_v / p_v) + q_R log(q_R / p_R)`` with ``q_R = 1 - sum_K q_v`` and
    ``p_R = 1 - sum_K p_v``: the exact KL between the two distributions coarsened to the K+1
    outcomes {each top-k id, "anything else"}, hence >= 0 with no clamp. Computed in log space:
    ``log p_R = logsumexp(z outside K) - logsumexp(z)`` (no cancellation); ``log q_R`` is the
    teacher's tail log-mass ``ttail_n`` when given, else ``log1mexp(logsumexp(log q_K))``.
    Entries with ``log q = -inf`` are padding, not members of K. The teacher side is kept a
    distribution (see :func:`_topk_teacher`); when the top-k ids cover all ``V`` columns the tail
    is empty: ``q_R = 0`` and ``p_R = 0`` contribute nothing.
    """
    in_K, idx, logq_K, logq_R = _topk_teacher(tlogp_nK, tidx_nK, z_nV.dtype, z_nV.shape[1],
                                              ttail_n)
    lse = safe_logsumexp(z_nV, -1)
    logp_K = z_nV.gather(1, idx) - lse.unsqueeze(1)
    member = torch.zeros_like(z_nV).scatter_add_(1, idx, in_K.to(z_nV.dtype)) > 0
    logp_R = safe_logsumexp(z_nV.masked_fill(member, -math.inf), -1) - lse
    top = xlogx_minus_xlogy(logq_K, logp_K).sum(-1)
    return top + xlogx_minus_xlogy(logq_R, logp_R)


def _distinct_ids(in_K: torch.Tensor, tidx_nK: torch.Tensor) -> torch.Tensor:
    """Number of distinct real top-k ids per row, [n]."""
    sid = torch.where(in_K, tidx_nK, torch.full_like(tidx_nK, -1)).sort(1).values
    new = sid >= 0
    new[:, 1:] &= sid[:, 1:] != sid[:, :-1]
    return new.sum(1)


def _topk_teacher(tlogp_nK: torch.Tensor, tidx_nK: torch.Tensor, dt: torch.dtype, V: int,
                  ttail_n: torch.Tensor | None = None):
    """Teacher side of the tail-bucket KL: (in_K, safe ids, log q_K, log q_R), all [n, K] / [n].

    Padding entries (``log q = -inf``) get the id of the row's first real entry (or 0 when the
    row has none), so scatters through the safe ids never disturb another column. ``log q_R``:
    ``-inf`` where the real ids cover all ``V`` columns (an empty tail; ``q_K`` is renormalised
    to sum 1); else the teacher's tail log-mass ``ttail_n`` when given, and ``q_K`` and ``q_R``
    are normalised jointly to sum 1 (absorbing the rounding of stored log-probs, e.g. bf16);
    else ``log(1 - sum_K q)``, with ``q_K`` scaled down if its sum exceeds 1 by rounding.
    """
    in_K = torch.isfinite(tlogp_nK)
    first_n1 = in_K.long().argmax(1, keepdim=True)  # 0 when the row has no real entry
    pad_id = tidx_nK.gather(1, first_n1)
    pad_id = torch.where(in_K.any(1, keepdim=True), pad_id, torch.zeros_like(pad_id))
    idx = torch.where(in_K, tidx_nK, pad_id)
    logq_K = torch.where(in_K, tlogp_nK.to(dt), torch.full_like(tlogp_nK, -math.inf, dtype=dt))
    mass = safe_logsumexp(logq_K, -1)
    if ttail_n is None:
        logq_R = log1mexp(mass.clamp_max(0.0))
        over = mass.clamp_min(0.0)
    else:
        logq_R = ttail_n.to(dt).clamp_max(0.0)
        over = torch.logaddexp(mass, logq_R)
        over = torch.where(torch.isfinite(over), over, torch.zeros_like(over))
    if tidx_nK.shape[1] >= V:                       # the top-k may cover the vocabulary
        empty = _distinct_ids(in_K, tidx_nK) >= V
        logq_R = torch.where(empty, torch.full_like(logq_R, -math.inf), logq_R)
        over = torch.where(empty & torch.isfinite(mass), mass, over)
    return in_K, idx, logq_K - over.unsqueeze(1), logq_R - over


def _term_and_weight(logq, logp):
    """``q (log q - max(log p, LOGP_FLOOR))`` (0 where q = 0) and its weight ``-d/d log p``."""
    q = torch.exp(logq)
    live = q > 0
    term = torch.where(live, q * (logq - logp.clamp_min(LOGP_FLOOR)), torch.zeros_like(q))
    return term, torch.where(live & (logp >= LOGP_FLOOR), q, torch.zeros_like(q))


def topk_tail_kl_block(z_nV: torch.Tensor, tlogp_nK: torch.Tensor, tidx_nK: torch.Tensor,
                       need_grad: bool, ttail_n: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Fused :func:`topk_tail_kl_rows`: (sum over rows, gradient w.r.t. ``z_nV`` or None).

    ``z_nV`` (tempered student logits, a private copy) is **overwritten** with the gradient.
    The tail is exponentiated against its *own* maximum ``m_R`` (the top-k columns set to
    ``-inf``): ``e_v = exp(z_v - m_R)``, ``S_R = sum_tail e`` and ``S = exp(m_R - m) S_R +
    sum_k exp(z_k - m)`` (each top-k id once), so a tail far below the top-k (about 90 nats in
    float32) keeps an exact ``log p_R = m_R - m + log S_R - log S`` where ``exp(z - m)`` underflowed
    and ``w_R / S_R`` overflowed. With weights ``w_k = q_k`` and ``w_R = q_R`` (0 where ``q = 0``
    or ``log p`` is floored) and ``W = sum_k w_k + w_R``, the gradient is ``d/dz_v = p_v W -
    sum_{k: id_k = v} w_k`` for top-k ids and ``e_v (exp(m_R - m) W / S - w_R / S_R)`` elsewhere
    (the second term is at most ``w_R``). An empty tail (the top-k ids cover the vocabulary) has
    ``q_R = 0``: no term, no weight.
    """
    dt = z_nV.dtype
    in_K, idx, logq_K, logq_R = _topk_teacher(tlogp_nK, tidx_nK, dt, z_nV.shape[1], ttail_n)
    m = z_nV.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # all -inf rows: p = 0
    z_K = z_nV.gather(1, idx)
    has_K = in_K.any(1, keepdim=True)
    z_nV.scatter_(1, idx, torch.where(has_K, torch.full_like(z_K, -math.inf), z_K))
    m_R = z_nV.amax(-1, keepdim=True)
    m_R = torch.where(torch.isfinite(m_R), m_R, m)              # no tail column: e = 0
    e = z_nV.sub_(m_R).exp_()                                   # tail columns; top-k ones are 0
    S_R = e.sum(-1, keepdim=True)
    e_K = torch.exp(z_K - m)
    S = torch.exp(m_R - m) * S_R + torch.where(_first_ids(in_K, idx), e_K,
                                               torch.zeros_like(e_K)).sum(-1, keepdim=True)
    alive = S > 0
    log_S = torch.log(torch.where(alive, S, torch.ones_like(S)))
    logp_K = torch.where(alive, z_K - m - log_S, torch.full_like(z_K, -math.inf))
    tail = (alive & (S_R > 0)).squeeze(1)
    S_R = torch.where(tail, S_R.squeeze(1), torch.ones_like(S_R.squeeze(1)))  # else log p_R = -inf
    logp_R = torch.where(tail, torch.log(S_R) + (m_R - m - log_S).squeeze(1),
                         torch.full_like(S_R, -math.inf))
    term_K, w_K = _term_and_weight(logq_K, logp_K)
    term_R, w_R = _term_and_weight(logq_R, logp_R)
    value = term_K.sum() + term_R.sum()
    if not need_grad:
        return value, None
    w_K = torch.where(in_K, w_K, torch.zeros_like(w_K))
    W = (w_K.sum(-1) + w_R).unsqueeze(1)
    inv_S = torch.where(alive, 1.0 / S, torch.zeros_like(S))
    c_R = (w_R / S_R).unsqueeze(1)                    # w_R = 0 wherever S_R was replaced
    g = e.mul_(torch.exp(m_R - m) * W * inv_S - c_R)  # tail columns; top-k columns are 0 here
    top = torch.where(has_K, e_K * (W * inv_S), g.gather(1, idx))
    g.scatter_(1, idx, top)
    return value, g.scatter_add_(1, idx, -w_K)


def _first_ids(in_K: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """bool ``[n, K]``: real entries whose id no earlier real entry of the row has (each top-k
    column counted once in a sum over the K entries)."""
    K = idx.shape[1]
    same = (idx.unsqueeze(2) == idx.unsqueeze(1)) & in_K.unsqueeze(1)
    earlier = torch.ones(K, K, dtype=torch.bool, device=idx.device).tril(-1)
    return in_K & ~(same & earlier).any(-1)


def topk_forward_kl(student_logits_BTV, teacher_topk_logp_BTK, teacher_topk_idx_BTK, loss_mask_BT,
                    *, teacher_tail_logmass_BT=None, temperature=1.0, num_valid=None,
                    chunk_size=DEFAULT_CHUNK_SIZE):
    """``tau^2 / num_valid * sum_i`` top-k tail-bucket KL (:func:`topk_tail_kl_rows`).

    ``teacher_topk_logp_BTK`` are teacher log-probabilities *at temperature tau* (over the full
    teacher vocabulary, so their exp sums to <= 1), ``teacher_topk_idx_BTK`` their token ids.
    ``teacher_tail_logmass_BT`` (optional, ``[B, T]``): the teacher's log-mass outside its top-k
    (``TeacherOutput.tail_logmass_BTt``), accurate where ``1 - sum exp(top-k)`` is not (a tiny
    tail, bf16 log-probs); without it the tail is ``log(1 - sum exp(top-k))``. A top-k that
    covers the whole vocabulary has an empty tail, which contributes exactly 0 either way.
    Evaluated by the fused :func:`topk_tail_kl_block` (hand-written gradient, no autograd graph).
    """
    _check_same_shape(student_logits_BTV, teacher_topk_logp_BTK, loss_mask_BT)
    if teacher_topk_idx_BTK.shape != teacher_topk_logp_BTK.shape:
        raise ValueError(f"top-k ids {tuple(teacher_topk_idx_BTK.shape)} and log-probs "
                         f"{tuple(teacher_topk_logp_BTK.shape)} differ in shape")
    tail_BT = teacher_tail_logmass_BT
    if tail_BT is not None and tuple(tail_BT.shape) != tuple(teacher_topk_logp_BTK.shape[:2]):
        raise ValueError(f"teacher tail log-mass {tuple(tail_BT.shape)} must be [B, T] = "
                         f"{tuple(teacher_topk_logp_BTK.shape[:2])}")
    tau = float(temperature)
    b_N, t_N = torch.nonzero(loss_mask_BT[:, 1:].bool(), as_tuple=True)

    def term(rows_nV, sl, need_grad):
        tl = teacher_topk_logp_BTK[b_N[sl], t_N[sl]]
        ti = teacher_topk_idx_BTK[b_N[sl], t_N[sl]].long()
        tt = None if tail_BT is None else tail_BT[b_N[sl], t_N[sl]]
        if tau != 1.0:
            rows_nV.div_(tau)
        value, g = topk_tail_kl_block(rows_nV, tl, ti, need_grad, tt)
        return value, (g.div_(tau) if g is not None and tau != 1.0 else g)

    total = row_block_sum(student_logits_BTV, b_N, t_N, term, chunk_size, analytic=True)
    return total * (tau ** 2) / resolve_count(num_valid, b_N.numel())


def cross_entropy(student_logits_BTV, labels_BT, *, temperature=1.0, num_valid=None,
                  chunk_size=DEFAULT_CHUNK_SIZE, overwrite_logits=False, label_smoothing=0.0):
    """``-1/num_valid * sum_i log p(labels_i)`` over tokens ``i >= 1`` with ``labels_i >= 0``.

    ``labels_BT`` are at input positions (``-100`` = no loss, as in ``DistillBatch.labels_BTs``);
    the prediction of token ``i`` is output row ``i - 1``. The local count is the number of such
    labels. A label with probability 0 (a ``-inf`` logit) costs ``-LOGP_FLOOR``, not inf.
    ``overwrite_logits`` (opt-in): backward writes the gradient over the student logits instead
    of a new ``[B, T, V]`` buffer (:func:`~xdistill.losses.engine.token_logprobs` explains when
    that is safe). ``label_smoothing`` ``eps`` in [0, 1): each token's term becomes
    ``(1 - eps) * (-log p(label)) + eps * (-mean_v log p(v))`` (torch's definition; the mean over
    the finite logits, :mod:`xdistill.losses.smoothing`); it turns ``overwrite_logits`` off.
    """
    if tuple(labels_BT.shape) != tuple(student_logits_BTV.shape[:2]):
        raise ValueError(f"labels {tuple(labels_BT.shape)} must be [B,T] = "
                         f"{tuple(student_logits_BTV.shape[:2])}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must lie in [0, 1), got {label_smoothing}")
    target_BT = shift_targets(labels_BT, labels_BT >= 0)
    logp_BT = token_logprobs(student_logits_BTV, target_BT, temperature, chunk_size,
                             overwrite_logits=overwrite_logits and not label_smoothing)
    count = resolve_count(num_valid, int((target_BT >= 0).sum()))
    nll = -logp_BT.clamp_min(LOGP_FLOOR).sum()
    if not label_smoothing:
        return nll / count
    uniform = uniform_nll(student_logits_BTV, target_BT, temperature, chunk_size).sum()
    return ((1.0 - label_smoothing) * nll + label_smoothing * uniform) / count
