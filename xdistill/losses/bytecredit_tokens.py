"""Byte-level credit per student token: each unit's covering probability split by the chain rule.

Legend: B batch, Ts/Tt student/teacher tokens, C chunks, N sub-units (the student tokens of the
loss units, in row-major order).

**Why.** Under chunk units (:mod:`xdistill.losses.bytecredit`) a k1 advantage, its baseline and
its clamp act on the aligned chunk: a cross-tokenizer teacher groups the student's tokens into
fewer, longer units than a same-tokenizer teacher would (the stop merged with the period it ends,
several student tokens under one teacher token). The baseline is a mean over units and the clamp
bounds a unit, so the same sample is centred and clamped differently from how a teacher with the
student's own tokenizer would treat it.

**What** (``loss.byte_units = "token"``). For a unit ``u`` with student tokens ``a_1 .. a_k``,
sub-unit ``j`` is the prefix "*the bytes of ``a_1 .. a_j``, then the boundary the student's
tokenization implies after ``a_j``*"; ``j = k`` is the unit itself (with "then the end of the
text" when it ends with the student's stop). Each side's lower bound ``Q(u_{<=j})`` comes from the
same one-forward lookahead as a chunk's (a side's token that crosses the prefix's end sticks out
at its level; :func:`xdistill.rollout.bytecredit.build_byte_terms` with ``units="token"``). Token
``a_j`` gets the credit

    r_j = [log Q_T(u_{<=j}) - log Q_T(u_{<=j-1})] - [log Q_S(u_{<=j}) - log Q_S(u_{<=j-1})],
    Q(u_{<=0}) = 1,

so the credits of a unit's tokens sum to the unit's ``r_u`` exactly (telescoping), a teacher
identical to the student gives 0, and the stop token's credit is the teacher's byte-level
probability that the text ends after the content, relative to "the content, then the student's
boundary" (against the student's same ratio). The events of consecutive prefixes are not nested in
general (a later teacher token can cross the boundary after ``a_j``), so a token's teacher ratio
can exceed 1; the advantage clamp bounds it. k1/k3 then run on student-token units exactly as with
a same-tokenizer teacher (:func:`xdistill.losses.onpolicy.onpolicy_loss`), with the effective
teacher log-prob ``log p(a_j) + r_j`` per token.
"""

from __future__ import annotations


import torch

from xdistill.losses.bytecredit import (ByteCredit, CreditStats, byte_bounds, credit_stats,
                                        prepare_byte_credit)
from xdistill.losses.chunks import ChunkAlignment, chunk_bounds, loss_chunks
from xdistill.losses.engine import DEFAULT_CHUNK_SIZE


def token_units(align: ChunkAlignment, s_loss_mask_BTs=None, t_loss_mask_BTt=None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(bool [B, Ts]: the student tokens of the loss units, bool [B, Ts]: each unit's first
    token), for the units of ``align`` (the stop-merged alignment)."""
    C = align.num_chunks
    ok_BC = loss_chunks(align, s_loss_mask_BTs, t_loss_mask_BTt)
    ch_BTs = align.s_chunk_BTs
    c_BTs = ch_BTs.clamp(min=0)
    in_BTs = (ch_BTs >= 0) & ok_BC.gather(1, c_BTs)
    start_BC, _ = chunk_bounds(ch_BTs, C)
    pos_BTs = torch.arange(ch_BTs.shape[1], device=ch_BTs.device).expand_as(ch_BTs)
    return in_BTs, in_BTs & (pos_BTs == start_BC.gather(1, c_BTs))


def count_token_units(align: ChunkAlignment, s_loss_mask_BTs=None, t_loss_mask_BTt=None) -> int:
    """Local student-token units (the student tokens of the loss chunks of ``align``)."""
    return int(token_units(align, s_loss_mask_BTs, t_loss_mask_BTt)[0].sum())


def token_credit(credit: ByteCredit, align: ChunkAlignment, s_loss_mask_BTs, t_loss_mask_BTt,
                 student_logits_BTsV, student_token_logp_BTs, teacher_logits_BTtV,
                 teacher_token_logp_BTt, *, temperature: float = 1.0
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, CreditStats]:
    """(credit ``r`` float64 [B, Ts] (0 off the units), the unit tokens bool [B, Ts], the
    teacher's ``log Q_T`` per sub-unit [N], stats) of the sub-units (module doc)."""
    in_BTs, first_BTs = token_units(align, s_loss_mask_BTs, t_loss_mask_BTt)
    b_N, i_N = torch.nonzero(in_BTs, as_tuple=True)
    N = int(b_N.numel())
    if credit.units != "token":
        raise ValueError(f"byte-credit terms built for {credit.units!r} units, the loss uses "
                         "student-token units (build them with units='token')")
    for side in (credit.teacher, credit.student):
        if side.num_units != N:
            raise ValueError(f"byte-credit terms for {side.num_units} sub-units, the alignment "
                             f"has {N} student tokens in its loss units (build them from the "
                             "same view, stop and masks)")
    tau = float(temperature)
    t_lb, t_ub, t_seg, t_zero = byte_bounds(teacher_logits_BTtV, teacher_token_logp_BTt,
                                            credit.teacher, temperature=tau)
    s_lb, s_ub, _, s_zero = byte_bounds(student_logits_BTsV, student_token_logp_BTs,
                                        credit.student, temperature=tau)
    d_N = t_lb - s_lb
    prev_N = torch.cat([d_N.new_zeros(1), d_N[:-1]])
    r_N = d_N - torch.where(first_BTs[b_N, i_N], torch.zeros_like(prev_N), prev_N)
    r_BTs = torch.zeros(in_BTs.shape, dtype=torch.float64, device=r_N.device)
    r_BTs[b_N, i_N] = r_N
    return r_BTs, in_BTs, t_lb, credit_stats(t_lb, t_ub, t_seg, t_zero, s_lb, s_ub, s_zero)


def evaluate_token_credit(kind: str, stop_advantage: str, credit: ByteCredit | None, align,
                          stop_BTs, student_logits_BTsV, student_ids_BTs, s_loss_mask_BTs,
                          teacher_logits_BTtV, teacher_ids_BTt, t_loss_mask_BTt=None, *,
                          temperature: float = 1.0, chunk_size=DEFAULT_CHUNK_SIZE
                          ) -> tuple[torch.Tensor, torch.Tensor, CreditStats]:
    """(effective teacher log-prob ``log p(a) + r_a`` per student token float64 [B, Ts] (0 off
    the units), the unit tokens bool [B, Ts], stats) of one cross-tokenizer teacher under
    byte-level credit with student-token units; clear errors for missing inputs."""
    merged, s_logp, t_logp, credit = prepare_byte_credit(
        kind, stop_advantage, credit, align, stop_BTs, student_logits_BTsV, student_ids_BTs,
        s_loss_mask_BTs, teacher_logits_BTtV, teacher_ids_BTt, t_loss_mask_BTt,
        temperature=temperature, chunk_size=chunk_size)
    r_BTs, in_BTs, _, stats = token_credit(credit, merged, s_loss_mask_BTs, t_loss_mask_BTt,
                                           student_logits_BTsV, s_logp, teacher_logits_BTtV,
                                           t_logp, temperature=temperature)
    t_eff_BTs = torch.where(in_BTs, s_logp.double() + r_BTs, torch.zeros_like(r_BTs))
    return t_eff_BTs, in_BTs, stats


__all__ = ["count_token_units", "evaluate_token_credit", "token_credit", "token_units"]
