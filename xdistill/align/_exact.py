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
    Requires equal total effective lengths on both sides. The inner loop advances the side that
    is behind until both prefixes end on the same byte (ids are written on the fly; a chunk
    poisoned by a role token inside is reset to -1).
    """
    i = 0
    j = 0
    nc = 0
    last_closed = False   # the previous chunk ended at the current cut (for c_adj)
    while True:
        i_end = i
        while i_end < n and elen_s[i_end] <= 0:
            i_end += 1
        j_end = j
        while j_end < m and elen_t[j_end] <= 0:
            j_end += 1
        if i_end > i or j_end > j:
            if _has_role(elen_s, i, i_end) or _has_role(elen_t, j, j_end):
                nc = pair_roles(i, i_end, j, j_end, ids_s, roles_s, elen_s, ids_t, roles_t,
                                elen_t, nc, s_chunk, t_chunk, cs0, cs1, ct0, ct1, c_role, c_adj)
                last_closed = False
        i = i_end
        j = j_end
        if i >= n or j >= m:
            break
        cs0[nc] = i
        ct0[nc] = j
        ps = elen_s[i]
        s_chunk[i] = nc
        i += 1
        pt = 0
        poisoned = False
        while ps != pt:
            if ps < pt:
                if i >= n:
                    poisoned = True
                    break
                e = elen_s[i]
                s_chunk[i] = nc
                i += 1
                if e < 0:
                    poisoned = True
                else:
                    ps += e
            else:
                if j >= m:
                    poisoned = True
                    break
                e = elen_t[j]
                t_chunk[j] = nc
                j += 1
                if e < 0:
                    poisoned = True
                else:
                    pt += e
        if poisoned:
            for k in range(cs0[nc], i):
                s_chunk[k] = -1
            for k in range(ct0[nc], j):
                t_chunk[k] = -1
            last_closed = False
        else:
            cs1[nc] = i
            ct1[nc] = j
            c_role[nc] = False
            c_adj[nc] = last_closed
            nc += 1
            last_closed = True
    return nc


@njit(inline="always")
def _has_role(elen_n, a, b):
    for k in range(a, b):
        if elen_n[k] < 0:
            return True
    return False
