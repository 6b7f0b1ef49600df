"""Aligned-chunk helpers: chunk boundaries, which chunks carry loss, sums of token values per chunk.

Legend: B batch, Ts/Tt student/teacher tokens, C chunks (per row, padded), N selected chunks.

Conventions (``xdistill.data.batch``): ``s_chunk_BTs[b, i]`` is the chunk id of student token
``i`` (-1 = unaligned or padding), ``t_chunk_BTt`` likewise; chunk ids of a row are ``0..n-1`` in
token order on both sides; ``chunk_valid_BC`` is False on padding of the chunk axis;
``chunk_exact_BC`` marks 1:1 chunks with identical token bytes. Token positions are input
positions: the distribution predicting token ``i`` is the model output at position ``i - 1``.

A chunk whose first student token or first teacher token is token 0 has no prediction for that
token on that side; such chunks are **dropped** from every cross-tokenizer loss (and from the
counts used to normalise them). A chunk carries loss only when *all* its student tokens are in the
student loss mask (and all its teacher tokens in the teacher loss mask, when one is given).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ChunkAlignment:
    """The alignment tensors of one teacher (the fields of ``TeacherView`` the losses need)."""

    # chunk id of each student token, int64 [B, Ts] (-1 = unaligned or padding)
    s_chunk_BTs: torch.Tensor
    # chunk id of each teacher token, int64 [B, Tt] (-1 = unaligned or padding)
    t_chunk_BTt: torch.Tensor
    # True where the chunk exists, bool [B, C]
    chunk_valid_BC: torch.Tensor
    # True where the chunk is one student and one teacher token with identical bytes, bool [B, C]
    chunk_exact_BC: torch.Tensor

    @classmethod
    def from_view(cls, view) -> "ChunkAlignment":
        """From any object with the four fields, tensors or arrays (e.g.
        ``xdistill.data.batch.TeacherView`` or the aligner's ``AlignmentResult``)."""
        t = torch.as_tensor
        return cls(t(view.s_chunk_BTs).long(), t(view.t_chunk_BTt).long(),
                   t(view.chunk_valid_BC).bool(), t(view.chunk_exact_BC).bool())

    @property
    def num_chunks(self) -> int:
        return int(self.chunk_valid_BC.shape[1])


def chunk_bounds(chunk_BT: torch.Tensor, num_chunks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """First token and one-past-last token of every chunk on one side, int64 [B, C] (-1 if absent)."""
    B, T = chunk_BT.shape
    pos_BT = torch.arange(T, device=chunk_BT.device).expand(B, T)
    has_BT = chunk_BT >= 0
    idx_BT = torch.where(has_BT, chunk_BT, torch.full_like(chunk_BT, num_chunks))
    big = torch.full((B, num_chunks + 1), T, dtype=torch.long, device=chunk_BT.device)
    start_BC = big.scatter_reduce(1, idx_BT, pos_BT, "amin")[:, :num_chunks]
    small = torch.full((B, num_chunks + 1), -1, dtype=torch.long, device=chunk_BT.device)
    end_BC = small.scatter_reduce(1, idx_BT, pos_BT, "amax")[:, :num_chunks] + 1
    present = end_BC > 0
    start_BC = torch.where(present, start_BC, torch.full_like(start_BC, -1))
    end_BC = torch.where(present, end_BC, torch.full_like(end_BC, -1))
    return start_BC, end_BC


def _all_in_mask(chunk_BT: torch.Tensor, mask_BT: torch.Tensor, num_chunks: int) -> torch.Tensor:
    """bool [B, C]: no token of the chunk is outside ``mask_BT``."""
    B = chunk_BT.shape[0]
    bad_BT = (chunk_BT >= 0) & ~mask_BT.bool()
    idx_BT = torch.where(chunk_BT >= 0, chunk_BT, torch.full_like(chunk_BT, num_chunks))
    bad_BC = torch.zeros((B, num_chunks + 1), dtype=torch.long, device=chunk_BT.device)
    bad_BC.scatter_add_(1, idx_BT, bad_BT.long())
    return bad_BC[:, :num_chunks] == 0


def loss_chunks(align: ChunkAlignment, s_loss_mask_BTs: torch.Tensor | None = None,
                t_loss_mask_BTt: torch.Tensor | None = None, *, exact_only: bool = False
                ) -> torch.Tensor:
    """bool [B, C]: chunks that carry loss (valid, predicted on both sides, inside the masks)."""
    C = align.num_chunks
    s_start, _ = chunk_bounds(align.s_chunk_BTs, C)
    t_start, _ = chunk_bounds(align.t_chunk_BTt, C)
    ok_BC = align.chunk_valid_BC.bool() & (s_start >= 1) & (t_start >= 1)
    if exact_only:
        ok_BC = ok_BC & align.chunk_exact_BC.bool()
    if s_loss_mask_BTs is not None:
        ok_BC = ok_BC & _all_in_mask(align.s_chunk_BTs, s_loss_mask_BTs, C)
    if t_loss_mask_BTt is not None:
        ok_BC = ok_BC & _all_in_mask(align.t_chunk_BTt, t_loss_mask_BTt, C)
    return ok_BC


def chunk_start_rows(align: ChunkAlignment, ok_BC: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For the chunks selected by ``ok_BC``: (b, student output row, teacher output row), each [N].

    The output row is the position *before* the chunk's first token on each side: the
    distribution over the chunk's first token given the (identical) text before the chunk.
    """
    C = align.num_chunks
    s_start, _ = chunk_bounds(align.s_chunk_BTs, C)
    t_start, _ = chunk_bounds(align.t_chunk_BTt, C)
    b_N, c_N = torch.nonzero(ok_BC, as_tuple=True)
    return b_N, s_start[b_N, c_N] - 1, t_start[b_N, c_N] - 1


def chunk_sum(values_BT: torch.Tensor, chunk_BT: torch.Tensor, num_chunks: int) -> torch.Tensor:
    """``out[b, c] = sum of values_BT[b, i] over tokens i of chunk c`` (differentiable), [B, C]."""
    B = chunk_BT.shape[0]
    idx_BT = torch.where(chunk_BT >= 0, chunk_BT, torch.full_like(chunk_BT, num_chunks))
    vals = torch.where(chunk_BT >= 0, values_BT, torch.zeros_like(values_BT))
    out = torch.zeros((B, num_chunks + 1), dtype=values_BT.dtype, device=values_BT.device)
    return out.scatter_add(1, idx_BT, vals)[:, :num_chunks]


def resolve_count(num_valid, local: int | float) -> float:
    """The normaliser: the given global count, else the local one; never below 1 (no 0/0)."""
    n = float(local if num_valid is None else num_valid)
    if n < 0 or n != n:
        raise ValueError(f"num_valid must be a non-negative count, got {num_valid}")
    return max(n, 1.0)
