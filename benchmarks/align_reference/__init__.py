"""Slow pure-Python reference of the aligner, written from the definitions (tests, benchmarks).

Not part of the package: ``benchmarks/align.py`` imports it as ``align_reference`` (its own folder
is on ``sys.path``), the tests through pytest's ``pythonpath`` (``pyproject.toml``).

Legend: n / m student / teacher tokens of one row; L text bytes; Ls / Lt DP symbols.

Same definitions as :mod:`xdistill.align.api`, one row at a time, with plain lists:

* :func:`exact_chunks_walk`: the two-pointer walk (the algorithm the Numba exact path runs);
* :func:`exact_chunks_sets`: the same chunks from the definition — cuts are the common byte
  offsets of both sides' token boundaries; a role token sits at the byte offset of the text
  before it;
* :func:`banded_chunk_path` / :func:`find_anchors` / :func:`trim_anchors` /
  :func:`anchored_chunk_path` (in :mod:`align_reference.dp`, re-exported here): the
  DP path, i.e. the common prefix cut back to a common cut, unique K-gram anchors cut back to
  common cuts, and on the gaps the banded chunk DP (most bytes inside chunks, unaligned text
  pushed towards the end on ties), with the Numba version's band schedule and tie-breaking;
* :func:`norm`: the comparison space (lossy pairs: ASCII lower case, whitespace removed);
* :func:`chunks_from_path`: chunks between consecutive cuts of each matched run.

:func:`align_row_reference` combines them into the same outputs as one row of ``align_batch``.
"""

from __future__ import annotations

from dataclasses import dataclass

from align_reference.dp import (anchored_chunk_path, banded_chunk_path,  # noqa: F401
                              find_anchors, trim_anchors)
from xdistill.tokenization.table import ROLE_TEXT, TokenByteTable

WHITESPACE = b" \t\n\v\f\r"


@dataclass
class RowAlignment:
    """One row's alignment: per-token chunk ids and ``(s0, s1, t0, t1, exact)`` per chunk."""

    s_chunk: list
    t_chunk: list
    chunks: list
    used_dp: bool
    s_coverage: float
    t_coverage: float


@dataclass
class _Chunk:
    s: list            # non-transparent student token indices
    t: list
    role: bool = False
    adj: bool = False  # starts exactly where the previous chunk ended on both sides


def effective_lengths(ids, table: TokenByteTable, phantom) -> list:
    """Text bytes per token after removing phantom bytes; -1 for role tokens.

    ``phantom``: an int (the row's phantom prefix, i.e. phantom bytes at token 0) or one count
    per token (bytes at the start of that token's table bytes that are not in the text; a count
    larger than the token carries on into the next text tokens)."""
    phantom_T = per_token_phantoms(phantom, len(ids))
    elen = [-1 if table.roles_V[i] != ROLE_TEXT else len(table.token_bytes(i)) for i in ids]
    rem = 0
    for k, e in enumerate(elen):
        rem += phantom_T[k]
        take = min(rem, max(e, 0))
        elen[k] -= take
        rem -= take
    if rem > 0:
        raise ValueError("phantom bytes longer than the text")
    return elen


def per_token_phantoms(phantom, n: int) -> list:
    """Per-token phantom counts from an int (all of it at token 0) or a per-token sequence."""
    if isinstance(phantom, int) or getattr(phantom, "ndim", 1) == 0:
        if n == 0 and int(phantom) > 0:
            raise ValueError("phantom bytes longer than the text")
        return [int(phantom)] * min(n, 1) + [0] * (n - 1)
    out = [int(v) for v in phantom]
    if len(out) != n:
        raise ValueError(f"{len(out)} phantom counts for {n} tokens")
    return out


def token_text(tid: int, table: TokenByteTable, e: int) -> bytes:
    """The effective bytes of a token (its last ``e`` table bytes)."""
    raw = table.token_bytes(tid)
    return raw[len(raw) - e:] if e > 0 else b""


