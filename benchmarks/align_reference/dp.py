"""Pure-Python reference of the DP path, written from the definitions (tests, benchmarks).

Legend: Ls / Lt DP symbols of the student / teacher (of a row or of a gap).

Same algorithms, tie-breaking and band schedule as the Numba ``_dp`` and ``_anchor`` modules (see
their docstrings for the definitions), with plain lists: :func:`banded_chunk_path` (the banded
chunk DP between two common cuts), :func:`find_anchors` (unique K-grams by dict counts instead of
hashes) and :func:`trim_anchors`, :func:`anchored_chunk_path` (the whole row). Symbols are bytes
(< 256) or role symbols (>= 256); ``ia``/``ib`` are the token-start flags (one more than the
symbols).
"""

from __future__ import annotations

MOVE_MATCH, MOVE_DEL, MOVE_INS = 0, 2, 3


def skip_weights(a, b) -> tuple[list, list, int]:
    """Skip cost of each symbol: a role symbol costs 1, a text byte ``big`` = 1 + the number of
    role symbols of both strings (so the cost ranks unaligned bytes first, unpaired roles second),
    and ``big``."""
    big = 1 + sum(c >= 256 for c in a) + sum(c >= 256 for c in b)
    return [1 if c >= 256 else big for c in a], [1 if c >= 256 else big for c in b], big


def band_cells(Ls: int, Lt: int, klo: int, W: int) -> int:
    """Cells of the band inside the matrix: what ``max_cells`` limits (row ``x`` holds the
    diagonals ``klo .. klo + W - 1`` whose column ``y = x + k`` lies in ``0 .. Lt``)."""
    return sum(max(0, min(W - 1, Lt - x - klo) - max(0, -x - klo) + 1) for x in range(Ls + 1))


def _band_fill(a, b, ia, ib, klo, W):
    """Banded chunk DP (see ``_dp``): returns the cost at the end and the F-state moves. Plain
    full-width rows (``(Ls + 1) * W`` entries): a reference for the gaps tests and benchmarks
    give it, not for a long gap against a short one (``_dp`` stores only the cells inside the
    matrix, :func:`band_cells`)."""
    Ls, Lt, INF = len(a), len(b), float("inf")
    wa, wb, _ = skip_weights(a, b)
    F = [[INF] * (W + 1) for _ in range(Ls + 1)]    # one spare column on the right
    H = [[INF] * (W + 1) for _ in range(Ls + 1)]
    move = [[MOVE_INS] * W for _ in range(Ls + 1)]
    for c in range(W):
        y = klo + c
        if 0 <= y <= Lt:
            F[0][c] = 0 if y == 0 else F[0][c - 1] + wb[y - 1]
            H[0][c] = F[0][c] if ia[0] and ib[y] else INF
    for x in range(1, Ls + 1):
        for c in range(W):
            y = x + klo + c
            if not 0 <= y <= Lt:
                continue
            g = H[x - 1][c] if y >= 1 and a[x - 1] == b[y - 1] else INF
            best, mv = F[x - 1][c + 1] + wa[x - 1], MOVE_DEL
            if y >= 1 and c >= 1 and F[x][c - 1] + wb[y - 1] < best:
                best, mv = F[x][c - 1] + wb[y - 1], MOVE_INS
            cut = ia[x] and ib[y]
            if cut and g < best:
                best, mv = g, MOVE_MATCH
            F[x][c], H[x][c], move[x][c] = best, best if cut else g, mv
    return F[Ls][Lt - Ls - klo], move


def _traceback(a, b, ia, ib, move, klo):
    x, y, in_run, path = len(a), len(b), False, []
    while x > 0 or y > 0:
        if in_run:
            path.append(MOVE_MATCH)
            x, y = x - 1, y - 1
            in_run = not (ia[x] and ib[y])
            continue
        mv = MOVE_INS if x == 0 else move[x][y - x - klo]
        if mv == MOVE_MATCH:
            in_run = True
        elif mv == MOVE_DEL:
            path.append(MOVE_DEL)
            x -= 1
        else:
            path.append(MOVE_INS)
            y -= 1
    return path[::-1]


