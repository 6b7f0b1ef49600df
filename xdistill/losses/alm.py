"""ALM: approximate likelihood matching of aligned chunks (Minixhofer et al., tokenkit).

Legend: B batch, Ts/Tt student/teacher tokens, Vs/Vt vocabularies, C chunks.

For a chunk ``k`` covering student tokens ``S_k`` and teacher tokens ``T_k`` (identical bytes):

    l^S_k = sum_{i in S_k} log p_S(s_i | s_<i),   l^T_k = sum_{j in T_k} log p_T(t_j | t_<j)

are the two models' log-likelihoods of the *same* byte string given the *same* text before it, so
they are directly comparable (unlike per-position distributions inside a chunk). With
``a = exp(l^T / tau_alm)`` and ``b = exp(l^S / tau_alm)`` (``tau_alm`` = 100 by default):

* ``"bce"``: ``d_k = -[a log b + (1 - a) log(1 - b)]``, computed in log space as
  ``-[a x + (1 - a) log1mexp(x)]`` with ``x = l^S / tau_alm``; minimal (not zero: it equals the
  binary entropy of ``a``) at ``l^S = l^T``. ``x`` is clamped at ``-1e-30`` so ``log(1 - b)``
  stays finite when the student gives the chunk probability 1 in floating point;
* ``"abs"``: ``d_k = |l^S_k - l^T_k|``.

The loss is ``sum_k d_k / num_valid`` over loss chunks (``xdistill.losses.cross`` module doc; the
same :func:`~xdistill.losses.cross.count_loss_chunks` count). Token log-probs use the softmax
temperature ``temperature`` (1 by default). Chunks containing token 0 on either side are dropped.
"""

from __future__ import annotations

import torch

from xdistill.losses.chunks import ChunkAlignment, chunk_sum, loss_chunks, resolve_count
from xdistill.losses.engine import (DEFAULT_CHUNK_SIZE, LOGP_FLOOR, log1mexp, shift_targets,
                                    token_logprobs)

_ALM_X_MAX = -1.0e-30


def input_position_logprobs(logits_BTV, ids_BT, chunk_BT, *, temperature=1.0,
                            chunk_size=DEFAULT_CHUNK_SIZE, overwrite_logits=False) -> torch.Tensor:
    """``out[b, i] = log p(ids[b, i] | ids[b, <i])`` for aligned tokens ``i >= 1``, else 0, [B, T].

    Only tokens inside a chunk (``chunk_BT >= 0``) are evaluated (others cost nothing).
    ``overwrite_logits``: see :func:`~xdistill.losses.engine.token_logprobs`.
    """
    target_BT = shift_targets(ids_BT, chunk_BT >= 0)
    logp_out_BT = token_logprobs(logits_BTV, target_BT, temperature, chunk_size,
                                 overwrite_logits=overwrite_logits)
    zero = torch.zeros_like(logp_out_BT[:, :1])
    return torch.cat([zero, logp_out_BT[:, :-1].clamp_min(LOGP_FLOOR)], dim=1)


def _same_width_rows(chunk_size, v_student: int, v_teacher: int):
    """Teacher rows per block holding about ``chunk_size`` student rows' worth of values."""
    if chunk_size is None:
        return None
    return max(1, int(chunk_size) * v_student // max(v_teacher, 1))


def alm_chunk_divergence(ls_C: torch.Tensor, lt_C: torch.Tensor, *, variant: str = "bce",
                         alm_temperature: float = 100.0) -> torch.Tensor:
    """Per-chunk ALM divergence ``d_k`` between student and teacher chunk log-likelihoods."""
    if variant == "abs":
        return (ls_C - lt_C).abs()
    if variant != "bce":
        raise ValueError(f"ALM variant must be 'bce' or 'abs', got {variant!r}")
    x = (ls_C / alm_temperature).clamp_max(_ALM_X_MAX)
    a = torch.exp(lt_C / alm_temperature).clamp_max(1.0)
    return -(a * x + (1.0 - a) * log1mexp(x))


def alm(student_logits_BTsVs, student_ids_BTs, align: ChunkAlignment, *, teacher_logits_BTtVt=None,
        teacher_ids_BTt=None, teacher_token_logp_BTt=None, s_loss_mask_BTs=None,
        t_loss_mask_BTt=None, variant="bce", alm_temperature=100.0, temperature=1.0,
        teacher_temperature=None, num_valid=None, chunk_size=DEFAULT_CHUNK_SIZE,
        overwrite_logits=False):
    """ALM chunk-likelihood loss (module doc). The teacher side comes from
    ``teacher_token_logp_BTt`` (``log p_T(t_j | t_<j)`` at input positions) or from
    ``teacher_logits_BTtVt`` with ``teacher_ids_BTt``; it is never differentiated. Teacher rows
    are read in blocks of ``chunk_size * Vs / Vt`` rows, so a block holds about as many values
    as a student block. ``overwrite_logits`` (opt-in): the student gradient is written over the
    student logits in backward (:func:`~xdistill.losses.engine.token_logprobs`)."""
    C = align.num_chunks
    ls_BT = input_position_logprobs(student_logits_BTsVs, student_ids_BTs, align.s_chunk_BTs,
                                    temperature=temperature, chunk_size=chunk_size,
                                    overwrite_logits=overwrite_logits)
    with torch.no_grad():
        if teacher_token_logp_BTt is not None:
            lt_BT = teacher_token_logp_BTt.to(ls_BT.dtype)
            pos_BT = torch.arange(lt_BT.shape[1], device=lt_BT.device).expand_as(lt_BT)
            usable = (align.t_chunk_BTt >= 0) & (pos_BT >= 1) & ~torch.isnan(lt_BT)
            lt_BT = torch.where(usable, lt_BT.clamp_min(LOGP_FLOOR), torch.zeros_like(lt_BT))
        elif teacher_logits_BTtVt is not None and teacher_ids_BTt is not None:
            tau_t = temperature if teacher_temperature is None else teacher_temperature
            lt_BT = input_position_logprobs(
                teacher_logits_BTtVt, teacher_ids_BTt, align.t_chunk_BTt, temperature=tau_t,
                chunk_size=_same_width_rows(chunk_size, student_logits_BTsVs.shape[-1],
                                            teacher_logits_BTtVt.shape[-1])).to(ls_BT.dtype)
        else:
            raise ValueError("ALM needs the teacher's token log-probs: give teacher_token_logp_BTt"
                             " or teacher_logits_BTtVt with teacher_ids_BTt")
    ok_BC = loss_chunks(align, s_loss_mask_BTs, t_loss_mask_BTt)
    zero_BC = torch.zeros(ok_BC.shape, dtype=ls_BT.dtype, device=ls_BT.device)
    ls_BC = torch.where(ok_BC, chunk_sum(ls_BT, align.s_chunk_BTs, C), zero_BC)
    lt_BC = torch.where(ok_BC, chunk_sum(lt_BT, align.t_chunk_BTt, C), zero_BC)
    d_BC = alm_chunk_divergence(ls_BC, lt_BC, variant=variant, alm_temperature=alm_temperature)
    d_BC = torch.where(ok_BC, d_BC, torch.zeros_like(d_BC))
    return d_BC.sum() / resolve_count(num_valid, int(ok_BC.sum()))
