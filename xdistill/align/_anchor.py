"""Anchored DP: exact matches first, the banded chunk DP only on the gaps between them.

Legend: Ls / Lt symbols of the student / teacher row (or of a gap), A anchor candidates,
G anchor segments, M moves, K anchor length (``anchor_k``).

Why: a band centred on the main diagonal must be as wide as the length drift the edits
accumulate (thousands of symbols on long rows with scattered edits), so the DP cost grows like
``Ls * drift``. Anchors pin the path to long exact matches and leave short gaps.

The path of a row (:func:`anchored_path`), from the definition. Every piece starts and ends at a
*cut* (both sides start a token there, or end), so chunks never straddle two pieces:

1. *Common prefix*: the longest common prefix, cut back to its last common cut, is matched.
   The common suffix, cut back to its first common cut from the end, is matched only when it
   holds at least K symbols (and ``anchor_k > 0``): then it is a long exact match like an anchor.
   A short common suffix (a final ``","``) of rows of different lengths is often not in place
   (a truncated row); the DP pairs it in place.
2. *Anchors* in the rest: the K-grams that occur exactly once in each string are candidate
   pairs ``(x, y)``; the longest chain with increasing ``x`` and strictly increasing ``y`` is
   kept (patience LIS: candidates by ``x``, lower-bound search on the chain tails, predecessor
   links); chained candidates on the same diagonal that overlap are merged into one segment, a
   candidate that overlaps the previous segment on another diagonal is dropped. Each segment is
   cut back to its first and last common cut (dropped when it holds fewer than two) and matched.
3. *Gaps* between pieces: the gap's common prefix (to its last common cut), its common suffix
   (to its first common cut from the end) when an anchor follows it, then the banded chunk DP
   (``_dp.banded_dp``, band widened until its optimum is proven, so the rest of each gap is
   aligned optimally). A gap the DP cannot afford (``max_cells``) is left unaligned.

Guarantee: when nothing is anchored (``anchor_k = 0``; or no common suffix of K symbols and no
K-gram of the rest unique in both strings, e.g. rows shorter than K symbols), the chunks cover
the most bytes (then the most role pairs) among all chunkings that contain the common-prefix
chunks of step 1. That prefix is not
always optimal (rarely, skipping it pays: student ``"a" " " " " "é"`` vs teacher
``"a" " " "a" "  é"`` covers 2 bytes with the prefix ``"a "``, 5 without). With anchors, each
gap is optimal given its ends; every anchor is a unique long exact match that any sensible
alignment keeps. K-grams are counted by their 64-bit polynomial hash in open-addressing tables
(O(Ls + Lt), no sorting), and a candidate pair is verified symbol by symbol (a hash collision can
only drop a candidate).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from xdistill.align._dp import MOVE_DEL, MOVE_INS, MOVE_MATCH, STATUS_OK, STATUS_TOO_BIG, banded_dp

_HASH_MUL = np.uint64(0x100000001B3)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit
def anchored_path(sym_s, isb_s, sym_t, isb_t, band, max_cells, anchor_k):
    """Moves of the anchored alignment of two symbol strings (``isb_*``: token-start flags, one
    more than the symbols); returns ``(moves_M, status)`` (the worst gap status:
    ``STATUS_CAPPED`` or ``STATUS_TOO_BIG`` when a gap hit the cap)."""
    Ls = sym_s.size
    Lt = sym_t.size
    out_M = np.empty(Ls + Lt, np.int8)
    c = cut_prefix(sym_s, isb_s, 0, Ls, sym_t, isb_t, 0, Lt)
    q = 0
    if anchor_k > 0:                          # a long common suffix is an anchor
        q = cut_suffix(sym_s, isb_s, c, Ls, sym_t, isb_t, c, Lt)
        q = q if q >= anchor_k else 0
    sx, sy, sl = find_anchors(sym_s[c:Ls - q], sym_t[c:Lt - q], anchor_k)
    sx, sy, sl = trim_anchors(sx, sy, sl, isb_s, isb_t, c)
    k = _put(out_M, 0, MOVE_MATCH, c)
    x = c
    y = c
    status = STATUS_OK
    for g in range(sx.size):
        k, st = _gap(sym_s, isb_s, x, sx[g], sym_t, isb_t, y, sy[g], True, band, max_cells,
                     out_M, k)
        status = max(status, st)
        k = _put(out_M, k, MOVE_MATCH, sl[g])
        x = sx[g] + sl[g]
        y = sy[g] + sl[g]
    k, st = _gap(sym_s, isb_s, x, Ls - q, sym_t, isb_t, y, Lt - q, q > 0, band, max_cells,
                 out_M, k)
    status = max(status, st)
    k = _put(out_M, k, MOVE_MATCH, q)
    return out_M[:k].copy(), status


@njit
def _gap(sym_s, isb_s, x0, x1, sym_t, isb_t, y0, y1, pinned, band, max_cells, out_M, k):
    """Align cut ``(x0, y0)`` .. cut ``(x1, y1)`` into ``out_M[k:]``; returns (k, status).
    ``pinned``: an anchor follows, so the gap's common suffix is in place and matched."""
    p = cut_prefix(sym_s, isb_s, x0, x1, sym_t, isb_t, y0, y1)
    q = 0
    if pinned:
        q = cut_suffix(sym_s, isb_s, x0 + p, x1, sym_t, isb_t, y0 + p, y1)
    k = _put(out_M, k, MOVE_MATCH, p)
    a0 = x0 + p
    a1 = x1 - q
    b0 = y0 + p
    b1 = y1 - q
    status = STATUS_OK
    if a1 > a0 and b1 > b0:
        moves, status = banded_dp(sym_s[a0:a1], sym_t[b0:b1], isb_s[a0:a1 + 1],
                                  isb_t[b0:b1 + 1], band, max_cells)
        if status == STATUS_TOO_BIG:
            k = _put(out_M, k, MOVE_DEL, a1 - a0)
            k = _put(out_M, k, MOVE_INS, b1 - b0)
        else:
            out_M[k:k + moves.size] = moves
            k += moves.size
    else:
        k = _put(out_M, k, MOVE_DEL, a1 - a0)
        k = _put(out_M, k, MOVE_INS, b1 - b0)
    k = _put(out_M, k, MOVE_MATCH, q)
    return k, status