def banded_chunk_path(a, b, ia, ib, band=32, max_cells=1 << 26):
    """Moves (0 match, 2 student symbol skipped, 3 teacher symbol skipped) of the banded chunk
    DP between two cut positions, with the band schedule of ``_dp.banded_dp``; ``None`` when
    even the first band exceeds ``max_cells``."""
    Ls, Lt = len(a), len(b)
    D, w, best = Lt - Ls, max(band, 1), None
    _, _, big = skip_weights(a, b)
    R = big - 1
    while True:
        klo, khi = max(min(0, D) - w, -Ls), min(max(0, D) + w, Lt)
        W = khi - klo + 1
        if band_cells(Ls, Lt, klo, W) > max_cells:
            break
        cost, move = _band_fill(a, b, ia, ib, klo, W)
        best = (klo, move)
        if (klo == -Ls and khi == Lt) or cost < big * (abs(D) + 2 * w + 2 - R):
            break
        w = min(max(-(-(cost // big + R - abs(D) - 1) // 2), w + 1), 4 * w)
    if best is None:
        return None
    return _traceback(a, b, ia, ib, best[1], best[0])


def _cut_prefix(a, b, ia, ib, x0, x1, y0, y1) -> int:
    """Length of the common prefix of ``a[x0:x1]`` and ``b[y0:y1]``, cut back to its last common
    cut (a position where both sides start a token, or end)."""
    n, p, last = min(x1 - x0, y1 - y0), 0, 0
    while True:
        if ia[x0 + p] and ib[y0 + p]:
            last = p
        if p == n or a[x0 + p] != b[y0 + p]:
            return last
        p += 1


def _cut_suffix(a, b, ia, ib, x0, x1, y0, y1) -> int:
    """Length of the common suffix of ``a[x0:x1]`` and ``b[y0:y1]``, cut back to its first
    common cut from the end."""
    n, q, last = min(x1 - x0, y1 - y0), 0, 0
    while True:
        if ia[x1 - q] and ib[y1 - q]:
            last = q
        if q == n or a[x1 - 1 - q] != b[y1 - 1 - q]:
            return last
        q += 1


def find_anchors(a, b, K: int) -> list:
    """Anchor segments ``(x, y, length)``: K-grams unique in both strings, longest chain with
    strictly increasing positions (patience LIS, same tie rules as the Numba version), overlapping
    chained K-grams on one diagonal merged, those overlapping on another diagonal dropped."""
    import bisect

    if K <= 0 or len(a) < K or len(b) < K:
        return []
    def unique(s):
        seen = {}
        for x in range(len(s) - K + 1):
            seen.setdefault(tuple(s[x:x + K]), []).append(x)
        return {g: xs[0] for g, xs in seen.items() if len(xs) == 1}
    ua, ub = unique(a), unique(b)
    cand = sorted((x, ub[g]) for g, x in ua.items() if g in ub)
    tails, tail_y, pred = [], [], []
    for c, (_, y) in enumerate(cand):
        pos = bisect.bisect_left(tail_y, y)
        pred.append(tails[pos - 1] if pos > 0 else -1)
        if pos == len(tails):
            tails.append(c)
            tail_y.append(y)
        else:
            tails[pos], tail_y[pos] = c, y
    chain, c = [], tails[-1] if tails else -1
    while c >= 0:
        chain.append(cand[c])
        c = pred[c]
    segs = []
    for x, y in reversed(chain):
        if segs:
            sx, sy, sl = segs[-1]
            if x - y == sx - sy and x <= sx + sl:
                segs[-1] = (sx, sy, max(sl, x + K - sx))
                continue
            if x < sx + sl or y < sy + sl:
                continue
        segs.append((x, y, K))
    return segs


def trim_anchors(segs, ia, ib, x_off: int, y_off: int) -> list:
    """Anchor segments (found at offsets ``x_off``/``y_off``) cut back to their first and last
    common cut, in absolute positions; segments with fewer than two common cuts are dropped."""
    out = []
    for sx, sy, sl in segs:
        cuts = [r for r in range(sl + 1) if ia[x_off + sx + r] and ib[y_off + sy + r]]
        if len(cuts) >= 2:
            out.append((x_off + sx + cuts[0], y_off + sy + cuts[0], cuts[-1] - cuts[0]))
    return out


def _gap_path(a, b, ia, ib, x0, x1, y0, y1, pinned, band, max_cells):
    """Moves from cut ``(x0, y0)`` to cut ``(x1, y1)``: the common prefix (to its last common cut),
    the common suffix (to its first common cut from the end) when an anchor follows the gap, the
    banded chunk DP in between (left unaligned when it exceeds ``max_cells``)."""
    p = _cut_prefix(a, b, ia, ib, x0, x1, y0, y1)
    q = _cut_suffix(a, b, ia, ib, x0 + p, x1, y0 + p, y1) if pinned else 0
    a0, a1, b0, b1 = x0 + p, x1 - q, y0 + p, y1 - q
    mid = None
    if a1 > a0 and b1 > b0:
        mid = banded_chunk_path(a[a0:a1], b[b0:b1], ia[a0:a1 + 1], ib[b0:b1 + 1], band,
                                max_cells)
    if mid is None:
        mid = [MOVE_DEL] * (a1 - a0) + [MOVE_INS] * (b1 - b0)
    return [MOVE_MATCH] * p + mid + [MOVE_MATCH] * q


def anchored_chunk_path(a, b, ia, ib, band=32, max_cells=1 << 26, anchor_k=32):
    """Moves of the anchored alignment (see ``_anchor``): the common prefix to its last common
    cut, the common suffix to its first common cut from the end when it holds at least
    ``anchor_k`` symbols (``anchor_k > 0``), unique K-gram anchors cut back to common cuts, and
    the gaps between them."""
    Ls, Lt = len(a), len(b)
    c = _cut_prefix(a, b, ia, ib, 0, Ls, 0, Lt)
    q = _cut_suffix(a, b, ia, ib, c, Ls, c, Lt) if anchor_k > 0 else 0
    q = q if q >= anchor_k else 0
    segs = trim_anchors(find_anchors(a[c:Ls - q], b[c:Lt - q], anchor_k), ia, ib, c, c)
    path, x, y = [MOVE_MATCH] * c, c, c
    for sx, sy, sl in segs:
        path += _gap_path(a, b, ia, ib, x, sx, y, sy, True, band, max_cells)
        path += [MOVE_MATCH] * sl
        x, y = sx + sl, sy + sl
    path += _gap_path(a, b, ia, ib, x, Ls - q, y, Lt - q, q > 0, band, max_cells)
    return path + [MOVE_MATCH] * q
