"""Sorted-probability losses across tokenizers: ULD and the GOLD hybrid.

Legend: B batch, Ts/Tt student/teacher tokens, Vs/Vt vocabularies, N shared vocabulary entries,
n rows of one block.

Both compare, per loss chunk, the student's and the teacher's next-token distributions at the
chunk start (see ``xdistill.losses.cross`` for why these positions and which chunks count).
"""

from __future__ import annotations

import torch

from xdistill.losses.chunks import ChunkAlignment
from xdistill.losses.cross import _chunk_start_loss, _divergence, sorted_l1_rows
from xdistill.losses.engine import DEFAULT_CHUNK_SIZE, log_softmax_safe


def uld(student_logits_BTsVs, teacher_logits_BTtVt, align: ChunkAlignment, *,
        s_loss_mask_BTs=None, t_loss_mask_BTt=None, temperature=1.0, teacher_temperature=None,
        num_valid=None, chunk_size=DEFAULT_CHUNK_SIZE):
    """Universal Logit Distillation: ``sum_r |sort_desc(p)_r - sort_desc(q)_r|`` per chunk.

    The shorter vocabulary is zero-padded to the longer one (so the tail of the longer side adds
    its mass). It is the closed-form optimal-transport distance under a uniform transport cost;
    an L1 on probabilities, so no ``tau^2`` factor.
    """
    tau = float(temperature)
    tau_t = tau if teacher_temperature is None else float(teacher_temperature)

    def rows_fn(z_s, z_t):
        p = torch.exp(log_softmax_safe(z_s / tau))
        with torch.no_grad():
            q = torch.exp(log_softmax_safe(z_t / tau_t))
        return sorted_l1_rows(p, q)

    return _chunk_start_loss(student_logits_BTsVs, teacher_logits_BTtVt, align, s_loss_mask_BTs,
                             t_loss_mask_BTt, rows_fn, exact_only=False, num_valid=num_valid,
                             chunk_size=chunk_size, scale=1.0)


def _complement(idx_N: torch.Tensor, V: int) -> torch.Tensor:
    keep = torch.ones(V, dtype=torch.bool, device=idx_N.device)
    keep[idx_N] = False
    return torch.nonzero(keep).squeeze(1)


def gold_hybrid(student_logits_BTsVs, teacher_logits_BTtVt, align: ChunkAlignment,
                shared_s_idx_N, shared_t_idx_N, *, s_loss_mask_BTs=None, t_loss_mask_BTt=None,
                direction="forward", beta=0.5, common_weight=1.0, uncommon_weight=1.0,
                temperature=1.0, teacher_temperature=None, num_valid=None,
                chunk_size=DEFAULT_CHUNK_SIZE):
    """GOLD hybrid: KL on the exact-matched vocabulary + sorted L1 on the rest, per chunk.

    With ``U_s``/``U_t`` the ids *not* in the shared map:
    ``common_weight * tau^2 * D(q', p') + uncommon_weight * sum_r |sort(p|U_s)_r - sort(q|U_t)_r|``
    where ``p'``/``q'`` are the distributions restricted to the shared ids and renormalised (as in
    :func:`~xdistill.losses.cross.exact_kl`) and the L1 uses the *unnormalised* probabilities on
    the unshared ids (zero-padded), so it also penalises a different amount of unshared mass.
    Unlike ``exact_kl`` it is applied at every loss chunk, not only exact ones.
    """
    tau = float(temperature)
    tau_t = tau if teacher_temperature is None else float(teacher_temperature)
    Vs, Vt = student_logits_BTsVs.shape[2], teacher_logits_BTtVt.shape[2]
    s_idx, t_idx = shared_s_idx_N.long(), shared_t_idx_N.long()
    if s_idx.shape != t_idx.shape or s_idx.numel() == 0:
        raise ValueError(f"shared index maps must be equal-length and non-empty, got "
                         f"{tuple(s_idx.shape)} and {tuple(t_idx.shape)}")
    s_unc, t_unc = _complement(s_idx, Vs), _complement(t_idx, Vt)
    div = _divergence(direction, beta)
    w_c, w_u = float(common_weight) * tau ** 2, float(uncommon_weight)

    def rows_fn(z_s, z_t):
        zs, zt = z_s / tau, z_t / tau_t
        common = div(log_softmax_safe(zs.index_select(1, s_idx)),
                     log_softmax_safe(zt.index_select(1, t_idx)))
        p = torch.exp(log_softmax_safe(zs))
        with torch.no_grad():
            q = torch.exp(log_softmax_safe(zt))
        tail = sorted_l1_rows(p.index_select(1, s_unc), q.index_select(1, t_unc))
        return w_c * common + w_u * tail

    return _chunk_start_loss(student_logits_BTsVs, teacher_logits_BTtVt, align, s_loss_mask_BTs,
                             t_loss_mask_BTt, rows_fn, exact_only=False, num_valid=num_valid,
                             chunk_size=chunk_size, scale=1.0)
