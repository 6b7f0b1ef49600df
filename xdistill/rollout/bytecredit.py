"""Host side of byte-level credit: the terms of each unit's covering probability, from bytes.

Legend: B batch, Ts/Tt student/teacher tokens, C chunks, N units, K terms, V vocabulary.

:mod:`xdistill.losses.bytecredit` explains the event ("the unit's bytes, then the boundary the
student's tokenization implies", or "then the end of the text" for a unit merged with the
student's stop) and the bounded lookahead; this module enumerates, per unit and side, the terms
``pi_m * mass`` (every mass a sum of probabilities) of the lower bound and of the gap:

* at on-path level ``m`` (remaining bytes ``rho``; ``pi_m`` = the path probability of the first
  ``m`` tokens; mass read from the row predicting token ``m``): the tokens sticking out past the
  unit whose rest meets the boundary (``range(rho)`` without ``exact(rho)``, the ``range(rho +
  e)`` and the ``exact(rho + r)``; none with a stop) in the lower bound, and ``+ exact(rho +
  r)`` (rest still open), ``+ exact(rho)`` off the path and ``+ exact(rho[:k])`` off the path
  (``0 < k < |rho|``) in the gap;
* after the whole unit (``pi_n``, the row after the last token): every token but the
  ``range(e)`` and the ``exact(r)`` in the lower bound (the tokens outside the byte-sorted
  vocabulary -- end, role and padding ids -- included) and ``+ sum_r exact(r)`` in the gap;
  with a stop, the path through the stop token (``pi_{n+1}``) alone.

``range(x)`` = the text tokens whose bytes start with ``x`` (a contiguous range of the
byte-sorted vocabulary), ``exact(x)`` = those whose bytes are ``x`` (the start of ``range(x)``),
``e`` ranges over ``E(a)`` (minimal suffixes turning the unit's last student token ``a`` into a
longer student token) and ``r`` over the non-empty strict prefixes of those suffixes. Every term
is a sum of probabilities (a set difference is written as the disjoint sorted ranges it leaves,
never as a subtraction), so a bound far below the float64 resolution of ``1 - x`` keeps its
relative precision.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

import numpy as np
import torch

from xdistill.losses.bytecredit import (BYTE_UNITS, MASS_ID, MASS_ONE, MASS_OTHER, MASS_RANGE,
                                        ByteCredit, ByteTerms, credit_units)
from xdistill.losses.byteprefix_long import LongTokenTables
from xdistill.tokenization.table import ROLE_TEXT

_INDEX: dict = {}


class VocabIndex:
    """Byte-sorted text tokens of one vocabulary: prefix ranges, exact lookups, extensions."""

    def __init__(self, table):
        self.table = table
        ids = np.flatnonzero((table.roles_V == ROLE_TEXT) & (table.lengths_V > 0))
        pairs = sorted((table.token_bytes(int(i)), int(i)) for i in ids)
        self.keys = [k for k, _ in pairs]
        self.sorted_ids = np.asarray([i for _, i in pairs], dtype=np.int64)
        self.by_bytes: dict[bytes, list[int]] = {}
        for k, i in pairs:
            self.by_bytes.setdefault(k, []).append(i)
        self._ext: dict[int, tuple[tuple[bytes, ...], tuple[bytes, ...]]] = {}

    @classmethod
    def of(cls, table, key=None) -> "VocabIndex":
        """Cached per ``key`` (a tokenizer fingerprint) when given."""
        if key is None:
            return cls(table)
        if key not in _INDEX:
            _INDEX[key] = cls(table)
        return _INDEX[key]

    def range(self, prefix: bytes) -> tuple[int, int]:
        """[lo, hi) in sorted order of the tokens whose bytes start with ``prefix``."""
        n = len(prefix)
        lo = bisect_left(self.keys, prefix)
        hi = bisect_right(self.keys, prefix, lo=lo, key=lambda k: k[:n])
        return lo, hi

    def exact(self, data: bytes) -> list[int]:
        return self.by_bytes.get(data, [])

    def exact_span(self, data: bytes) -> tuple[int, int]:
        """[lo, hi) in sorted order of the tokens whose bytes are ``data`` (empty if none)."""
        lo = bisect_left(self.keys, data)
        return lo, lo + len(self.by_bytes.get(data, ()))

    def without(self, lo: int, hi: int, holes) -> list[tuple[int, int]]:
        """The sorted ranges left of ``[lo, hi)`` after removing the ranges ``holes``."""
        out, at = [], lo
        for h_lo, h_hi in sorted(holes):
            h_lo, h_hi = max(h_lo, at), min(h_hi, hi)
            if h_hi <= h_lo:
                continue
            if h_lo > at:
                out.append((at, h_lo))
            at = h_hi
        if hi > at:
            out.append((at, hi))
        return out

    def extensions(self, token_id: int) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
        """(``E``: minimal prefix-free suffixes making ``token_id`` a longer token of this
        vocabulary, ``R``: their distinct non-empty strict prefixes). Cached."""
        if token_id not in self._ext:
            a = self.table.token_bytes(int(token_id))
            lo, hi = self.range(a)
            found: list[bytes] = []
            for k in self.keys[lo:hi]:                 # sorted: a prefix comes before its
                s = k[len(a):]                         # extensions
                if s and not (found and s.startswith(found[-1])):
                    found.append(s)
            strict = sorted({e[:i] for e in found for i in range(1, len(e))})
            self._ext[token_id] = (tuple(found), tuple(strict))
        return self._ext[token_id]


class _Terms:
    """Growing term lists of one side (see :class:`xdistill.losses.bytecredit.ByteTerms`)."""

    def __init__(self, index: VocabIndex):
        self.index = index
        self.cols = {k: [] for k in ("unit", "gap", "ps", "pl", "kind", "row", "lo", "hi",
                                     "respell")}
        self.rows: dict[tuple[int, int], int] = {}
        self.path_b: list[int] = []
        self.path_t: list[int] = []

    def row(self, b: int, t: int) -> int:
        return self.rows.setdefault((b, t), len(self.rows))

    def add(self, unit, gap, ps, pl, kind, row=0, lo=0, hi=0, respell=False):
        for k, v in zip(self.cols, (unit, gap, ps, pl, kind, row, lo, hi, respell)):
            self.cols[k].append(v)

    def add_ranges(self, unit, ps, pl, row, spans) -> None:
        """Lower-bound terms: the masses of the sorted ranges ``spans``."""
        for lo, hi in spans:
            self.add(unit, False, ps, pl, MASS_RANGE, row, lo, hi)

    def add_exact(self, unit, gap, ps, pl, row, data: bytes, skip: int = -1,
                  respell: bool = False):
        for tid in self.index.exact(data):
            if tid != skip:
                self.add(unit, gap, ps, pl, MASS_ID, row, tid, 0, respell)

    def tensors(self, num_units: int, dens: list | None = None) -> ByteTerms:
        """The terms of ``num_units`` units; ``dens``: (units, b, token id, position, phantom
        bytes) per unit group whose first token starts with phantom bytes: each gets a
        denominator unit after the ``num_units`` (ByteTerms.den_N)."""
        den_N = None
        if dens:
            den_N = np.full(num_units, -1, dtype=np.int64)
            for i, (units, b, tid, pos, k) in enumerate(dens):
                _side_terms(self, num_units + i, b, [tid], [pos], False, ((), ()), limit=k)
                den_N[list(units)] = i
        c = self.cols
        long = lambda x: torch.as_tensor(np.asarray(x, dtype=np.int64))  # noqa: E731
        rows = sorted(self.rows.items(), key=lambda kv: kv[1])
        return ByteTerms(long(c["unit"]), torch.as_tensor(np.asarray(c["gap"], dtype=bool)),
                         long(c["ps"]),
                         long(c["pl"]), long(c["kind"]), long(c["row"]), long(c["lo"]),
                         long(c["hi"]), long([b for (b, _), _ in rows]),
                         long([t for (_, t), _ in rows]), long(self.path_b), long(self.path_t),
                         torch.as_tensor(self.index.sorted_ids), int(num_units),
                         torch.as_tensor(np.asarray(c["respell"], dtype=bool)),
                         None if den_N is None else torch.as_tensor(den_N),
                         len(dens) if dens else 0)


def _side_terms(T: _Terms, unit: int, b: int, ids: list[int], pos: list[int], stop: bool,
                ext: tuple, limit: int | None = None) -> None:
    """Append one unit's terms for one side (module doc); ``ids``/``pos`` the side's unit tokens
    (the last one the stop token when ``stop``). ``limit``: score only the first ``limit`` bytes
    (a student-token prefix of the unit, never with a stop); a side's token that crosses the limit
    sticks out at its level like any other token, and a side that falls back to token credit
    gives the prefix probability 1 (the whole unit's credit then sits on its last sub-unit)."""
    table = T.index.table
    ps = len(T.path_b)
    T.path_b += [b] * len(ids)
    T.path_t += list(pos)
    content = ids[:-1] if stop else ids
    n = len(content)
    text = all(table.roles_V[i] == ROLE_TEXT and table.lengths_V[i] > 0 for i in content)
    if n == 0 or not text:                             # token credit: pi over every token
        T.add(unit, False, ps, 0 if limit is not None else len(ids), MASS_ONE)
        return
    pieces = [table.token_bytes(int(i)) for i in content]
    beta = b"".join(pieces)[:limit]
    starts = np.concatenate([[0], np.cumsum([len(x) for x in pieces])]).tolist()
    levels = [m for m in range(n) if starts[m] < len(beta)]
    for m in levels:
        _level_terms(T, unit, b, pos, content, pieces, m, beta[starts[m]:],
                     starts[m + 1] - len(beta), stop, ext, ps)
    nl = levels[-1] + 1
    if starts[nl] > len(beta):                         # the last level's token sticks out
        return
    if stop:
        T.add(unit, False, ps, nl + 1, MASS_ONE)
        return
    E, R = ext
    if not E and not R:                                # nothing extends the last token
        T.add(unit, False, ps, nl, MASS_ONE)
        return
    idx, nxt = T.index, T.row(b, pos[nl - 1])
    T.add(unit, False, ps, nl, MASS_OTHER, nxt)
    holes = [idx.range(e) for e in E] + [idx.exact_span(r) for r in R]
    T.add_ranges(unit, ps, nl, nxt, idx.without(0, len(idx.keys), holes))
    for r in R:
        T.add_exact(unit, True, ps, nl, nxt, r)


def _level_terms(T: _Terms, unit, b, pos, content, pieces, m: int, rho: bytes, over: int,
                 stop: bool, ext: tuple, ps: int) -> None:
    """The terms at on-path level ``m`` (remaining bytes ``rho``; ``over`` = how far the path's
    own token ``m`` ends past the scored bytes: < 0 inside, 0 exactly at the end, > 0 sticking
    out)."""
    E, R = ext
    row = T.row(b, pos[m] - 1)
    if not stop:
        idx = T.index
        holes = ([idx.exact_span(rho)] + [idx.range(rho + e) for e in E]
                 + [idx.exact_span(rho + r) for r in R])
        T.add_ranges(unit, ps, m, row, idx.without(*idx.range(rho), holes))
        for r in R:
            T.add_exact(unit, True, ps, m, row, rho + r)
    # another id with the bytes of the path's own token m (a byte-fallback id, an added
    # duplicate) is a re-spelling: in the gap, and reported apart (``respell``)
    T.add_exact(unit, True, ps, m, row, rho, skip=content[m] if over == 0 else -1,
                respell=over == 0)
    for k in range(1, len(rho)):
        T.add_exact(unit, True, ps, m, row, rho[:k], skip=content[m] if over < 0 else -1,
                    respell=rho[:k] == pieces[m])


def build_byte_terms(student_table, teacher_table, student_ids_BTs, teacher_ids_BTt, align,
                     s_loss_mask_BTs=None, t_loss_mask_BTt=None, stop_BTs=None, *,
                     student_key=None, teacher_key=None, units: str = "chunk",
                     t_phantom_BTt=None) -> ByteCredit:
    """Both sides' terms for the units of ``align`` (already stop-merged:
    :func:`xdistill.losses.bytecredit.merge_stop_chunks`), in :func:`credit_units` order.
    ``units = "token"``: one sub-unit per student token of each unit, in token order (the
    prefix of the unit's content up to and including that token, then the student's boundary;
    the last one is the unit itself), for :mod:`xdistill.losses.bytecredit_tokens`.
    ``*_key``: tokenizer fingerprints to cache the vocabulary indexes by. ``t_phantom_BTt``: the
    teacher's phantom bytes per token (a token straddling the prompt/response edge holds the
    prompt's last bytes): a unit starting with one is scored given those bytes (its covering
    probability divided by theirs, :class:`ByteTerms` ``den_N``)."""
    if units not in BYTE_UNITS:
        raise ValueError(f"unknown byte-credit units {units!r}; allowed: {BYTE_UNITS}")
    s_idx = VocabIndex.of(student_table, student_key)
    t_idx = VocabIndex.of(teacher_table, teacher_key)
    S, T = _Terms(s_idx), _Terms(t_idx)
    b_N, c_N = credit_units(align, s_loss_mask_BTs, t_loss_mask_BTt)
    s_chunk = align.s_chunk_BTs.cpu().numpy()
    t_chunk = align.t_chunk_BTt.cpu().numpy()
    s_ids = np.asarray(torch.as_tensor(student_ids_BTs).cpu())
    t_ids = np.asarray(torch.as_tensor(teacher_ids_BTt).cpu())
    stop = (np.zeros(s_ids.shape, dtype=bool) if stop_BTs is None
            else np.asarray(torch.as_tensor(stop_BTs).cpu()).astype(bool))
    ext_of = (lambda a: s_idx.extensions(a) if s_idx.table.roles_V[a] == ROLE_TEXT  # noqa: E731
              else ((), ()))
    t_ph = None if t_phantom_BTt is None else np.asarray(torch.as_tensor(t_phantom_BTt).cpu())
    u, dens = 0, []
    for b, c in zip(b_N.tolist(), c_N.tolist()):
        s_pos = np.flatnonzero(s_chunk[b] == c).tolist()
        t_pos = np.flatnonzero(t_chunk[b] == c).tolist()
        ends = bool(stop[b, s_pos[-1]])
        a_ids = [int(s_ids[b, i]) for i in s_pos]
        t_all = [int(t_ids[b, j]) for j in t_pos]
        t_stop = ends and len(t_pos) > 1
        u0, k = u, int(t_ph[b, t_pos[0]]) if t_ph is not None else 0
        if units == "token":
            u = _prefix_units(S, T, u, b, a_ids[:-1], s_pos,
                              t_all[:-1] if t_stop else t_all, t_pos, ext_of, k)
        a = a_ids[-2] if ends and len(a_ids) > 1 else a_ids[-1]
        _side_terms(S, u, b, a_ids, s_pos, ends, ext_of(a))
        _side_terms(T, u, b, t_all, t_pos, t_stop, ext_of(a))
        if k and table_is_text(t_idx.table, t_all[0]):
            dens.append((range(u0, u + 1), b, t_all[0], t_pos[0], k))
        u += 1
    return ByteCredit(T.tensors(u, dens), S.tensors(u), units)


def table_is_text(table, tid: int) -> bool:
    return bool(table.roles_V[tid] == ROLE_TEXT and table.lengths_V[tid] > 0)


def _prefix_units(S: _Terms, T: _Terms, u: int, b: int, content: list[int], s_pos, t_content,
                  t_pos, ext_of, t_phantom: int = 0) -> int:
    """The sub-units of one unit before its last (``content``: the student tokens that end a
    strict prefix of the unit, i.e. all but the unit's last token); returns the next unit id.
    ``t_phantom``: the teacher's first token starts with that many bytes before the unit (its
    prefixes are that much longer on the teacher's side)."""
    table = S.index.table
    limit = 0
    for j, a in enumerate(content):
        limit += int(table.lengths_V[a])
        ext = ext_of(a)
        _side_terms(S, u, b, content[:j + 1], s_pos[:j + 1], False, ext, limit=limit)
        _side_terms(T, u, b, t_content, t_pos[:len(t_content)], False, ext,
                    limit=limit + t_phantom)
        u += 1
    return u


def build_long_token_tables(student_table, teacher_table):
    """The tables of BPM/ESCD's long-token rule (:mod:`xdistill.losses.byteprefix_long`): for
    each teacher text token with the exact bytes of a student token ``u0``, the student's minimal
    extensions ``v = u0 + e`` that no teacher token's bytes start with (a student token longer
    than the teacher's: a teacher that has ``v`` maps it already), with the teacher-sorted range
    of tokens starting with ``e``. A teacher with the student's vocabulary gets no entries."""
    s_idx, t_idx = VocabIndex(student_table), VocabIndex(teacher_table)
    V = teacher_table.vocab_size
    counts = np.zeros(V, dtype=np.int64)
    v_X, lo_X, hi_X = [], [], []
    for w in t_idx.sorted_ids.tolist():
        bw = teacher_table.token_bytes(w)
        same = s_idx.exact(bw)
        if not same:
            continue
        for e in s_idx.extensions(same[0])[0]:
            lo, hi = t_idx.range(e)
            t_lo, t_hi = t_idx.range(bw + e)
            if hi > lo and t_hi == t_lo:     # no teacher token spells v: longer than the teacher's
                counts[w] += 1
                v_X.append(s_idx.exact(bw + e)[0])
                lo_X.append(lo)
                hi_X.append(hi)
    order = np.argsort(t_idx.sorted_ids, kind="stable")     # entries in teacher-id order
    starts = np.concatenate([[0], np.cumsum(counts[t_idx.sorted_ids])])
    pos = [np.arange(starts[k], starts[k + 1]) for k in order]
    perm = np.concatenate(pos) if pos else np.zeros(0, dtype=np.int64)
    long = lambda x: torch.as_tensor(np.asarray(x, dtype=np.int64))  # noqa: E731
    ptr = np.concatenate([[0], np.cumsum(counts)])
    return LongTokenTables(long(ptr), long(v_X)[perm], long(lo_X)[perm], long(hi_X)[perm],
                           long(t_idx.sorted_ids))


__all__ = ["VocabIndex", "build_byte_terms", "build_long_token_tables"]