@njit(inline="always")
def _put(out_M, k, move, count):
    for r in range(count):
        out_M[k + r] = move
    return k + count


@njit
def cut_prefix(a, isb_a, a0, a1, b, isb_b, b0, b1):
    """Length of the common prefix of ``a[a0:a1]`` and ``b[b0:b1]``, cut back to its last common
    cut (``a0``/``b0`` must be a common cut)."""
    p = _common_run(a[a0:a1], b[b0:b1])
    while p > 0 and not (isb_a[a0 + p] and isb_b[b0 + p]):
        p -= 1
    return p


@njit
def cut_suffix(a, isb_a, a0, a1, b, isb_b, b0, b1):
    """Length of the common suffix of ``a[a0:a1]`` and ``b[b0:b1]``, cut back to its first common
    cut from the end (``a1``/``b1`` must be a common cut)."""
    q = _common_run(a[a0:a1][::-1], b[b0:b1][::-1])
    while q > 0 and not (isb_a[a1 - q] and isb_b[b1 - q]):
        q -= 1
    return q


@njit
def _common_run(a, b):
    """Length of the common prefix of two (zero-based) views."""
    n = min(a.size, b.size)
    p = 0
    while p < n and a[p] == b[p]:
        p += 1
    return p


@njit
def trim_anchors(sx_G, sy_G, sl_G, isb_s, isb_t, off):
    """Anchor segments found at offset ``off`` on both sides, cut back to their first and last
    common cut, in absolute positions; segments with fewer than two common cuts are dropped."""
    ox = np.empty_like(sx_G)
    oy = np.empty_like(sy_G)
    ol = np.empty_like(sl_G)
    g = 0
    for r in range(sx_G.size):
        x0 = off + sx_G[r]
        y0 = off + sy_G[r]
        first = 0
        while first <= sl_G[r] and not (isb_s[x0 + first] and isb_t[y0 + first]):
            first += 1
        last = sl_G[r]
        while last > first and not (isb_s[x0 + last] and isb_t[y0 + last]):
            last -= 1
        if last > first:
            ox[g] = x0 + first
            oy[g] = y0 + first
            ol[g] = last - first
            g += 1
    return ox[:g], oy[:g], ol[:g]


