"""DP path: banded edit-distance alignment of two symbol strings, and chunks from matched runs.

Legend: n / m student / teacher tokens of one row; Ls / Lt symbols; W band width; M moves.

Symbols: each text byte is a symbol (for lossy pairs, ``fold``: whitespace bytes are dropped and
the rest ASCII-lower-cased, see ``api``), each role token one symbol ``256 + role`` that only
matches the same role. ``_anchor`` calls :func:`banded_dp` on the gaps between anchors. The edit
distance has unit costs (substitution = insertion = deletion = 1, match = 0). Cells ``(x, y)``
are restricted to the diagonal band ``min(0,D)-w <= y-x <= max(0,D)+w`` (``D = Lt-Ls``). A path
leaving the band costs at least ``|D| + 2w + 2``, so a banded optimum below that is the true
optimum; otherwise ``w`` doubles (up to the full matrix or ``max_cells`` traceback cells, after
which the banded alignment — valid, maybe suboptimal — is used and the row flagged).
Ties prefer the diagonal, then a deletion (student symbol skipped), then an insertion.

Chunks: along the path, a *run* is a maximal stretch of matches. Inside a run, a *cut* is a
position where both sides are at a token boundary; consecutive cuts of one run enclose a minimal
chunk. Everything outside chunks stays unaligned: mismatched text is never glued into a chunk.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from xdistill.align._common import ROLE_SYMBOL_BASE, emit_chunk, fold_ascii, is_space_byte

MOVE_MATCH = 0
MOVE_SUB = 1
MOVE_DEL = 2   # student symbol without partner
MOVE_INS = 3   # teacher symbol without partner
_INF = 1 << 30
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


@njit
def _band_fill(sym_s, sym_t, klo, W, tb_LW):
    """Fill the banded DP (cell (x, y) at row x, column y - x - klo); returns the final cost."""
    Ls = sym_s.size
    Lt = sym_t.size
    prev = np.full(W + 1, _INF, np.int64)   # one spare column avoids a bounds branch
    cur = np.full(W + 1, _INF, np.int64)
    for c in range(W):
        y = klo + c
        if 0 <= y <= Lt:
            prev[c] = y
            tb_LW[0, c] = MOVE_INS
    for x in range(1, Ls + 1):
        sx = sym_s[x - 1]
        for c in range(W):
            y = x + klo + c
            if y < 0 or y > Lt:
                cur[c] = _INF
                continue
            best = _INF
            move = MOVE_MATCH
            if y >= 1:
                best = prev[c] + (0 if sx == sym_t[y - 1] else 1)
            up = prev[c + 1] + 1
            if up < best:
                best = up
                move = MOVE_DEL
            if y >= 1 and c >= 1:
                left = cur[c - 1] + 1
                if left < best:
                    best = left
                    move = MOVE_INS
            cur[c] = best
            tb_LW[x, c] = move
        prev, cur = cur, prev
    return prev[Lt - Ls - klo]


@njit
def banded_dp(sym_s, sym_t, w0, max_cells):
    """Edit-distance path between two symbol strings; returns ``(moves_M, status)``."""
    Ls = sym_s.size
    Lt = sym_t.size
    D = Lt - Ls
    w = max(w0, 1)
    best_tb = np.zeros((1, 1), np.uint8)
    best_klo = 0
    have = False
    status = STATUS_OK
    while True:
        klo = max(min(0, D) - w, -Ls)
        khi = min(max(0, D) + w, Lt)
        W = khi - klo + 1
        if (Ls + 1) * W > max_cells:
            status = STATUS_CAPPED if have else STATUS_TOO_BIG
            break
        tb_LW = np.empty((Ls + 1, W), np.uint8)
        cost = _band_fill(sym_s, sym_t, klo, W, tb_LW)
        best_tb = tb_LW
        best_klo = klo
        have = True
        if (klo == -Ls and khi == Lt) or cost <= abs(D) + 2 * w + 1:
            break
        w *= 2
    if not have:
        return np.zeros(0, np.int8), status
    return _traceback(sym_s, sym_t, best_tb, best_klo), status


@njit
def _traceback(sym_s, sym_t, tb_LW, klo):
    x = sym_s.size
    y = sym_t.size
    rev = np.empty(x + y, np.int8)
    k = 0
    while x > 0 or y > 0:
        move = tb_LW[x, y - x - klo]
        if x == 0:
            move = MOVE_INS
        if move == MOVE_MATCH:
            rev[k] = MOVE_MATCH if sym_s[x - 1] == sym_t[y - 1] else MOVE_SUB
            x -= 1
            y -= 1
        elif move == MOVE_DEL:
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
