"""Byte-prefix losses across tokenizers: BPM's marginalised root KL and ESCD's completion-set term.

Legend: B batch, Ts/Tt student/teacher tokens, Vs/Vt vocabularies, C chunks, N loss units (root
positions), n rows of a block, U student coordinates, E extra coordinate members, Ns sorted
student text tokens, G child groups, W group members.

The static structure (built offline by :func:`xdistill.projection.byteprefix.build_byteprefix_map`,
carried here as :class:`BytePrefixTables`) maps every teacher token ``w`` to a student coordinate
``phi(w)``: the longest student text token whose bytes are a byte prefix of ``bytes(w)`` (all
student ids with those bytes pooled), the student's stop tokens for a teacher stop token, or
``bot``. ``U`` is the set of coordinates.

**Root term (BPM and ESCD)**, at every loss chunk's root position (student row ``s_start - 1``,
teacher row ``t_start - 1``: both sides have seen the same text), with ``p = softmax(z_t / tau)``
and ``q = softmax(z_s / tau)``::

    pbar(u)   = sum_{w: phi(w) = u} p(w)          pbar(bot) = sum_{w: phi(w) = bot} p(w)
    qbar(u)   = sum of q over the members of u     qbar(bot) = 1 - sum_{u in U} qbar(u)
    l_root    = tau^2 * KL(pbar || qbar) = tau^2 * sum_{pbar(u) > 0} pbar(u) log(pbar(u) / qbar(u))

No renormalisation on either side: the student's mass outside ``U`` is its ``bot``.
``qbar(bot)`` is computed as the sum of ``q`` over the student columns in no coordinate (exactly
``1 - sum_U qbar`` without the cancellation of ``1 - sum``); where it is 0 (every column is in
some coordinate, or those columns are ``-inf``) its log is floored at ``LOGP_FLOOR`` (-1e4, the
engine's floor): ``pbar(bot) > 0`` against ``qbar(bot) = 0`` then gives a large finite term with no
gradient through that coordinate, and is counted (``bot_floor``).

**Child term (ESCD only).** Let ``a`` be the sampled student token at the chunk's first student
position ``i = s_start``; the student's child distribution ``q(. | x, a) = softmax(z_s[i] / tau)``
is its output at row ``i``. For each child group ``g`` of ``a`` (teacher events continuing
``bytes(a)`` that no student token spells, grouped by prefix; see the projection module), with
``M_g = sum_{w in g} p(w)`` (the teacher's *root* distribution at ``tau``, unnormalised) and the
completion set ``C(r_g)`` (student text tokens whose bytes start with the group's residual)::

    l_child = - sum_g M_g * log sum_{u in C(r_g)} q(u | x, a)

Groups with an empty ``C(r_g)`` are skipped and counted (with their mass). ``tau`` enters the child
term only through the two softmaxes (no ``tau^2`` factor: it is a likelihood, not a KL); ``tau = 1``
is the default and recommended setting. The completion sums keep their relative precision however
small (:func:`xdistill.losses.ranges.range_log_masses`: a float64 cumulative-sum difference, or a
logsumexp of the range's own log-probabilities below ``RESUM_BELOW``); only a completion set the
student gives exactly 0 is floored, at ``LOGP_FLOOR``.

**Student tokens longer than the teacher's** (``long`` tables given): the root term's target
moves the teacher mass of "the on-path root token followed by a suffix that makes a longer
student token" to that longer token (:mod:`xdistill.losses.byteprefix_long`); without it a
digit-splitting teacher's ``2`` keeps the mass of every number starting with 2 and the student's
``23`` is pushed into the residual.

Per unit: ``bpm = l_root``, ``escd = l_root + l_child``. ``mask_whitespace`` drops units whose
sampled student token ``a`` is whitespace only (counted). The loss is the sum over units divided by
``num_valid`` (the trainer's global count from :func:`count_byteprefix_units`) or the local count.
Gradients reach the student logits only; teacher logits are constants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from xdistill.losses.byteprefix_long import LongTokenTables, extended_kl, moved_masses
from xdistill.losses.chunks import ChunkAlignment, chunk_bounds, loss_chunks, resolve_count
from xdistill.losses.engine import (DEFAULT_CHUNK_SIZE, LOGP_FLOOR, compute_dtype,
                                    log_softmax_safe, row_block_sum, safe_logsumexp,
                                    xlogx_minus_xlogy)
from xdistill.losses.ranges import range_log_masses



@dataclass(frozen=True)
class BytePrefixTables:
    """Torch form of a ``BytePrefixMap`` (build with :meth:`from_arrays`); ``.to(device)``."""

    # student coordinate of each teacher id, -1 = bot, int64 [Vt]
    coord_Vt: torch.Tensor
    # first (representative) student id of each coordinate, int64 [U]
    rep_U: torch.Tensor
    # further members of pooled coordinates: coordinate, student id, rank (>= 1), int64 [E] each
    extra_coord_E: torch.Tensor
    extra_s_E: torch.Tensor
    extra_rank_E: torch.Tensor
    # highest rank in extra_rank_E (0 when no coordinate pools several ids)
    extra_levels: int
    # student ids inside some coordinate, bool [Vs]
    in_coord_Vs: torch.Tensor
    # student text ids sorted by bytes, int64 [Ns]
    sorted_s: torch.Tensor
    # whitespace-only student text tokens, bool [Vs]
    whitespace_Vs: torch.Tensor
    # child groups of student id a: a_groups[a_ptr[a]:a_ptr[a+1]], int64
    a_ptr: torch.Tensor
    a_groups: torch.Tensor
    # completion range [lo, hi) of each group in sorted_s, int64 [G]
    group_lo: torch.Tensor
    group_hi: torch.Tensor
    # teacher members of group g: member_t[member_ptr[g]:member_ptr[g+1]], int64
    member_ptr: torch.Tensor
    member_t: torch.Tensor
    # vocabulary sizes of the tables (logits may be wider: extra columns are bot)
    student_vocab: int
    teacher_vocab: int

    @classmethod
    def from_arrays(cls, coord_Vt, coord_ptr, coord_members, sorted_s, whitespace_Vs, a_ptr,
                    a_groups, group_lo, group_hi, member_ptr, member_t, student_vocab,
                    teacher_vocab) -> "BytePrefixTables":
        """From the arrays of ``BytePrefixMap.arrays()`` (numpy or torch)."""
        long = lambda x: torch.as_tensor(x).long().clone()  # noqa: E731
        ptr, members = long(coord_ptr), long(coord_members)
        sizes = ptr[1:] - ptr[:-1]
        if bool((sizes < 1).any()):
            raise ValueError("every byte-prefix coordinate needs at least one student id")
        coord_M = torch.repeat_interleave(torch.arange(sizes.numel()), sizes)
        rank_M = torch.arange(members.numel()) - ptr[:-1][coord_M]
        extra = rank_M > 0
        in_coord = torch.zeros(int(student_vocab), dtype=torch.bool)
        in_coord[members] = True
        levels = int(rank_M.max()) if rank_M.numel() else 0
        return cls(long(coord_Vt), members[ptr[:-1]], coord_M[extra], members[extra],
                   rank_M[extra], levels, in_coord, long(sorted_s),
                   torch.as_tensor(whitespace_Vs).bool().clone(), long(a_ptr), long(a_groups),
                   long(group_lo), long(group_hi), long(member_ptr), long(member_t),
                   int(student_vocab), int(teacher_vocab))

    @classmethod
    def from_map(cls, byteprefix_map) -> "BytePrefixTables":
        """From a ``xdistill.projection.byteprefix.BytePrefixMap`` (anything with ``.arrays()``)."""
        return cls.from_arrays(**byteprefix_map.arrays())

    @property
    def num_coords(self) -> int:
        return int(self.rep_U.numel())

    def cached(self, key, make):
        """A per-instance cache of small derived tensors (coordinate index per logit width)."""
        cache = self.__dict__.setdefault("_derived", {})
        if key not in cache:
            cache[key] = make()
        return cache[key]

    def to(self, device) -> "BytePrefixTables":
        """These tables on ``device`` (itself when already there; the moved copy is cached)."""
        device = torch.device(device)
        if self.coord_Vt.device == device:
            return self
        cache = self.__dict__.setdefault("_moved", {})
        if str(device) not in cache:
            vals = {f.name: getattr(self, f.name) for f in fields(self)}
            cache[str(device)] = BytePrefixTables(**{k: v.to(device) if torch.is_tensor(v) else v
                                                     for k, v in vals.items()})
        return cache[str(device)]


@dataclass(frozen=True)
class BytePrefixStats:
    """Diagnostics of one BPM / ESCD call (python numbers, local to this rank)."""

    # root positions that carried loss
    units: int
    # loss chunks dropped because their sampled student token is whitespace only
    whitespace_masked: int
    # mean teacher mass on bot (tokens with no student prefix) over the units
    teacher_bot_mass: float
    # units where the student's bot log-probability hit LOGP_FLOOR while pbar(bot) > 0
    bot_floor: int
    # ESCD: units with at least one child group, groups used, groups skipped (empty C(r_g))
    child_units: int = 0
    child_groups: int = 0
    empty_groups: int = 0
    # ESCD: mean teacher mass per unit in used groups / in skipped groups
    child_mass: float = 0.0
    skipped_mass: float = 0.0


def _units(align, student_ids_BTs, tables, s_loss_mask_BTs, t_loss_mask_BTt, mask_whitespace):
    """(b, student root row, teacher root row, a) of the kept units [N], and the masked count."""
    C = align.num_chunks
    ok_BC = loss_chunks(align, s_loss_mask_BTs, t_loss_mask_BTt)
    s_start, _ = chunk_bounds(align.s_chunk_BTs, C)
    t_start, _ = chunk_bounds(align.t_chunk_BTt, C)
    b_N, c_N = torch.nonzero(ok_BC, as_tuple=True)
    i_N = s_start[b_N, c_N]
    a_N = student_ids_BTs[b_N, i_N].long()
    masked = 0
    if mask_whitespace and a_N.numel():
        ws = tables.whitespace_Vs.to(a_N.device)
        inside = a_N < ws.numel()
        white = inside & ws[a_N.clamp(max=ws.numel() - 1)]
        masked = int(white.sum())
        keep = ~white
        b_N, c_N, i_N, a_N = b_N[keep], c_N[keep], i_N[keep], a_N[keep]
    return b_N, i_N - 1, t_start[b_N, c_N] - 1, a_N, masked


def count_byteprefix_units(align: ChunkAlignment, student_ids_BTs, tables: BytePrefixTables,
                           s_loss_mask_BTs=None, t_loss_mask_BTt=None, *,
                           mask_whitespace: bool = False) -> int:
    """Local units of :func:`bpm` / :func:`escd`: loss chunks minus whitespace-masked ones."""
    return int(_units(align, student_ids_BTs, tables, s_loss_mask_BTs, t_loss_mask_BTt,
                      mask_whitespace)[0].numel())


def _teacher_rows(teacher_BTtVt, b_n, t_n, tau, dt):
    """``z_t / tau`` of the teacher rows (a private copy, no gradient), [n, Vt']."""
    with torch.no_grad():
        z = teacher_BTtVt[b_n, t_n].to(dt)
        return z.div_(tau) if tau != 1.0 else z


def _teacher_probs(teacher_BTtVt, b_n, t_n, tau, dt):
    """``softmax(z_t / tau)`` of the teacher rows, no gradient, [n, Vt']."""
    with torch.no_grad():
        return log_softmax_safe(_teacher_rows(teacher_BTtVt, b_n, t_n, tau, dt)).exp_()


def _coord_index(tables, width: int) -> torch.Tensor:
    """Coordinate of each teacher column of a ``width``-wide logit row; bot -> U (last slot)."""
    def make():
        U = tables.num_coords
        idx = torch.full((width,), U, dtype=torch.long, device=tables.coord_Vt.device)
        n = min(width, tables.coord_Vt.numel())
        c = tables.coord_Vt[:n]
        idx[:n] = torch.where(c >= 0, c, torch.full_like(c, U))
        return idx
    return tables.cached(("coord", width), make)


def _in_coord(tables, width: int) -> torch.Tensor:
    """Student columns of a ``width``-wide logit row that belong to a coordinate, bool."""
    def make():
        out = torch.zeros(width, dtype=torch.bool, device=tables.in_coord_Vs.device)
        out[:tables.in_coord_Vs.numel()] = tables.in_coord_Vs
        return out
    return tables.cached(("in", width), make)


def _student_logqbar(logq_nV, tables):
    """log qbar over the coordinates then bot, [n, U + 1] (differentiable)."""
    lq_U = logq_nV.index_select(1, tables.rep_U)
    for rank in range(1, tables.extra_levels + 1):
        sel = tables.extra_rank_E == rank
        coords, ids = tables.extra_coord_E[sel], tables.extra_s_E[sel]
        both = torch.stack([lq_U.index_select(1, coords), logq_nV.index_select(1, ids)], -1)
        lq_U = lq_U.index_copy(1, coords, safe_logsumexp(both, -1))
    in_coord = _in_coord(tables, logq_nV.shape[1])
    lq_bot = safe_logsumexp(logq_nV.masked_fill(in_coord, -math.inf), -1)
    return torch.cat([lq_U, lq_bot.unsqueeze(1)], 1)


def _coord_of_student(tables, width: int) -> torch.Tensor:
    """Coordinate of each student column of a ``width``-wide row, -1 = none (the residual)."""
    def make():
        out = torch.full((width,), -1, dtype=torch.long, device=tables.rep_U.device)
        out[tables.rep_U] = torch.arange(tables.num_coords, device=out.device)
        out[tables.extra_s_E] = tables.extra_coord_E
        return out
    return tables.cached(("s_coord", width), make)


def _root_term(tables, teacher_BTtVt, b_N, t_N, tau, stats, ext=None):
    def term(rows_nV, sl):
        dt = rows_nV.dtype
        b_n, t_n = b_N[sl], t_N[sl]
        p_nVt = _teacher_probs(teacher_BTtVt, b_n, t_n, tau, dt)
        idx = _coord_index(tables, p_nVt.shape[1])
        U = tables.num_coords
        pbar = torch.zeros((p_nVt.shape[0], U + 1), dtype=dt, device=p_nVt.device)
        pbar.index_add_(1, idx, p_nVt)
        logq = log_softmax_safe(rows_nV / tau)
        lqbar = _student_logqbar(logq, tables)
        floor = (pbar[:, U] > 0) & (lqbar[:, U].detach() < LOGP_FLOOR)
        stats[("root", sl.start)] = (float(pbar[:, U].sum()), int(floor.sum()))
        if ext is not None:
            unit_X, v_X, m_X, w0_N = ext
            inb = (unit_X >= sl.start) & (unit_X < sl.stop)
            if bool(inb.any()):
                stats[("long", sl.start)] = float(m_X[inb].sum())
                return extended_kl(pbar, logq, lqbar, idx[w0_N[sl]], unit_X[inb] - sl.start,
                                   v_X[inb], m_X[inb].to(dt), _coord_of_student(tables, logq.shape[1]),
                                   _in_coord(tables, logq.shape[1]))
        return xlogx_minus_xlogy(torch.log(pbar), lqbar).sum()
    return term


def _block_groups(tables, a_n):
    """(row of each group, group id) of the units' child groups, [G'] each."""
    lo, hi = tables.a_ptr[a_n], tables.a_ptr[a_n + 1]
    n_g = hi - lo
    row = torch.repeat_interleave(torch.arange(a_n.numel(), device=a_n.device), n_g)
    first = torch.repeat_interleave(torch.cumsum(n_g, 0) - n_g, n_g)
    flat = lo[row] + torch.arange(row.numel(), device=a_n.device) - first
    return row, tables.a_groups[flat]


def _group_mass(tables, z_nVt, row_G, g_G):
    """Teacher mass ``M_g`` of each (row, group) from tempered teacher logits, [G'] (no grad):
    only the members' logits and each row's logsumexp are read (no full softmax)."""
    with torch.no_grad():
        lse_n = safe_logsumexp(z_nVt, -1)
        sizes = tables.member_ptr[g_G + 1] - tables.member_ptr[g_G]
        slot_W = torch.repeat_interleave(torch.arange(g_G.numel(), device=g_G.device), sizes)
        first = torch.repeat_interleave(torch.cumsum(sizes, 0) - sizes, sizes)
        flat = (tables.member_ptr[g_G][slot_W] + torch.arange(slot_W.numel(), device=g_G.device)
                - first)
        row_W = row_G[slot_W]
        vals = torch.exp(z_nVt[row_W, tables.member_t[flat]] - lse_n[row_W])
        vals = torch.where(torch.isfinite(lse_n[row_W]), vals, torch.zeros_like(vals))
        out = torch.zeros(g_G.numel(), dtype=z_nVt.dtype, device=z_nVt.device)
        return out.index_add_(0, slot_W, vals)


def _child_term(tables, teacher_BTtVt, b_N, t_N, a_N, tau, stats):
    def term(rows_nV, sl):
        b_n, t_n, a_n = b_N[sl], t_N[sl], a_N[sl]
        z_nVt = _teacher_rows(teacher_BTtVt, b_n, t_n, tau, rows_nV.dtype)
        row_G, g_G = _block_groups(tables, a_n)
        M_G = _group_mass(tables, z_nVt, row_G, g_G)
        lo, hi = tables.group_lo[g_G], tables.group_hi[g_G]
        used = hi > lo
        stats[("child", sl.start)] = (int(used.sum()), int((~used).sum()),
                                      float(M_G[used].sum()), float(M_G[~used].sum()))
        log_q = log_softmax_safe(rows_nV / tau)
        log_q = torch.gather(log_q, 1, tables.sorted_s.expand(log_q.shape[0], -1))
        log_mass = range_log_masses(log_q, row_G[used], lo[used], hi[used])
        M_G = M_G[used].double()
        return -(M_G * log_mass.clamp_min(LOGP_FLOOR)).sum().to(rows_nV.dtype)
    return term


def _check(student_logits_BTsVs, teacher_BTtVt, align, student_ids_BTs, tables):
    B, Ts, Vs = student_logits_BTsVs.shape
    if tuple(align.s_chunk_BTs.shape) != (B, Ts) or tuple(student_ids_BTs.shape) != (B, Ts):
        raise ValueError(f"alignment s_chunk {tuple(align.s_chunk_BTs.shape)} / student ids "
                         f"{tuple(student_ids_BTs.shape)} do not fit student logits "
                         f"[B,T]={(B, Ts)}")
    if tuple(teacher_BTtVt.shape[:2]) != tuple(align.t_chunk_BTt.shape):
        raise ValueError(f"teacher logits {tuple(teacher_BTtVt.shape)} do not fit t_chunk "
                         f"{tuple(align.t_chunk_BTt.shape)}")
    if Vs < tables.student_vocab or teacher_BTtVt.shape[2] < tables.teacher_vocab:
        raise ValueError(f"byte-prefix tables for vocabularies ({tables.student_vocab}, "
                         f"{tables.teacher_vocab}) do not fit logits ({Vs}, "
                         f"{teacher_BTtVt.shape[2]})")


def _long_ext(long, teacher, teacher_ids_BTt, b_N, t_N, tau, dtype):
    """The moved masses of the long-token rule (byteprefix_long), or None when off."""
    if long is None:
        return None
    if teacher_ids_BTt is None:
        raise ValueError("the long-token rule of bpm/escd needs the teacher's token ids")
    long = long.to(teacher.device)
    unit_X, v_X, m_X = moved_masses(long, teacher, teacher_ids_BTt.to(teacher.device), b_N, t_N,
                                    tau, dtype)
    ids = teacher_ids_BTt.to(teacher.device)
    w0_N = ids[b_N, (t_N + 1).clamp(max=ids.shape[1] - 1)].long()
    return unit_X, v_X, m_X, w0_N


def _byteprefix(student_logits_BTsVs, teacher_logits_BTtVt, align, tables, student_ids_BTs, *,
                child, s_loss_mask_BTs, t_loss_mask_BTt, mask_whitespace, temperature, num_valid,
                chunk_size, long=None, teacher_ids_BTt=None):
    _check(student_logits_BTsVs, teacher_logits_BTtVt, align, student_ids_BTs, tables)
    tables = tables.to(student_logits_BTsVs.device)
    tau = float(temperature)
    b_N, s_N, t_N, a_N, masked = _units(align, student_ids_BTs, tables, s_loss_mask_BTs,
                                        t_loss_mask_BTt, mask_whitespace)
    teacher = teacher_logits_BTtVt.detach()
    stats: dict = {}
    ext = _long_ext(long, teacher, teacher_ids_BTt, b_N, t_N, tau,
                    compute_dtype(student_logits_BTsVs))
    total = row_block_sum(student_logits_BTsVs, b_N, s_N,
                          _root_term(tables, teacher, b_N, t_N, tau, stats, ext),
                          chunk_size) * tau ** 2
    n_child = 0
    if child:
        inside = a_N < tables.a_ptr.numel() - 1
        a_safe = torch.where(inside, a_N, torch.zeros_like(a_N))
        has = inside & (tables.a_ptr[a_safe + 1] > tables.a_ptr[a_safe])
        n_child = int(has.sum())
        total = total + row_block_sum(student_logits_BTsVs, b_N[has], s_N[has] + 1,
                                      _child_term(tables, teacher, b_N[has], t_N[has], a_N[has],
                                                  tau, stats), chunk_size)
    units = int(b_N.numel())
    loss = total / resolve_count(num_valid, units)
    return loss, _stats(stats, units, masked, n_child)


def _stats(stats: dict, units: int, masked: int, n_child: int) -> BytePrefixStats:
    root = [v for k, v in stats.items() if k[0] == "root"]
    kid = [v for k, v in stats.items() if k[0] == "child"]
    per = max(units, 1)
    return BytePrefixStats(units, masked, sum(r[0] for r in root) / per, sum(r[1] for r in root),
                           n_child, sum(c[0] for c in kid), sum(c[1] for c in kid),
                           sum(c[2] for c in kid) / per, sum(c[3] for c in kid) / per)


def bpm(student_logits_BTsVs, teacher_logits_BTtVt, align: ChunkAlignment,
        tables: BytePrefixTables, student_ids_BTs, *, s_loss_mask_BTs=None, t_loss_mask_BTt=None,
        mask_whitespace: bool = False, temperature: float = 1.0, num_valid=None,
        chunk_size=DEFAULT_CHUNK_SIZE, long: LongTokenTables | None = None,
        teacher_ids_BTt=None) -> tuple[torch.Tensor, BytePrefixStats]:
    """BPM: ``1/count * sum_units tau^2 KL(pbar || qbar)`` at the loss chunks' roots (module doc).

    Needs the teacher's full logits at its root rows (``teacher_logits_BTtVt``, temperature 1)
    and the student ids the logits were computed on (for the whitespace mask). ``long``
    (with ``teacher_ids_BTt``): the rule for student tokens longer than the teacher's root token
    (:mod:`xdistill.losses.byteprefix_long`).
    """
    return _byteprefix(student_logits_BTsVs, teacher_logits_BTtVt, align, tables, student_ids_BTs,
                       child=False, s_loss_mask_BTs=s_loss_mask_BTs,
                       t_loss_mask_BTt=t_loss_mask_BTt, mask_whitespace=mask_whitespace,
                       temperature=temperature, num_valid=num_valid, chunk_size=chunk_size,
                       long=long, teacher_ids_BTt=teacher_ids_BTt)


def escd(student_logits_BTsVs, teacher_logits_BTtVt, align: ChunkAlignment,
         tables: BytePrefixTables, student_ids_BTs, *, s_loss_mask_BTs=None, t_loss_mask_BTt=None,
         mask_whitespace: bool = False, temperature: float = 1.0, num_valid=None,
         chunk_size=DEFAULT_CHUNK_SIZE, long: LongTokenTables | None = None,
         teacher_ids_BTt=None) -> tuple[torch.Tensor, BytePrefixStats]:
    """ESCD: BPM's root term plus the completion-set child term at ``s_start`` (module doc).

    Inputs as :func:`bpm`; the child term reads the student's output at the chunk's first student
    row (the distribution after the sampled token ``a``) and the teacher's root row.
    """
    return _byteprefix(student_logits_BTsVs, teacher_logits_BTtVt, align, tables, student_ids_BTs,
                       child=True, s_loss_mask_BTs=s_loss_mask_BTs,
                       t_loss_mask_BTt=t_loss_mask_BTt, mask_whitespace=mask_whitespace,
                       temperature=temperature, num_valid=num_valid, chunk_size=chunk_size,
                       long=long, teacher_ids_BTt=teacher_ids_BTt)


__all__ = ["BytePrefixStats", "BytePrefixTables", "bpm", "count_byteprefix_units",
           "escd"]