@njit
def _kgram_hashes(sym_L, K):
    """Polynomial hash (mod 2**64) of every K-gram, by rolling."""
    n = sym_L.size - K + 1
    h_A = np.empty(n, np.uint64)
    top = np.uint64(1)
    h = np.uint64(0)
    for j in range(K):
        h = h * _HASH_MUL + np.uint64(sym_L[j] + 1)
        if j > 0:
            top = top * _HASH_MUL
    h_A[0] = h
    for i in range(1, n):
        h = (h - np.uint64(sym_L[i - 1] + 1) * top) * _HASH_MUL + np.uint64(sym_L[i + K - 1] + 1)
        h_A[i] = h
    return h_A


@njit
def _count_table(h_A):
    """Open-addressing table of K-gram hashes: ``(keys, counts, first positions, shift)``;
    slots by Fibonacci hashing (the high bits of ``h * golden``), linear probing."""
    bits = 4
    while (1 << bits) < 2 * h_A.size:
        bits += 1
    shift = np.uint64(64 - bits)
    keys = np.zeros(1 << bits, np.uint64)
    cnt = np.zeros(1 << bits, np.int32)
    pos = np.zeros(1 << bits, np.int64)
    for i in range(h_A.size):
        slot = _find(keys, cnt, h_A[i], shift)
        if cnt[slot] == 0:
            keys[slot] = h_A[i]
            pos[slot] = i
        cnt[slot] += 1
    return keys, cnt, pos, shift


@njit(inline="always")
def _find(keys, cnt, h, shift):
    """Slot of hash ``h``: where it is stored, or the empty slot where it would go."""
    mask = keys.size - 1
    slot = np.int64((h * _GOLDEN) >> shift)
    while cnt[slot] != 0 and keys[slot] != h:
        slot = (slot + 1) & mask
    return slot


@njit
def _candidates(a, b, K):
    """Pairs ``(x, y)`` of K-grams unique in both strings and equal, by increasing ``x``."""
    ha = _kgram_hashes(a, K)
    hb = _kgram_hashes(b, K)
    ka, ca, _, sa = _count_table(ha)
    kb, cb, pb, sb = _count_table(hb)
    xs = np.empty(ha.size, np.int64)
    ys = np.empty(ha.size, np.int64)
    c = 0
    for x in range(ha.size):
        if ca[_find(ka, ca, ha[x], sa)] != 1:
            continue
        slot = _find(kb, cb, ha[x], sb)
        if cb[slot] != 1:
            continue
        y = pb[slot]
        same = True
        for j in range(K):
            if a[x + j] != b[y + j]:
                same = False
                break
        if same:
            xs[c] = x
            ys[c] = y
            c += 1
    return xs[:c], ys[:c]


@njit
def _chain(xs, ys):
    """Indices of the longest chain with strictly increasing ``ys`` (patience LIS)."""
    n = xs.size
    tails = np.empty(n, np.int64)     # tails[l]: candidate ending the best chain of length l+1
    pred = np.full(n, -1, np.int64)
    length = 0
    for c in range(n):
        lo = 0
        hi = length
        while lo < hi:                # first l with ys[tails[l]] >= ys[c]
            mid = (lo + hi) // 2
            if ys[tails[mid]] < ys[c]:
                lo = mid + 1
            else:
                hi = mid
        if lo > 0:
            pred[c] = tails[lo - 1]
        tails[lo] = c
        if lo == length:
            length += 1
    out = np.empty(length, np.int64)
    c = tails[length - 1] if length > 0 else -1
    for r in range(length - 1, -1, -1):
        out[r] = c
        c = pred[c]
    return out


@njit
def find_anchors(a, b, K):
    """Anchor segments ``(sx_G, sy_G, len_G)`` of two symbol strings (see the module doc)."""
    empty = np.zeros(0, np.int64)
    if K <= 0 or a.size < K or b.size < K:
        return empty, empty, empty
    xs, ys = _candidates(a, b, K)
    idx = _chain(xs, ys)
    sx = np.empty(idx.size, np.int64)
    sy = np.empty(idx.size, np.int64)
    sl = np.empty(idx.size, np.int64)
    g = 0
    for r in range(idx.size):
        x = xs[idx[r]]
        y = ys[idx[r]]
        if g > 0:
            ex = sx[g - 1] + sl[g - 1]
            ey = sy[g - 1] + sl[g - 1]
            if x - y == sx[g - 1] - sy[g - 1] and x <= ex:
                sl[g - 1] = max(sl[g - 1], x + K - sx[g - 1])
                continue
            if x < ex or y < ey:
                continue
        sx[g] = x
        sy[g] = y
        sl[g] = K
        g += 1
    return sx[:g], sy[:g], sl[:g]
