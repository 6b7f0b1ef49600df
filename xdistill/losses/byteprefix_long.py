"""BPM/ESCD rule for student tokens longer than the teacher's: the covering mass, one step ahead.

Legend: B batch, Tt teacher tokens, Vs/Vt vocabularies, N root units, n rows of a block, U student
coordinates, X extension entries.

**The failure.** BPM maps each teacher token ``w`` to the longest student token that is a byte
prefix of it. With a digit-splitting teacher, ``2`` carries the teacher's probability of *every
number starting with 2* and maps to the student's ``2``; the student's ``23`` is no teacher
token's prefix, so it is in no coordinate: its mass sits in the student's residual, while the
target on ``2`` pulls the student to spell every two-digit answer digit by digit.

**The rule (byte-level covering mass).** At a root whose on-path teacher token ``w0`` has exactly
the bytes of a student token ``u0`` that the student can extend (``u0 + e`` is a student token
``v`` for each minimal suffix ``e``, :meth:`xdistill.rollout.bytecredit.VocabIndex.extensions`,
and no teacher token's bytes start with ``bytes(v)``: ``v`` is longer than what the teacher
spells in one token; a teacher with the student's vocabulary gets no entries),
the teacher mass of "``w0`` followed by ``e``" is the teacher's covering probability of
``bytes(v)`` through ``w0``::

    m_v = p(w0) * sum_{t: bytes(t) starts with e} p(t | x, w0)

read from the teacher's next on-path row (exact for one-byte suffixes such as digits; a lower
bound otherwise: only the first token after ``w0`` is looked at). It moves from ``u0``'s
coordinate to ``v``'s: ``pbar(u0) -= sum_v m_v`` and ``pbar(v) += m_v``; a ``v`` in no coordinate
becomes one for this root (``qbar(v) = q(v)``, taken out of the student's residual). Only
``w0``'s continuation is known from one forward; the other teacher tokens mapped to ``u0`` keep
BPM's map. The KL of the root term is then taken over the extended coordinates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from xdistill.losses.engine import log_softmax_safe, safe_logsumexp, xlogx_minus_xlogy


@dataclass(frozen=True)
class LongTokenTables:
    """Per teacher token ``w`` (with a student token of the same bytes), its extensions
    ``w_ptr[w]:w_ptr[w + 1]``: the longer student token ``v`` and the teacher-sorted range
    ``[lo, hi)`` of the teacher tokens starting with the suffix ``e`` (built by
    :func:`xdistill.rollout.bytecredit.build_long_token_tables`)."""

    # CSR pointer over teacher ids, int64 [Vt + 1]
    w_ptr: torch.Tensor
    # longer student token, range start/end in t_sorted, int64 [X] each
    v_X: torch.Tensor
    lo_X: torch.Tensor
    hi_X: torch.Tensor
    # teacher text ids sorted by bytes, int64 [Vt']
    t_sorted: torch.Tensor

    def to(self, device) -> "LongTokenTables":
        return LongTokenTables(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def moved_masses(long: LongTokenTables, teacher_BTtVt, teacher_ids_BTt, b_N, t_N, tau: float,
                 dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(unit index, student token v, moved mass m_v) of every extension entry of the units'
    on-path root tokens (``t_N``: teacher root rows; the token is at ``t_N + 1``), [X'] each."""
    dev = teacher_BTtVt.device
    empty = torch.zeros(0, dtype=torch.long, device=dev)
    if b_N.numel() == 0 or long.v_X.numel() == 0:
        return empty, empty, torch.zeros(0, dtype=dtype, device=dev)
    Tt = teacher_ids_BTt.shape[1]
    nxt = t_N + 1
    ok = nxt <= Tt - 1                           # the row after w0 exists
    w0 = teacher_ids_BTt[b_N, nxt.clamp(max=Tt - 1)].long()
    w0 = torch.where(ok & (w0 < long.w_ptr.numel() - 1), w0, torch.zeros_like(w0))
    lo, hi = long.w_ptr[w0], long.w_ptr[w0 + 1]
    n_x = torch.where(ok, hi - lo, torch.zeros_like(lo))
    unit_X = torch.repeat_interleave(torch.arange(b_N.numel(), device=dev), n_x)
    if unit_X.numel() == 0:
        return empty, empty, torch.zeros(0, dtype=dtype, device=dev)
    first = torch.repeat_interleave(torch.cumsum(n_x, 0) - n_x, n_x)
    x = lo[unit_X] + torch.arange(unit_X.numel(), device=dev) - first
    with torch.no_grad():
        rows = torch.unique(unit_X)
        z0 = teacher_BTtVt[b_N[rows], t_N[rows]].to(torch.float64) / tau
        z1 = teacher_BTtVt[b_N[rows], nxt[rows]].to(torch.float64) / tau
        p0 = log_softmax_safe(z0).exp()
        p1 = log_softmax_safe(z1).exp().index_select(1, long.t_sorted)
        cs = torch.cat([torch.zeros_like(p1[:, :1]), p1], 1).cumsum(1)
        slot = torch.searchsorted(rows, unit_X)
        m = p0[slot, w0[unit_X]] * (cs[slot, long.hi_X[x]] - cs[slot, long.lo_X[x]])
    return unit_X, long.v_X[x], m.to(dtype)


def extended_kl(pbar_nU1, logq_nV, lqbar_nU1, coord_w0_n, unit_X, v_X, m_X, coord_Vs,
                in_coord_V) -> torch.Tensor:
    """``sum_rows KL(pbar' || qbar')`` over the extended coordinates (module doc): rows are the
    block's units, ``unit_X`` their local row index, ``coord_Vs`` the coordinate of each student
    id (-1 = none), ``coord_w0_n`` the coordinate of each row's root token."""
    pbar = pbar_nU1.clone()
    M_n = torch.zeros(pbar.shape[0], dtype=pbar.dtype, device=pbar.device)
    M_n.index_add_(0, unit_X, m_X)
    rows = torch.arange(pbar.shape[0], device=pbar.device)
    pbar[rows, coord_w0_n] = (pbar[rows, coord_w0_n] - M_n).clamp_min(0.0)
    c_X = coord_Vs[v_X]
    inside = c_X >= 0
    pbar.index_put_((unit_X[inside], c_X[inside]), m_X[inside], accumulate=True)
    lqbar = lqbar_nU1
    extra = torch.zeros((), dtype=logq_nV.dtype, device=logq_nV.device)
    out_u, out_v, out_m = unit_X[~inside], v_X[~inside], m_X[~inside]
    if out_u.numel():
        mask = in_coord_V.expand_as(logq_nV).clone()
        mask[out_u, out_v] = True                  # v leaves the residual: its own coordinate
        lq_bot = safe_logsumexp(logq_nV.masked_fill(mask, -math.inf), -1)
        lqbar = torch.cat([lqbar_nU1[:, :-1], lq_bot.unsqueeze(1)], 1)
        extra = xlogx_minus_xlogy(torch.log(out_m), logq_nV[out_u, out_v]).sum()
    return xlogx_minus_xlogy(torch.log(pbar), lqbar).sum() + extra


__all__ = ["LongTokenTables", "extended_kl", "moved_masses"]
