"""Typed batches handed from the collator to the trainer.

Legend: B batch, Ts student tokens, Tt teacher tokens, C chunks (per row, padded).

Alignment conventions (shared by ``align``, ``data`` and ``losses``):
* ``s_chunk_BTs[b, i]`` is the id of the aligned chunk that student token ``i`` belongs to, or -1
  when the token is unaligned or padding; ``t_chunk_BTt`` likewise for teacher tokens. Chunk ids of
  a row are 0..n_chunks-1 in token order on both sides; only valid chunks get ids.
* ``chunk_*_BC`` arrays are padded to the batch's largest chunk count; ``chunk_valid_BC`` is False
  on padding. ``chunk_exact_BC`` marks 1:1 chunks with identical token bytes.
* Token positions are *input* positions: the distribution that predicts token ``i`` comes from the
  model's output at position ``i - 1`` (losses apply this shift).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch


def _move(obj, device, non_blocking: bool):
    changes = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, torch.Tensor):
            changes[f.name] = value.to(device, non_blocking=non_blocking)
    return replace(obj, **changes)


@dataclass(frozen=True)
class TeacherView:
    """One teacher's tokenization of the batch and its alignment to the student tokens."""

    # teacher name (key of the teacher in the config)
    name: str
    # teacher token ids, right-padded with the teacher's pad id
    input_ids_BTt: torch.Tensor
    # True on real (non-padding) teacher tokens
    attention_mask_BTt: torch.Tensor
    # True on teacher tokens whose prediction is distilled (e.g. assistant turns of chat data)
    loss_mask_BTt: torch.Tensor
    # chunk id of each student token for this teacher (-1 = unaligned or padding)
    s_chunk_BTs: torch.Tensor
    # chunk id of each teacher token (-1 = unaligned or padding)
    t_chunk_BTt: torch.Tensor
    # True where the chunk exists (False on per-row padding of the chunk axis)
    chunk_valid_BC: torch.Tensor
    # True where the chunk is one student token and one teacher token with identical bytes
    chunk_exact_BC: torch.Tensor
    # True when the teacher shares the student's tokenizer (identity alignment, no projection)
    identity: bool = False
    # fraction of non-padding student / teacher tokens inside valid chunks, over the batch
    coverage_s: float = 1.0
    coverage_t: float = 1.0
    # on-policy: student loss tokens whose bytes the teacher read but that no chunk pairs
    # (bytes the teacher cannot spell, regions the aligner could not pair); None off-policy
    s_unpaired_BTs: torch.Tensor | None = None
    # on-policy: each teacher token's phantom bytes (a token straddling the prompt/response edge
    # holds the prompt's last bytes; byte credit scores its unit given them); None off-policy
    t_phantom_BTt: torch.Tensor | None = None

    def to(self, device, non_blocking: bool = False) -> "TeacherView":
        return _move(self, device, non_blocking)


@dataclass(frozen=True)
class BatchStats:
    """Per-batch collator statistics for the trainer's metrics."""

    # number of non-padding student tokens
    student_tokens: int = 0
    # number of student tokens that carry loss
    loss_tokens: int = 0
    # seconds spent in the collator for this batch
    collate_seconds: float = 0.0
    # per teacher name: fraction of student tokens not in any valid chunk
    unaligned_fraction: dict = field(default_factory=dict)


@dataclass(frozen=True)
class DistillBatch:
    """A student batch plus one :class:`TeacherView` per teacher."""

    # student token ids, right-padded
    input_ids_BTs: torch.Tensor
    # True on real student tokens
    attention_mask_BTs: torch.Tensor
    # next-token targets aligned with input positions (labels_BTs[:, i] = input_ids_BTs[:, i]),
    # -100 where no loss; losses shift by one
    labels_BTs: torch.Tensor
    # True on student tokens whose prediction is distilled / trained
    loss_mask_BTs: torch.Tensor
    # one view per teacher, in config order
    teachers: tuple[TeacherView, ...] = ()
    stats: BatchStats = field(default_factory=BatchStats)
    # each student token's phantom bytes (in its table bytes, not in the text: a SentencePiece
    # dummy-prefix space), so bits per byte count the text's own bytes; None = all 0
    phantom_BTs: torch.Tensor | None = None

    def to(self, device, non_blocking: bool = False) -> "DistillBatch":
        moved = _move(self, device, non_blocking)
        return replace(moved, teachers=tuple(t.to(device, non_blocking) for t in self.teachers))

    def teacher(self, name: str) -> TeacherView:
        for view in self.teachers:
            if view.name == name:
                return view
        raise KeyError(f"no teacher view named {name!r}; have {[t.name for t in self.teachers]}")
