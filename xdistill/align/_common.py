"""Numba building blocks shared by the exact and the DP path (per row, no batch axis).

Legend: n / m student / teacher tokens of one row, C chunks of one row, L text bytes (or symbols).

Per-token *effective length* ``elen`` (int64): the number of text bytes a token contributes after
the row's phantom prefix is removed; ``-1`` marks a role token (``roles_V != ROLE_TEXT``, aligned by
role, never by bytes). A text token with ``elen == 0`` is *transparent*: it has no text (an empty
vocabulary entry, or a token eaten entirely by the phantom prefix); the walks skip it and
:func:`attach_transparent` gives it the chunk of its neighbouring text token afterwards.

A chunk under construction is described by per-chunk arrays ``cs0/cs1`` (student token span of its
non-transparent tokens, end exclusive), ``ct0/ct1`` (teacher), ``c_role`` (a role pair) and
``c_adj`` (it starts exactly where the previous chunk ended on both sides, nothing in between).
"""

from __future__ import annotations

import numpy as np
from numba import njit

ROLE_SYMBOL_BASE = 256  # DP symbol of a role token = ROLE_SYMBOL_BASE + role


@njit
def effective_lengths(ids_T, n, off_V1, roles_V, phantom_T):
    """Per-token effective text lengths (``-1`` = role) and the row's total text bytes.

    ``phantom_T[i]``: bytes at the start of token ``i``'s table bytes that are not in the text
    (SentencePiece's dummy-prefix space); a count larger than the token carries on into the next
    text tokens (role tokens hold no bytes), so a row-level phantom prefix is ``phantom_T[0]``
    (``phantom_T`` may be shorter than the row: tokens beyond it have none).
    Returns ``(elen_n, total)``; ``total == -1`` when phantom bytes run past the row's text
    (the caller reports it; nothing is read out of bounds).
    """
    elen_n = np.empty(n, np.int64)
    total = 0
    for i in range(n):
        tid = ids_T[i]
        if roles_V[tid] != 0:
            elen_n[i] = -1
        else:
            ln = off_V1[tid + 1] - off_V1[tid]
            elen_n[i] = ln
            total += ln
    n_ph = min(n, phantom_T.size)             # a row-level form holds token 0 only
    rem = 0
    for i in range(n):
        if i < n_ph:
            rem += phantom_T[i]
        elif rem == 0:
            break
        if rem > 0 and elen_n[i] > 0:
            d = min(rem, elen_n[i])
            elen_n[i] -= d
            rem -= d
            total -= d
    if rem > 0:
        return elen_n, -1
    return elen_n, total


@njit
def normalized_lengths(ids_T, n, off_V1, data, elen_n, fold):
    """Per-token lengths in the comparison space: ``elen_n`` itself for lossless pairs; for lossy
    pairs (``fold``) the number of non-whitespace effective bytes (``-1`` stays a role token).
    Returns ``(nlen_n, total)``."""
    if not fold:
        total = 0
        for i in range(n):
            if elen_n[i] > 0:
                total += elen_n[i]
        return elen_n, total
    nlen_n = np.empty(n, np.int64)
    total = 0
    for i in range(n):
        e = elen_n[i]
        if e < 0:
            nlen_n[i] = -1
            continue
        end = off_V1[ids_T[i] + 1]
        c = 0
        for q in range(end - e, end):
            if not is_space_byte(data[q]):
                c += 1
        nlen_n[i] = c
        total += c
    return nlen_n, total


@njit
def text_bytes(ids_T, n, off_V1, data, elen_n, total, fold):
    """The row's text in the comparison space (uint8 ``[L]``): the concatenated effective bytes
    of its text tokens; when ``fold``, ASCII-lower-cased with whitespace removed (``total`` is
    the matching length from :func:`normalized_lengths`)."""
    out_L = np.empty(total, np.uint8)
    p = 0
    for i in range(n):
        e = elen_n[i]
        if e > 0:
            end = off_V1[ids_T[i] + 1]
            for q in range(end - e, end):
                x = data[q]
                if fold:
                    if is_space_byte(x):
                        continue
                    x = fold_ascii(x)
                out_L[p] = x
                p += 1
    return out_L


@njit
def lead_space(ids_T, n, off_V1, data, elen_n, fold):
    """Per token: whether ASCII whitespace starts it in the comparison space (for "space" chunks).

    Lossless: the token's first effective byte is whitespace. Lossy (whitespace is not compared):
    whitespace occurs in the raw text after the previous non-whitespace byte and before this
    token's first non-whitespace byte (whitespace-only tokens count for the next token)."""
    lead_n = np.zeros(n, np.bool_)
    pending = False
    for i in range(n):
        e = elen_n[i]
        if e < 0:
            pending = False
            continue
        end = off_V1[ids_T[i] + 1]
        if not fold:
            lead_n[i] = e > 0 and is_space_byte(data[end - e])
            continue
        first = True
        for q in range(end - e, end):
            if is_space_byte(data[q]):
                pending = True
            else:
                if first:
                    lead_n[i] = pending
                    first = False
                pending = False
    return lead_n


@njit(inline="always")
def fold_ascii(x):
    """ASCII upper case -> lower case (used when a table is lossy, e.g. uncased WordPiece)."""
    if 65 <= x <= 90:
        return x + 32
    return x


@njit
def bytes_equal(a_L, b_L):
    """Whether two byte strings are equal."""
    if a_L.size != b_L.size:
        return False
    for q in range(a_L.size):
        if a_L[q] != b_L[q]:
            return False
    return True