def fold(b: bytes, on: bool) -> bytes:
    return bytes(c + 32 if on and 65 <= c <= 90 else c for c in b)


def norm(b: bytes, on: bool) -> bytes:
    """The comparison space: unchanged for lossless pairs; ASCII lower case and no whitespace
    (``WHITESPACE``) for lossy pairs."""
    return bytes(c for c in fold(b, on) if c not in WHITESPACE) if on else b


def normalized_lengths(ids, elen, table: TokenByteTable, on: bool) -> list:
    """Per-token lengths in the comparison space (-1 stays a role token)."""
    return [e if e < 0 else len(norm(token_text(i, table, e), on)) for i, e in zip(ids, elen)]


def lead_space(ids, elen, table: TokenByteTable, on: bool) -> list:
    """Per token: ASCII whitespace starts it in the comparison space (lossless: first byte is
    whitespace; lossy: whitespace since the previous non-whitespace byte before its first
    non-whitespace byte)."""
    out, pending = [], False
    for tid, e in zip(ids, elen):
        raw = token_text(tid, table, e)
        if e < 0:
            out.append(False)
            pending = False
        elif not on:
            out.append(raw[:1] != b"" and raw[0] in WHITESPACE)
        else:
            stripped = raw.lstrip(WHITESPACE)
            out.append(bool(stripped) and (pending or len(stripped) < len(raw)))
            if raw:
                pending = raw[-1] in WHITESPACE if stripped else True
    return out


def _lcs_pairs(a: list, b: list) -> list:
    """Index pairs of an LCS of two role lists (traceback rules as in the Numba version)."""
    L = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for x in range(1, len(a) + 1):
        for y in range(1, len(b) + 1):
            L[x][y] = L[x - 1][y - 1] + 1 if a[x - 1] == b[y - 1] else max(L[x - 1][y],
                                                                           L[x][y - 1])
    x, y, out = len(a), len(b), []
    while x > 0 and y > 0:
        if a[x - 1] == b[y - 1]:
            out.append((x - 1, y - 1))
            x, y = x - 1, y - 1
        elif L[x - 1][y] >= L[x][y - 1]:
            x -= 1
        else:
            y -= 1
    return out[::-1]


def _role_chunks(rs: list, rt: list, s_ids, t_ids, s_table, t_table) -> list:
    roles_s = [int(s_table.roles_V[s_ids[i]]) for i in rs]
    roles_t = [int(t_table.roles_V[t_ids[j]]) for j in rt]
    return [_Chunk([rs[x]], [rt[y]], role=True) for x, y in _lcs_pairs(roles_s, roles_t)]


def exact_chunks_walk(s_ids, t_ids, elen_s, elen_t, s_table, t_table) -> list:
    """Two-pointer walk over effective lengths (texts must be equal)."""
    n, m, i, j, out, last_closed = len(elen_s), len(elen_t), 0, 0, [], False
    while True:
        i_end, j_end = i, j
        while i_end < n and elen_s[i_end] <= 0:
            i_end += 1
        while j_end < m and elen_t[j_end] <= 0:
            j_end += 1
        rs = [k for k in range(i, i_end) if elen_s[k] < 0]
        rt = [k for k in range(j, j_end) if elen_t[k] < 0]
        if rs or rt:
            out += _role_chunks(rs, rt, s_ids, t_ids, s_table, t_table)
            last_closed = False
        i, j = i_end, j_end
        if i >= n or j >= m:
            return out
        i0, j0, ps, pt, poisoned = i, j, 0, 0, False
        while not (ps == pt and ps > 0):
            if ps <= pt:
                e, i = elen_s[i], i + 1
                poisoned |= e < 0
                ps += max(e, 0)
            else:
                e, j = elen_t[j], j + 1
                poisoned |= e < 0
                pt += max(e, 0)
        if not poisoned:
            out.append(_Chunk([k for k in range(i0, i) if elen_s[k] != 0],
                              [k for k in range(j0, j) if elen_t[k] != 0], adj=last_closed))
        last_closed = not poisoned


