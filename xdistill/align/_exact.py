"""Exact path: O(n+m) two-pointer walk for rows whose two texts are byte-identical.

Legend: n / m student / teacher tokens of one row, C chunks of one row.

Both sides tokenize the same text ``X`` (checked by the caller). Walking the effective token
lengths (see ``_common``) with two pointers, a chunk closes whenever both prefixes end on the same
byte offset — the *cuts* — so chunks are the minimal spans with identical bytes (tokenkit's and
TRL GOLD's method). Role tokens hold no bytes: at a cut, the role runs of both sides are paired
by role (LCS, :func:`pair_roles`); a role token that falls strictly inside a chunk (its side has a
boundary there, the other side does not) makes that chunk unaligned, as does the DP path.
"""

from __future__ import annotations

from numba import njit

from xdistill.align._common import pair_roles


@njit
def exact_walk(ids_s, n, elen_s, roles_s, ids_t, m, elen_t, roles_t,
               s_chunk, t_chunk, cs0, cs1, ct0, ct1, c_role, c_adj):
    """Minimal chunks of two tokenizations of the same text; returns the chunk count.

    Writes chunk ids into ``s_chunk``/``t_chunk`` (pre-filled with -1; transparent tokens at a
    chunk's edges are left to ``attach_transparent``) and chunk spans into ``cs0..c_adj``.
    Requires equal total effective lengths on both sides. At each cut the role runs are paired
    (:func:`pair_roles`), then :func:`_walk_chunk` advances to the next cut; a chunk poisoned by
    a role token inside is reset to -1.
    """
    i = 0
    j = 0
    nc = 0
    last_closed = False   # the previous chunk ended at the current cut (for c_adj)
    while True:
        i_end = _skip_non_text(elen_s, i, n)
        j_end = _skip_non_text(elen_t, j, m)
        if _has_role(elen_s, i, i_end) or _has_role(elen_t, j, j_end):
            nc = pair_roles(i, i_end, j, j_end, ids_s, roles_s, elen_s, ids_t, roles_t,
                            elen_t, nc, s_chunk, t_chunk, cs0, cs1, ct0, ct1, c_role, c_adj)
            last_closed = False
        i = i_end
        j = j_end
        if i >= n or j >= m:
            break
        i1, j1, poisoned = _walk_chunk(elen_s, n, elen_t, m, i, j, nc, s_chunk, t_chunk)
        if poisoned:
            s_chunk[i:i1] = -1
            t_chunk[j:j1] = -1
            last_closed = False
        else:
            cs0[nc] = i
            cs1[nc] = i1
            ct0[nc] = j
            ct1[nc] = j1
            c_role[nc] = False
            c_adj[nc] = last_closed
            nc += 1
            last_closed = True
        i = i1
        j = j1
    return nc


@njit
def _walk_chunk(elen_s, n, elen_t, m, i, j, nc, s_chunk, t_chunk):
    """From a cut at tokens ``(i, j)`` (``elen_s[i] > 0``), advance the side that is behind until
    both prefixes end on the same byte; writes id ``nc`` on the way. Returns ``(i, j, poisoned)``:
    poisoned when a role token falls inside or a side runs out first."""
    ps = elen_s[i]
    s_chunk[i] = nc
    i += 1
    pt = 0
    poisoned = False
    while ps != pt:
        if ps < pt:
            if i >= n:
                return i, j, True
            e = elen_s[i]
            s_chunk[i] = nc
            i += 1
            if e < 0:
                poisoned = True
            else:
                ps += e
        else:
            if j >= m:
                return i, j, True
            e = elen_t[j]
            t_chunk[j] = nc
            j += 1
            if e < 0:
                poisoned = True
            else:
                pt += e
    return i, j, poisoned


@njit
def _skip_non_text(elen_n, i, n):
    """First index ``>= i`` of a token with text bytes (or ``n``)."""
    while i < n and elen_n[i] <= 0:
        i += 1
    return i


@njit
def _has_role(elen_n, a, b):
    for k in range(a, b):
        if elen_n[k] < 0:
            return True
    return False
