"""Probability masses of ragged ranges of byte-sorted rows, with their relative precision.

Legend: n rows, V columns (a row's tokens in byte-sorted order), J ranges.

A range's mass read as a difference of a float64 cumulative sum, ``cs[hi] - cs[lo]``, carries
the rounding of everything before ``lo`` (about 1e-14 over a 262k vocabulary): a mass far below
that is lost (0, or noise), and a float32 ``exp`` of the log-probabilities underflows below
e^-103 first. Where that matters, :func:`range_logsumexp` sums the range's own entries in log
space instead: a sum of positive terms, exact to rounding, without underflow, differentiable.
:func:`range_log_masses` does the cheap difference for every range and this sum only for the
small ones.
"""

from __future__ import annotations

import torch

# a mass below this, read as a difference of float64 cumulative sums, is summed again directly
RESUM_BELOW = 1e-4
# at most this many entries gathered at once by the direct sum
RESUM_CHUNK = 1 << 22


def range_logsumexp(x_nV: torch.Tensor, r_J: torch.Tensor, lo_J: torch.Tensor,
                    hi_J: torch.Tensor, chunk: int = RESUM_CHUNK) -> torch.Tensor:
    """[J] float64 ``log sum_{lo <= c < hi} exp(x_nV[r, c])`` (``-inf`` for an empty or all
    ``-inf`` range), differentiable in ``x_nV``; at most ``chunk`` entries gathered at once."""
    len_J = (hi_J - lo_J).clamp_min(0)
    ends = len_J.cumsum(0)
    outs, start, J = [], 0, int(r_J.numel())
    while start < J:
        base = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(torch.searchsorted(ends, base + chunk, right=True)))
        outs.append(_segment_logsumexp(x_nV, r_J[start:stop], lo_J[start:stop],
                                       len_J[start:stop]))
        start = stop
    if not outs:
        return x_nV.new_zeros(0, dtype=torch.float64)
    return torch.cat(outs)


def _segment_logsumexp(x_nV, r_J, lo_J, len_J) -> torch.Tensor:
    J, dev = int(r_J.numel()), x_nV.device
    slot = torch.repeat_interleave(torch.arange(J, device=dev), len_J)
    first = torch.repeat_interleave(len_J.cumsum(0) - len_J, len_J)
    col = lo_J[slot] + torch.arange(slot.numel(), device=dev) - first
    return slot_logsumexp(x_nV[r_J[slot], col].double(), slot, J)


def slot_logsumexp(vals_M: torch.Tensor, slot_M: torch.Tensor, J: int) -> torch.Tensor:
    """[J] ``log sum exp(vals_M)`` over the entries of each slot (``-inf`` for none or all
    ``-inf``), each slot scaled by its largest entry (a sum far below float64's range keeps its
    value); differentiable in ``vals_M`` without NaN for an empty slot."""
    top = torch.full((J,), -torch.inf, dtype=vals_M.dtype, device=vals_M.device)
    top = top.scatter_reduce(0, slot_M, vals_M.detach(), reduce="amax", include_self=True)
    shift = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    total = torch.zeros_like(top).index_add(0, slot_M, torch.exp(vals_M - shift[slot_M]))
    some = total > 0                       # log of 1 where empty: no 0 * inf in the backward
    return torch.where(some, torch.log(torch.where(some, total, 1.0)) + shift, -torch.inf)


def range_log_masses(logp_nV: torch.Tensor, r_J: torch.Tensor, lo_J: torch.Tensor,
                     hi_J: torch.Tensor) -> torch.Tensor:
    """[J] float64 log-mass of each range of the log-probability rows ``logp_nV`` (``-inf``
    for an empty range), differentiable: a difference of cumulative sums where the mass is at
    least ``RESUM_BELOW``, :func:`range_logsumexp` below it."""
    p_nV = torch.exp(logp_nV.double())
    cs = torch.cat([torch.zeros_like(p_nV[:, :1]), p_nV], 1).cumsum(1)
    mass = cs[r_J, hi_J] - cs[r_J, lo_J]
    small = torch.nonzero(mass.detach() < RESUM_BELOW, as_tuple=True)[0]
    log_mass = torch.log(mass.clamp_min(RESUM_BELOW))
    if small.numel():
        exact = range_logsumexp(logp_nV, r_J[small], lo_J[small], hi_J[small])
        log_mass = log_mass.index_put((small,), exact)
    return log_mass


__all__ = ["RESUM_BELOW", "RESUM_CHUNK", "range_log_masses", "range_logsumexp", "slot_logsumexp"]