@njit(inline="always")
def emit_chunk(nc, i0, i1, j0, j1, is_role, adj, elen_s, elen_t, s_chunk, t_chunk,
               cs0, cs1, ct0, ct1, c_role, c_adj):
    """Record chunk ``nc`` over tokens ``[i0,i1) x [j0,j1)``; ids go to non-transparent tokens."""
    cs0[nc] = i0
    cs1[nc] = i1
    ct0[nc] = j0
    ct1[nc] = j1
    c_role[nc] = is_role
    c_adj[nc] = adj
    for i in range(i0, i1):
        if elen_s[i] != 0:
            s_chunk[i] = nc
    for j in range(j0, j1):
        if elen_t[j] != 0:
            t_chunk[j] = nc
    return nc + 1


@njit(inline="always")
def is_space_byte(x):
    """ASCII whitespace: space, \\t, \\n, \\v, \\f, \\r."""
    return x == 32 or (9 <= x <= 13)


@njit
def merge_space(nc, lead_s, lead_t, s_chunk, t_chunk, cs0, cs1, ct0, ct1, c_role, c_adj):
    """tokenkit's "space" chunks: merge adjacent minimal text chunks unless the next one starts
    with ASCII whitespace on either side (``lead_space`` of its first token; for lossless pairs
    the chunk's first byte, equal on both sides). Role chunks and chunks separated by unaligned
    tokens are never merged. Returns the new chunk count."""
    if nc == 0:
        return 0
    new_id = np.empty(nc, np.int32)
    g = 0
    new_id[0] = 0
    for k in range(1, nc):
        space = not c_role[k] and (lead_s[cs0[k]] or lead_t[ct0[k]])
        merge = c_adj[k] and not c_role[k] and not c_role[k - 1] and not space
        if merge:
            cs1[g] = cs1[k]
            ct1[g] = ct1[k]
        else:
            g += 1
            cs0[g] = cs0[k]
            cs1[g] = cs1[k]
            ct0[g] = ct0[k]
            ct1[g] = ct1[k]
            c_role[g] = c_role[k]
        new_id[k] = g
    for i in range(s_chunk.size):
        if s_chunk[i] >= 0:
            s_chunk[i] = new_id[s_chunk[i]]
    for j in range(t_chunk.size):
        if t_chunk[j] >= 0:
            t_chunk[j] = new_id[t_chunk[j]]
    return g + 1


@njit
def attach_transparent(elen_n, chunk_n):
    """Give each transparent token (text, 0 effective bytes) the chunk of the next non-transparent
    token when that is an aligned text token, else the chunk of the previous one when that is an
    aligned text token, else leave it unaligned. Keeps chunks contiguous in token order."""
    n = elen_n.size
    nxt = -1
    for i in range(n - 1, -1, -1):      # backward: remember the next text token's chunk
        if elen_n[i] != 0:
            nxt = chunk_n[i] if elen_n[i] > 0 else -1
        else:
            chunk_n[i] = nxt
    prev = -1
    for i in range(n):                  # forward: fall back to the previous text token's chunk
        if elen_n[i] != 0:
            prev = chunk_n[i] if elen_n[i] > 0 else -1
        elif chunk_n[i] < 0:
            chunk_n[i] = prev


@njit
def pair_roles(i, i_end, j, j_end, ids_s, roles_s, elen_s, ids_t, roles_t, elen_t, nc,
               s_chunk, t_chunk, cs0, cs1, ct0, ct1, c_role, c_adj):
    """Pair the role tokens of two role runs (tokens ``[i,i_end)`` and ``[j,j_end)``, which hold
    no text bytes) by a longest common subsequence of their roles; each pair becomes a 1:1 role
    chunk, the rest stay unaligned. Traceback from the end: take the diagonal on equal roles, else
    drop the student token when ``LCS[a-1][b] >= LCS[a][b-1]``, else the teacher token."""
    ps = np.empty(i_end - i, np.int64)
    a = 0
    for k in range(i, i_end):
        if elen_s[k] < 0:
            ps[a] = k
            a += 1
    pt = np.empty(j_end - j, np.int64)
    b = 0
    for k in range(j, j_end):
        if elen_t[k] < 0:
            pt[b] = k
            b += 1
    if a == 0 or b == 0:
        return nc
    lcs = np.zeros((a + 1, b + 1), np.int32)
    for x in range(1, a + 1):
        rx = roles_s[ids_s[ps[x - 1]]]
        for y in range(1, b + 1):
            if rx == roles_t[ids_t[pt[y - 1]]]:
                lcs[x, y] = lcs[x - 1, y - 1] + 1
            else:
                lcs[x, y] = max(lcs[x - 1, y], lcs[x, y - 1])
    pairs_s = np.empty(min(a, b), np.int64)
    pairs_t = np.empty(min(a, b), np.int64)
    npair = 0
    x, y = a, b
    while x > 0 and y > 0:
        if roles_s[ids_s[ps[x - 1]]] == roles_t[ids_t[pt[y - 1]]]:
            pairs_s[npair] = ps[x - 1]
            pairs_t[npair] = pt[y - 1]
            npair += 1
            x -= 1
            y -= 1
        elif lcs[x - 1, y] >= lcs[x, y - 1]:
            x -= 1
        else:
            y -= 1
    for q in range(npair - 1, -1, -1):
        si = pairs_s[q]
        tj = pairs_t[q]
        nc = emit_chunk(nc, si, si + 1, tj, tj + 1, True, False, elen_s, elen_t, s_chunk, t_chunk,
                        cs0, cs1, ct0, ct1, c_role, c_adj)
    return nc
