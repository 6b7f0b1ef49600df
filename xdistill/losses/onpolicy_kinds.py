"""The 2026 on-policy cross-tokenizer kinds behind one call: strict_topk, dpca, simple_opd, bpm, escd.

Legend: B batch, Ts/Tt student/teacher tokens, Vs/Vt vocabularies, N shared vocabulary entries.

Each kind's math lives in its own module (:mod:`xdistill.losses.strict`,
:mod:`xdistill.losses.policy`, :mod:`xdistill.losses.byteprefix`); this module gives them the
contract of :func:`xdistill.losses.onpolicy.onpolicy_loss`: one teacher's inputs in, the loss
normalised by the caller's count and a fixed set of integer counters out (the same keys on every
call of a kind, so ranks reduce them together).

=============  ==============================  =============================================
kind           teacher inputs                  units
=============  ==============================  =============================================
strict_topk    full logits + shared vocabulary exact 1:1 loss chunks
dpca           token log-probs                 student tokens of the loss chunks
simple_opd     token log-probs                 every student loss token (i >= 1), unpaired
                                               ones included (counted once)
bpm, escd      full logits + byte-prefix map   loss chunks (minus whitespace-masked roots)
               (+ teacher ids, long-token map)
=============  ==============================  =============================================

DPCA and SimpleOPD also need the rollout's behaviour log-probs; SimpleOPD the stop-token mask and,
for its reference KL, the initial student's log-probs of the samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xdistill.losses.byteprefix import bpm, count_byteprefix_units, escd
from xdistill.losses.policy import (SIMPLE_OPD_REF_BETA, PPOClip, count_dpca_units,
                                    count_simple_opd_units, dpca, simple_opd)
from xdistill.losses.strict import count_strict_units, strict_topk

KINDS_2026 = ("strict_topk", "dpca", "simple_opd", "bpm", "escd")
FULL_LOGITS_KINDS = ("strict_topk", "bpm", "escd")
# integer counters each kind reports (summed over ranks by the trainer)
KIND_COUNTERS = {
    "strict_topk": (),
    "dpca": ("adv_clamped", "ratio_clipped", "dual_clipped", "log_ratio_clamped",
             "uniform_fallbacks"),
    "simple_opd": ("adv_clamped", "ratio_clipped", "dual_clipped", "log_ratio_clamped",
                   "stop_zeroed"),
    "bpm": ("whitespace_masked", "bot_floor"),
    "escd": ("whitespace_masked", "bot_floor", "child_groups", "empty_groups"),
}


@dataclass(frozen=True)
class KindParams:
    """The knobs of the 2026 kinds (defaults: each paper's published setting)."""

    # strict_topk: the student's top-k inside the shared vocabulary (16 in Hou et al.)
    top_k: int = 16
    # dpca / simple_opd: the clipped policy loss (DPCA: 0.2 / 0.28, dual clip 10)
    ppo: PPOClip = PPOClip()
    # dpca / simple_opd: symmetric advantage clamp (None = off)
    adv_clamp: float | None = 10.0
    # simple_opd: weight beta of the reference KL(q_theta || q_init) (published 0.5; 0 = off)
    ref_beta: float = SIMPLE_OPD_REF_BETA
    # bpm / escd: drop roots whose sampled student token is whitespace only
    mask_whitespace: bool = False
    # bpm / escd: the rule for student tokens longer than the teacher's root token (the
    # covering mass of the on-path token's continuation, byteprefix_long); needs its tables
    long_tokens: bool = True
    # dpca / simple_opd: advantage baseline, "none", "mean" or "token_mean" (the same here: the
    # units are student tokens; policy.center_advantages)
    baseline: str = "none"


def count_kind_units(kind: str, align, s_loss_mask_BTs, t_loss_mask_BTt=None, *,
                     student_ids_BTs=None, tables=None, params: KindParams = KindParams()) -> int:
    """Local loss units of ``kind`` (the table above)."""
    if kind == "strict_topk":
        return count_strict_units(align, s_loss_mask_BTs, t_loss_mask_BTt)
    if kind == "dpca":
        return count_dpca_units(align, s_loss_mask_BTs, t_loss_mask_BTt)
    if kind == "simple_opd":
        return count_simple_opd_units(s_loss_mask_BTs)
    if kind in ("bpm", "escd"):
        return count_byteprefix_units(align, student_ids_BTs, tables, s_loss_mask_BTs,
                                      t_loss_mask_BTt, mask_whitespace=params.mask_whitespace)
    raise ValueError(f"unknown 2026 on-policy kind {kind!r}; allowed: {KINDS_2026}")


def _need(value, what: str, kind: str):
    if value is None:
        raise ValueError(f"on-policy loss {kind!r} needs {what}")
    return value


def kind_loss(kind: str, params: KindParams, student_logits_BTsVs, student_ids_BTs,
              s_loss_mask_BTs, *, align, t_loss_mask_BTt=None, teacher_logits_BTtV=None,
              teacher_token_logp_BTt=None, behaviour_logp_BTs=None, stop_BTs=None,
              ref_logp_BTs=None, shared_s_idx_N=None, shared_t_idx_N=None, tables=None,
              temperature: float = 1.0, count: float = 1.0, chunk_size=None,
              teacher_chunk_logp_BC=None, teacher_ids_BTt=None, long_tables=None
              ) -> tuple[torch.Tensor, dict]:
    """(loss = sum over units / ``count``, {counter: int}) of one teacher (module doc).
    ``teacher_chunk_logp_BC``: byte-level credit per chunk for dpca / simple_opd."""
    kw = dict(s_loss_mask_BTs=s_loss_mask_BTs, t_loss_mask_BTt=t_loss_mask_BTt,
              temperature=temperature, num_valid=count)
    if chunk_size is not None:
        kw["chunk_size"] = chunk_size
    if kind in FULL_LOGITS_KINDS:
        logits = _need(teacher_logits_BTtV, "the teacher's full logits (worker.output: logits)",
                       kind)
        if kind == "strict_topk":
            loss, stats = strict_topk(student_logits_BTsVs, logits, align,
                                      _need(shared_s_idx_N, "the shared vocabulary", kind),
                                      shared_t_idx_N, top_k=params.top_k, **kw)
        else:
            fn = bpm if kind == "bpm" else escd
            long = None
            if params.long_tokens:
                long = _need(long_tables, "the long-token tables (params.long_tokens)", kind)
                _need(teacher_ids_BTt, "the teacher's token ids (params.long_tokens)", kind)
            loss, stats = fn(student_logits_BTsVs, logits, align,
                             _need(tables, "the byte-prefix tables", kind), student_ids_BTs,
                             mask_whitespace=params.mask_whitespace, long=long,
                             teacher_ids_BTt=teacher_ids_BTt, **kw)
    else:
        t_logp = _need(teacher_token_logp_BTt, "the teacher's token log-probs", kind)
        beh = _need(behaviour_logp_BTs, "the rollout's behaviour log-probs", kind)
        if kind == "dpca":
            loss, stats = dpca(student_logits_BTsVs, student_ids_BTs, beh, t_logp, align,
                               ppo=params.ppo, adv_clamp=params.adv_clamp,
                               baseline=params.baseline,
                               teacher_chunk_logp_BC=teacher_chunk_logp_BC, **kw)
        elif kind == "simple_opd":
            stop = stop_BTs if stop_BTs is not None else torch.zeros_like(s_loss_mask_BTs,
                                                                           dtype=torch.bool)
            mask = kw.pop("s_loss_mask_BTs")
            loss, stats = simple_opd(student_logits_BTsVs, student_ids_BTs, beh, t_logp, align,
                                     stop, mask, ppo=params.ppo, adv_clamp=params.adv_clamp,
                                     ref_logp_BTs=ref_logp_BTs, ref_beta=params.ref_beta,
                                     baseline=params.baseline,
                                     teacher_chunk_logp_BC=teacher_chunk_logp_BC, **kw)
        else:
            raise ValueError(f"unknown 2026 on-policy kind {kind!r}; allowed: {KINDS_2026}")
    counters = {c: int(getattr(stats, c)) for c in KIND_COUNTERS[kind]}
    return loss, counters
