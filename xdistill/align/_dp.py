"""DP path: banded chunk DP of two symbol strings (most bytes inside chunks), and chunks from runs.

Legend: n / m student / teacher tokens of one row; Ls / Lt symbols; W band width; M moves.

Symbols: each text byte is a symbol (for lossy pairs, ``fold``: whitespace bytes are dropped and
the rest ASCII-lower-cased, see ``api``), each role token one symbol ``256 + role`` that only
matches the same role. A *cut* is a position ``(x, y)`` where both sides start a token (or end).
``_anchor`` calls :func:`banded_dp` on gaps that start and end at cuts.

The chunk DP, from the definition. A path from ``(0, 0)`` to ``(Ls, Lt)`` skips a student symbol
(``MOVE_DEL``), skips a teacher symbol (``MOVE_INS``) or matches two equal symbols
(``MOVE_MATCH``); a *run* of matches may only start and end at cuts, so the matched symbols are
exactly those inside chunks of identical bytes. The cost is the weight of the skipped symbols: a
role symbol weighs 1, a text byte ``big = 1 + R`` (``R`` role symbols on both sides), so the
optimum first maximises the bytes inside chunks, then the paired role tokens. Two states per cell:

    F(x, y) = min(F(x-1, y) + w(s[x-1]), F(x, y-1) + w(t[y-1]), G(x, y) if (x, y) is a cut)
    G(x, y) = H(x-1, y-1) if s[x-1] == t[y-1] else inf,   H = F at cuts, else G

(``F``: outside a run; ``G``: inside one; ``H``: what a run through a cell continues from). Only
the F moves are stored: inside a run the traceback goes diagonally to the previous cut. Ties (the
traceback runs from the end) prefer a deletion, then an insertion, then closing a run: among
optimal paths the matches come as early as possible and unaligned text is pushed to the end
(an edited or truncated row pairs its tokens in place).

Band: cells ``min(0,D)-w <= y-x <= max(0,D)+w`` (``D = Lt-Ls``). A path leaving the band skips at
least ``|D| + 2w + 2`` symbols, at most ``R`` of them role symbols, so it costs at least
``big * (|D| + 2w + 2 - R)``; a banded optimum below that is the true optimum. Otherwise ``w``
grows to the width that the banded cost is sure to prove (any band containing the current one
does no worse), at most 4x, until the full matrix or ``max_cells`` traceback cells, after which
the banded alignment (valid, maybe suboptimal) is used and the row flagged. Work: cells that
cannot lie on a path cheaper than a known bound are pruned (:func:`_band_fill`; the result is
that of the unpruned DP): the first band at its proof bound (refilled unpruned when its cost is
above it, as widening needs that cost), wider bands at the cost of the previous band's path.

Chunks: along the path, a *run* is a maximal stretch of matches; consecutive cuts of one run
enclose a minimal chunk. Everything outside chunks stays unaligned: mismatched text is never
glued into a chunk.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from xdistill.align._common import ROLE_SYMBOL_BASE, emit_chunk, fold_ascii, is_space_byte

MOVE_MATCH = 0
MOVE_DEL = 2   # student symbol without partner
MOVE_INS = 3   # teacher symbol without partner
_INF = 1 << 62
STATUS_OK = 0
STATUS_CAPPED = 1     # band limited by max_cells before the optimum was proven
STATUS_TOO_BIG = 2    # even the narrowest band exceeds max_cells: row left unaligned


@njit
def symbols(ids_T, n, off_V1, data, roles_V, elen_n, nlen_n, fold):
    """Symbol string of a row plus, per symbol, its token (``tok_L``) and token-start flags
    (``isb_L1``: True at position x when a token starts at x, and at the end). When ``fold``
    whitespace bytes are skipped and the rest ASCII-lower-cased (the lossy comparison space)."""
    total = 0
    for i in range(n):
        e = nlen_n[i]
        total += 1 if e < 0 else e
    sym_L = np.empty(total, np.int32)
    tok_L = np.empty(total, np.int32)
    isb_L1 = np.zeros(total + 1, np.bool_)
    p = 0
    for i in range(n):
        e = elen_n[i]
        if e < 0:
            sym_L[p] = ROLE_SYMBOL_BASE + roles_V[ids_T[i]]
            tok_L[p] = i
            isb_L1[p] = True
            p += 1
        elif nlen_n[i] > 0:
            isb_L1[p] = True
            end = off_V1[ids_T[i] + 1]
            for q in range(end - e, end):
                x = data[q]
                if fold:
                    if is_space_byte(x):
                        continue
                    x = fold_ascii(x)
                sym_L[p] = x
                tok_L[p] = i
                p += 1
    isb_L1[total] = True
    return sym_L, tok_L, isb_L1


@njit(inline="always")
def _skip_cost(sym, big):
    """Cost of skipping a symbol: 1 for a role symbol, ``big`` for a text byte."""
    return 1 if sym >= ROLE_SYMBOL_BASE else big


@njit
def _band_fill(sym_s, sym_t, isb_s, isb_t, klo, W, big, R, ub, tb, base_L):
    """Fill the banded chunk DP (cell (x, y) at row x, column y - x - klo, i.e. one column per
    diagonal) and the F-state moves (``tb[base_L[x] + c]``: :func:`_band_rows`); returns the cost
    at the end (``_INF`` if pruned).

    ``f[c]`` holds F of the current row (updated in place: column ``c + 1`` still holds the row
    above when ``c`` is computed) and ``h[c]`` the H of the diagonal's last cell. Pruning: a cell
    whose F and H plus a lower bound of the rest (``|D - k|`` skips, at most ``R`` of them role
    symbols) exceed ``ub`` (the cost of a known path) is dead: no optimal path passes through it.
    Each row visits only the columns its live predecessors reach (``lo - 1`` .. ``hi``, then
    insertions to the right while they stay live) and trims dead cells off both ends; the next
    row sees them as infinite. Cells on optimal paths are never dead and keep their exact
    values, so the optimal paths and their tie-breaking are those of the unpruned DP."""
    Ls = sym_s.size
    Lt = sym_t.size
    Dk = Lt - Ls - klo                        # lower bound of the rest at column c: |Dk - c|
    f = np.full(W + 2, _INF, np.int64)
    h = np.full(W + 2, _INF, np.int64)
    lo = -1
    hi = -1
    acc = 0
    for c in range(W):
        y = klo + c
        if 0 <= y <= Lt:
            if y > 0:
                acc += _skip_cost(sym_t[y - 1], big)
            f[c] = acc
            h[c] = acc if isb_s[0] and isb_t[y] else _INF
            tb[base_L[0] + c] = MOVE_INS
            if not _dead(acc, acc, _rest_bound(abs(Dk - c), big, R), ub):
                if lo < 0:
                    lo = c
                hi = c
    for x in range(1, Ls + 1):
        if lo < 0:
            return _INF
        if lo > 0:
            f[lo - 1] = _INF
            h[lo - 1] = _INF
        f[hi + 1] = _INF
        h[hi + 1] = _INF
        c_lo = max(0, -x - klo)
        c_hi = min(W - 1, Lt - x - klo)
        sx = sym_s[x - 1]
        lo, hi = _fill_row(sx, _skip_cost(sx, big), isb_s[x], x + klo, max(c_lo, lo - 1),
                           min(c_hi, hi), c_hi, Dk, sym_t, isb_t, big, R, ub, f, h,
                           tb[base_L[x]:base_L[x] + W])
    return f[Dk] if lo <= Dk <= hi and f[Dk] <= ub else _INF


@njit
def _band_rows(Ls, Lt, klo, W):
    """(cells, ``base_L``): the band's cells inside the matrix (row ``x`` holds columns
    ``max(0, -x - klo) .. min(W - 1, Lt - x - klo)``: at most ``Lt + 1``, so a gap between a
    long and a short side costs ``(Ls + 1) * (Lt + 1)`` cells, not ``(Ls + 1) * W``), and where
    row ``x``'s column ``c`` is stored: ``base_L[x] + c`` (the rows packed one after another,
    ``W`` spare slots at each end)."""
    base_L = np.empty(Ls + 1, np.int64)
    at = W
    for x in range(Ls + 1):
        c_lo = max(0, -x - klo)
        c_hi = min(W - 1, Lt - x - klo)
        base_L[x] = at - c_lo
        if c_hi >= c_lo:
            at += c_hi - c_lo + 1
    return at - W, base_L


@njit(inline="always")
def _rest_bound(dk, big, R):
    """Least cost of ``dk`` more skips when at most ``R`` of them may be role symbols."""
    if R == 0:
        return dk * big
    return max(dk, big * (dk - R))


@njit(inline="always")
def _fill_row(sx, ws, bx, y0, c0, c1, c_hi, Dk, sym_t, isb_t, big, R, ub, f, h, tb_W):
    """Row ``x``: columns ``c0..c1`` have live predecessors above; further columns up to ``c_hi``
    only through insertions. ``bx``: the student starts a token here (cells where the teacher
    does too are cuts: F may close a run, H = F). Returns the row's live range (lo, hi): dead
    cells (F and H plus the bound of the rest above ``ub``) are trimmed from both ends.

    The main loop runs over zero-based views (``j = c - cs``), which spares numba's
    negative-index handling on every access (about a third of the time per cell here)."""
    fl = _INF
    cs = c0
    if cs <= c1 and y0 + cs == 0:             # y = 0: only the cell above
        fl = f[cs + 1] + ws
        f[cs] = fl
        h[cs] = fl if bx and isb_t[0] else _INF
        tb_W[cs] = MOVE_DEL
        cs += 1
    n = c1 + 1 - cs
    if n > 0:
        fl = _fill_views(sx, ws, bx, n, fl, big, f[cs + 1:c1 + 2], f[cs:c1 + 1], h[cs:c1 + 1],
                         tb_W[cs:c1 + 1], sym_t[y0 + cs - 1:y0 + c1], isb_t[y0 + cs:y0 + c1 + 1])
    last = c1
    for c in range(max(c1 + 1, c0), c_hi + 1):   # beyond the row above: insertions only
        y = y0 + c
        fl = fl + _skip_cost(sym_t[y - 1], big)
        if fl + _rest_bound(abs(Dk - c), big, R) > ub:
            break
        f[c] = fl
        h[c] = fl if bx and isb_t[y] else _INF
        tb_W[c] = MOVE_INS
        last = c
    if ub >= _INF:
        return (c0, last) if c0 <= last else (-1, -1)
    lo = c0
    while lo <= last and _dead(f[lo], h[lo], _rest_bound(abs(Dk - lo), big, R), ub):
        lo += 1
    hi = last
    while hi >= lo and _dead(f[hi], h[hi], _rest_bound(abs(Dk - hi), big, R), ub):
        hi -= 1
    return (lo, hi) if lo <= hi else (-1, -1)


@njit(inline="always")
def _fill_views(sx, ws, bx, n, fl, big, f_up, f_row, h_row, tb_row, st, isb):
    """The ``n`` cells of a row with predecessors above, on views aligned at the first one:
    ``f_up[j]`` is F above (``f_row`` shifted by one, still the row above when read), ``st``
    the teacher symbol left of the cell (its skip cost: 1 for a role, else ``big``), ``isb`` its
    token start. Written with selects rather than branches (their outcomes follow the text, so
    branches mispredict). Returns F of the last cell."""
    if bx:
        for j in range(n):
            up = f_up[j] + ws
            left = fl + _skip_cost(st[j], big)
            g = h_row[j] if sx == st[j] else _INF
            best = min(up, left)
            move = MOVE_INS if left < up else MOVE_DEL
            cut = isb[j]
            close = cut and g < best
            fl = g if close else best
            f_row[j] = fl
            h_row[j] = fl if cut else g
            tb_row[j] = MOVE_MATCH if close else move
    else:                                     # no cut: F from skips only, H = G
        if big == 1:                          # no role symbol: every skip costs 1
            for j in range(n):
                up = f_up[j] + 1
                left = fl + 1
                fl = min(up, left)
                f_row[j] = fl
                tb_row[j] = MOVE_INS if left < up else MOVE_DEL
        else:
            for j in range(n):
                up = f_up[j] + ws
                left = fl + _skip_cost(st[j], big)
                fl = min(up, left)
                f_row[j] = fl
                tb_row[j] = MOVE_INS if left < up else MOVE_DEL
        for j in range(n):                    # runs go on through matches only
            h_row[j] = h_row[j] if sx == st[j] else _INF
    return fl


@njit(inline="always")
def _dead(fv, hv, lb, ub):
    v = min(fv, hv)
    return v >= _INF or v + lb > ub


@njit
def banded_dp(sym_s, sym_t, isb_s, isb_t, w0, max_cells):
    """Chunk DP path between two cuts (``isb_*`` hold the token-start flags of the two pieces,
    one more than their symbols); returns ``(moves_M, status)``."""
    Ls = sym_s.size
    Lt = sym_t.size
    D = Lt - Ls
    R = 0
    for x in range(Ls):
        R += sym_s[x] >= ROLE_SYMBOL_BASE
    for y in range(Lt):
        R += sym_t[y] >= ROLE_SYMBOL_BASE
    big = R + 1
    w = max(w0, 1)
    ub = _INF                                 # cost of the best path found so far
    best_tb = np.zeros(1, np.uint8)
    best_base = np.zeros(1, np.int64)
    best_klo = 0
    have = False
    status = STATUS_OK
    while True:
        klo = max(min(0, D) - w, -Ls)
        khi = min(max(0, D) + w, Lt)
        W = khi - klo + 1
        cells, base_L = _band_rows(Ls, Lt, klo, W)
        if cells > max_cells:
            status = STATUS_CAPPED if have else STATUS_TOO_BIG
            break
        full = klo == -Ls and khi == Lt
        proof = big * (abs(D) + 2 * w + 2 - R)   # a banded cost below this is optimal
        tb = np.empty(cells + 2 * W, np.uint8)
        cost = _INF
        if not have and not full and proof > 0:
            # first band: pruned at the proof bound; a cost above it (the end pruned) refills
            # the band unpruned, as its exact cost is needed to widen it
            cost = _band_fill(sym_s, sym_t, isb_s, isb_t, klo, W, big, R, proof - 1, tb,
                              base_L)
        if cost >= _INF:
            cost = _band_fill(sym_s, sym_t, isb_s, isb_t, klo, W, big, R, ub, tb, base_L)
        ub = cost
        best_tb = tb
        best_base = base_L
        best_klo = klo
        have = True
        if full or cost < proof:
            break
        need = (cost // big + R - abs(D)) // 2   # = ceil((cost // big + R - |D| - 1) / 2)
        w = min(max(need, w + 1), 4 * w)
    if not have:
        return np.zeros(0, np.int8), status
    return _traceback(isb_s, isb_t, best_tb, best_base, best_klo, Ls, Lt), status


@njit
def _traceback(isb_s, isb_t, tb, base_L, klo, Ls, Lt):
    """Moves from the end back to (0, 0): F cells follow the stored moves (``tb[base_L[x] + c]``);
    inside a run (G) the path goes diagonally until it reaches a cut, where it is back in F."""
    x = Ls
    y = Lt
    rev = np.empty(x + y, np.int8)
    k = 0
    in_run = False
    while x > 0 or y > 0:
        if in_run:
            rev[k] = MOVE_MATCH
            x -= 1
            y -= 1
            in_run = not (isb_s[x] and isb_t[y])
        else:
            move = MOVE_INS if x == 0 else tb[base_L[x] + y - x - klo]
            if move == MOVE_MATCH:
                in_run = True
                continue
            if move == MOVE_DEL:
                rev[k] = MOVE_DEL
                x -= 1
            else:
                rev[k] = MOVE_INS
                y -= 1
        k += 1
    return rev[:k][::-1].copy()


@njit
def chunks_from_moves(moves_M, sym_s, tok_s, isb_s, sym_t, tok_t, isb_t, elen_s, elen_t,
                      s_chunk, t_chunk, cs0, cs1, ct0, ct1, c_role, c_adj):
    """Minimal chunks between consecutive cuts of each matched run; returns the chunk count."""
    x = 0
    y = 0
    nc = 0
    in_run = False
    have_cut = False
    cx = 0
    cy = 0
    end_x = -1   # where the previous chunk ended (for c_adj)
    end_y = -1
    for q in range(moves_M.size):
        mv = moves_M[q]
        if mv == MOVE_MATCH:
            if not in_run:
                in_run = True
                have_cut = isb_s[x] and isb_t[y]
                cx = x
                cy = y
            x += 1
            y += 1
            if isb_s[x] and isb_t[y]:
                if have_cut:
                    nc = emit_chunk(nc, tok_s[cx], tok_s[x - 1] + 1, tok_t[cy], tok_t[y - 1] + 1,
                                    sym_s[cx] >= ROLE_SYMBOL_BASE, cx == end_x and cy == end_y,
                                    elen_s, elen_t, s_chunk, t_chunk, cs0, cs1, ct0, ct1,
                                    c_role, c_adj)
                    end_x = x
                    end_y = y
                have_cut = True
                cx = x
                cy = y
        else:
            in_run = False
            if mv != MOVE_INS:
                x += 1
            if mv != MOVE_DEL:
                y += 1
    return nc