def exact_chunks_sets(s_ids, t_ids, elen_s, elen_t, s_table, t_table) -> list:
    """Minimal chunks from the definition: cuts = common byte offsets of token boundaries."""
    def layout(elen):
        pos, starts, ends, role_at = 0, {}, set(), {}
        for k, e in enumerate(elen):
            if e < 0:
                role_at.setdefault(pos, []).append(k)
            elif e > 0:
                starts[pos] = k
                pos += e
                ends.add(pos)
        return starts, ends | {0}, role_at, pos

    s_starts, s_b, s_roles, total = layout(elen_s)
    t_starts, t_b, t_roles, _ = layout(elen_t)
    cuts = sorted(s_b & t_b)
    out, prev_emitted = [], False
    for q, o in enumerate(cuts):
        rs, rt = s_roles.get(o, []), t_roles.get(o, [])
        out += _role_chunks(rs, rt, s_ids, t_ids, s_table, t_table)
        if q + 1 == len(cuts) or o == total:
            continue
        end = cuts[q + 1]
        if any(o < p < end for p in list(s_roles) + list(t_roles)):
            prev_emitted = False          # a role token strictly inside: unaligned
            continue
        s_tok = sorted(k for p, k in s_starts.items() if o <= p < end)
        t_tok = sorted(k for p, k in t_starts.items() if o <= p < end)
        out.append(_Chunk(s_tok, t_tok, adj=prev_emitted and not rs and not rt))
        prev_emitted = True
    return out


def symbols(ids, elen, table: TokenByteTable, folded: bool):
    """DP symbols (bytes in the comparison space, or 256 + role for role tokens), their tokens,
    token-start flags."""
    sym, tok, isb = [], [], []
    for k, (tid, e) in enumerate(zip(ids, elen)):
        if e < 0:
            sym.append(256 + int(table.roles_V[tid]))
            tok.append(k)
            isb.append(True)
        for q, c in enumerate(norm(token_text(tid, table, e), folded)):
            sym.append(c)
            tok.append(k)
            isb.append(q == 0)
    return sym, tok, isb + [True]


def chunks_from_path(path, sym_s, tok_s, isb_s, sym_t, tok_t, isb_t) -> list:
    """Chunks between consecutive cuts of each maximal run of matches on the path."""
    runs, x, y, cur = [], 0, 0, None
    for mv in path:
        if mv == 0:
            if cur is None:
                cur = [(x, y)]
                runs.append(cur)
            x, y = x + 1, y + 1
            cur.append((x, y))
        else:
            cur = None
            x, y = x + (mv != 3), y + (mv != 2)
    out, prev_end = [], None
    for run in runs:
        cuts = [(p, q) for p, q in run if isb_s[p] and isb_t[q]]
        for (x0, y0), (x1, y1) in zip(cuts, cuts[1:]):
            out.append(_Chunk(sorted(set(tok_s[x0:x1])), sorted(set(tok_t[y0:y1])),
                              role=sym_s[x0] >= 256, adj=prev_end == (x0, y0)))
            prev_end = (x1, y1)
    return out


def merge_space(chunks: list, lead_s: list, lead_t: list) -> list:
    """tokenkit's "space" variant: merge adjacent text chunks unless the next starts with ASCII
    whitespace on either side (``lead_space`` of its first text token)."""
    out = []
    for ch in chunks:
        space = not ch.role and (lead_s[ch.s[0]] or lead_t[ch.t[0]])
        if out and ch.adj and not ch.role and not out[-1].role and not space:
            out[-1] = _Chunk(out[-1].s + ch.s, out[-1].t + ch.t)
        else:
            out.append(_Chunk(list(ch.s), list(ch.t), ch.role, ch.adj))
    return out


