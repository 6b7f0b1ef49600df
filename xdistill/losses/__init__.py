"""Distillation losses: pure torch functions over logits, masks and alignment tensors.

Same tokenizer (``divergences``): :func:`forward_kl`, :func:`reverse_kl`, :func:`jsd`,
:func:`topk_forward_kl` (tail bucket), :func:`cross_entropy`. Cross tokenizer over aligned chunks
(``cross``, ``uld``, ``alm``): :func:`exact_kl`, :func:`projected_kl`, :func:`student_space_kl`,
:func:`uld`, :func:`gold_hybrid`, :func:`alm`; :func:`continuation_kl` (P-KL inside
multi-piece student tokens, over a :class:`ContinuationTrie`); :func:`projection_from_csr` builds ``proj_VsVt``.
Several teachers: :class:`MultiTeacherLoss` with :class:`TeacherSpec` and
:class:`TeacherLossInput`. On-policy across tokenizers (2026 methods): :func:`strict_topk`
(``strict``), :func:`dpca` and :func:`simple_opd` (``policy``), :func:`bpm` and :func:`escd` over
:class:`BytePrefixTables` (``byteprefix``). Everything is computed in float32, in blocks of
``chunk_size`` rows (forward and backward), normalised by a given global count ``num_valid``.
"""

from xdistill.losses.alm import alm
from xdistill.losses.byteprefix import BytePrefixTables, bpm, count_byteprefix_units, escd
from xdistill.losses.chunks import ChunkAlignment, loss_chunks
from xdistill.losses.continuation import ContinuationTrie, continuation_kl
from xdistill.losses.cross import (count_loss_chunks, exact_kl, projected_kl, projection_from_csr,
                                   student_space_kl)
from xdistill.losses.divergences import (count_valid_tokens, cross_entropy, forward_kl, jsd,
                                         reverse_kl, topk_forward_kl)
from xdistill.losses.multi_teacher import MultiTeacherLoss, TeacherLossInput, TeacherSpec
from xdistill.losses.policy import PPOClip, count_dpca_units, count_simple_opd_units, dpca, simple_opd
from xdistill.losses.strict import count_strict_units, strict_topk
from xdistill.losses.uld import gold_hybrid, uld

__all__ = ["ChunkAlignment", "ContinuationTrie", "MultiTeacherLoss", "TeacherLossInput", "TeacherSpec", "alm",
           "continuation_kl", "count_loss_chunks", "count_valid_tokens", "cross_entropy", "exact_kl", "forward_kl",
           "gold_hybrid", "jsd", "loss_chunks", "projected_kl", "projection_from_csr",
           "reverse_kl", "student_space_kl", "topk_forward_kl", "uld",
           "BytePrefixTables", "PPOClip", "bpm", "count_byteprefix_units", "count_dpca_units",
           "count_simple_opd_units", "count_strict_units", "dpca", "escd", "simple_opd", "strict_topk"]