def _attach(elen, ids_of):
    """Transparent tokens take the chunk of the next (else previous) aligned text token."""
    n = len(elen)
    for k in range(n):
        if elen[k] != 0:
            continue
        nxt = next((q for q in range(k + 1, n) if elen[q] != 0), None)
        prv = next((q for q in range(k - 1, -1, -1) if elen[q] != 0), None)
        if nxt is not None and elen[nxt] > 0 and ids_of[nxt] >= 0:
            ids_of[k] = ids_of[nxt]
        elif prv is not None and elen[prv] > 0 and ids_of[prv] >= 0:
            ids_of[k] = ids_of[prv]


def align_row_reference(s_ids, t_ids, s_table, t_table, *, s_phantom=0, t_phantom=0,
                        chunks="minimal", method="auto", exact_impl="walk", dp_band=32,
                        dp_max_cells=1 << 26, dp_anchor=32) -> RowAlignment:
    """One row of ``align_batch``, in pure Python (``exact_impl``: "walk" or "sets")."""
    s_ids, t_ids = [int(v) for v in s_ids], [int(v) for v in t_ids]
    folded = bool(s_table.lossy or t_table.lossy)
    elen_s = effective_lengths(s_ids, s_table, s_phantom)
    elen_t = effective_lengths(t_ids, t_table, t_phantom)
    nlen_s = normalized_lengths(s_ids, elen_s, s_table, folded)
    nlen_t = normalized_lengths(t_ids, elen_t, t_table, folded)
    text_s = b"".join(token_text(i, s_table, e) for i, e in zip(s_ids, elen_s))
    text_t = b"".join(token_text(i, t_table, e) for i, e in zip(t_ids, elen_t))
    use_dp = method == "dp" or norm(text_s, folded) != norm(text_t, folded)
    if use_dp and method == "exact":
        raise ValueError("texts differ")
    if use_dp:
        sym_s, tok_s, isb_s = symbols(s_ids, elen_s, s_table, folded)
        sym_t, tok_t, isb_t = symbols(t_ids, elen_t, t_table, folded)
        path = anchored_chunk_path(sym_s, sym_t, isb_s, isb_t, dp_band, dp_max_cells, dp_anchor)
        found = chunks_from_path(path, sym_s, tok_s, isb_s, sym_t, tok_t, isb_t)
    else:
        impl = exact_chunks_walk if exact_impl == "walk" else exact_chunks_sets
        found = impl(s_ids, t_ids, nlen_s, nlen_t, s_table, t_table)
    if chunks == "space":
        found = merge_space(found, lead_space(s_ids, elen_s, s_table, folded),
                            lead_space(t_ids, elen_t, t_table, folded))
    s_chunk, t_chunk = [-1] * len(s_ids), [-1] * len(t_ids)
    for k, ch in enumerate(found):
        for i in ch.s:
            s_chunk[i] = k
        for j in ch.t:
            t_chunk[j] = k
    _attach(nlen_s, s_chunk)
    _attach(nlen_t, t_chunk)
    out = []
    for k, ch in enumerate(found):
        s_tok = [i for i, c in enumerate(s_chunk) if c == k]
        t_tok = [j for j, c in enumerate(t_chunk) if c == k]
        exact = (not ch.role and len(s_tok) == 1 and len(t_tok) == 1
                 and s_table.token_bytes(s_ids[s_tok[0]]) == t_table.token_bytes(t_ids[t_tok[0]]))
        out.append((s_tok[0], s_tok[-1] + 1, t_tok[0], t_tok[-1] + 1, exact))
    cov = (lambda ids_of: 1.0 if not ids_of else sum(c >= 0 for c in ids_of) / len(ids_of))
    return RowAlignment(s_chunk, t_chunk, out, use_dp, cov(s_chunk), cov(t_chunk))
