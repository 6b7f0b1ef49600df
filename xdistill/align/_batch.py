"""The batched Numba kernel: one row per ``prange`` iteration (exact path or DP path).

Legend: B rows, Ts / Tt padded student / teacher tokens, C chunks (per-row upper bound
``min(len_s, len_t)``), V vocabulary.

Per row: effective lengths (phantom bytes removed) -> lengths and texts in the comparison space
(lossy pairs: ASCII-lower-cased, whitespace removed) -> exact walk when the texts are equal
(``method`` auto/exact) or the anchored banded DP otherwise -> optional "space" merge -> transparent
tokens attached -> chunk spans, exact flags, coverage. Tokens beyond a row's length are padding:
never read, chunk id -1. Row problems the caller must report go to ``status_B``.

Caching: only :func:`align_kernel` is compiled with ``cache=True``; its cached machine code
contains every helper it calls. Numba keys that cache on the kernel's own file only, so an edit to
a helper module would silently reuse stale code; :func:`_key_cache_on_all_sources` adds the
modification times and sizes of all kernel source files to the key.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
from numba import njit, prange

from xdistill.align._anchor import anchored_path
from xdistill.align._common import (attach_transparent, bytes_equal, effective_lengths,
                                    lead_space, merge_space, normalized_lengths, text_bytes)
from xdistill.align._dp import STATUS_OK, chunks_from_moves, symbols
from xdistill.align._exact import exact_walk

METHOD_AUTO = 0
METHOD_EXACT = 1
METHOD_DP = 2
ROW_OK = 0
ROW_DP_CAPPED = 1          # DP band hit max_cells before the optimum was proven (still valid)
ROW_DP_TOO_BIG = 2         # a gap's narrowest DP band exceeds max_cells: gap left unaligned
ROW_PHANTOM_S = 3          # student phantom bytes run past the row's text
ROW_PHANTOM_T = 4
ROW_TEXT_DIFFERS = 5       # method="exact" but the texts differ
KERNEL_SOURCES = ("_common.py", "_exact.py", "_dp.py", "_anchor.py", "_batch.py")


@njit(cache=True, parallel=True)
def align_kernel(s_ids_BTs, s_len_B, t_ids_BTt, t_len_B, s_off, s_data, s_roles, t_off, t_data,
                 t_roles, s_ph_BTs, t_ph_BTt, fold, method, space, band, max_cells, anchor_k,
                 s_chunk_BTs, t_chunk_BTt, cs0_BC, cs1_BC, ct0_BC, ct1_BC, cvalid_BC, cexact_BC,
                 n_chunks_B, s_cov_B, t_cov_B, used_dp_B, status_B):
    """Align every row; output arrays are pre-allocated by the caller (chunk arrays zeroed)."""
    for b in prange(s_ids_BTs.shape[0]):
        status_B[b] = _align_row(
            s_ids_BTs[b], s_len_B[b], t_ids_BTt[b], t_len_B[b], s_off, s_data, s_roles,
            t_off, t_data, t_roles, s_ph_BTs[b], t_ph_BTt[b], fold, method, space, band, max_cells,
            anchor_k, s_chunk_BTs[b], t_chunk_BTt[b], cs0_BC[b], cs1_BC[b], ct0_BC[b],
            ct1_BC[b], cvalid_BC[b], cexact_BC[b], n_chunks_B, s_cov_B, t_cov_B, used_dp_B, b)


@njit(cache=True)
def align_kernel_serial(s_ids_BTs, s_len_B, t_ids_BTt, t_len_B, s_off, s_data, s_roles, t_off,
                        t_data, t_roles, s_ph_BTs, t_ph_BTt, fold, method, space, band, max_cells,
                        anchor_k, s_chunk_BTs, t_chunk_BTt, cs0_BC, cs1_BC, ct0_BC, ct1_BC,
                        cvalid_BC, cexact_BC, n_chunks_B, s_cov_B, t_cov_B, used_dp_B, status_B):
    """:func:`align_kernel` on the calling thread only: no numba threading layer is started.

    Used in forked processes (data-loader workers): GNU OpenMP, numba's default threading layer
    here, is not fork-safe, and a parent whose torch already ran OpenMP regions (any model load or
    matmul) makes a forked child that starts a parallel region wait forever."""
    for b in range(s_ids_BTs.shape[0]):
        status_B[b] = _align_row(
            s_ids_BTs[b], s_len_B[b], t_ids_BTt[b], t_len_B[b], s_off, s_data, s_roles,
            t_off, t_data, t_roles, s_ph_BTs[b], t_ph_BTt[b], fold, method, space, band, max_cells,
            anchor_k, s_chunk_BTs[b], t_chunk_BTt[b], cs0_BC[b], cs1_BC[b], ct0_BC[b],
            ct1_BC[b], cvalid_BC[b], cexact_BC[b], n_chunks_B, s_cov_B, t_cov_B, used_dp_B, b)


@njit
def _align_row(ids_s, n, ids_t, m, s_off, s_data, s_roles, t_off, t_data, t_roles, ph_s, ph_t,
               fold, method, space, band, max_cells, anchor_k, s_chunk, t_chunk, cs0, cs1, ct0,
               ct1, cvalid, cexact, n_chunks_B, s_cov_B, t_cov_B, used_dp_B, b):
    s_chunk[:] = -1
    t_chunk[:] = -1
    n_chunks_B[b] = 0
    s_cov_B[b] = 1.0 if n == 0 else 0.0
    t_cov_B[b] = 1.0 if m == 0 else 0.0
    used_dp_B[b] = False
    elen_s, tot_s = effective_lengths(ids_s, n, s_off, s_roles, ph_s)
    if tot_s < 0:
        return ROW_PHANTOM_S
    elen_t, tot_t = effective_lengths(ids_t, m, t_off, t_roles, ph_t)
    if tot_t < 0:
        return ROW_PHANTOM_T
    nlen_s, tot_s = normalized_lengths(ids_s, n, s_off, s_data, elen_s, fold)
    nlen_t, tot_t = normalized_lengths(ids_t, m, t_off, t_data, elen_t, fold)
    cap = min(n, m)
    c_role = np.zeros(cap, np.bool_)
    c_adj = np.zeros(cap, np.bool_)
    status = ROW_OK
    use_dp = method == METHOD_DP
    if not use_dp:
        same = tot_s == tot_t and bytes_equal(
            text_bytes(ids_s, n, s_off, s_data, elen_s, tot_s, fold),
            text_bytes(ids_t, m, t_off, t_data, elen_t, tot_t, fold))
        if not same:
            if method == METHOD_EXACT:
                return ROW_TEXT_DIFFERS
            use_dp = True
    if use_dp:
        used_dp_B[b] = True
        sym_s, tok_s, isb_s = symbols(ids_s, n, s_off, s_data, s_roles, elen_s, nlen_s, fold)
        sym_t, tok_t, isb_t = symbols(ids_t, m, t_off, t_data, t_roles, elen_t, nlen_t, fold)
        moves, dp_status = anchored_path(sym_s, isb_s, sym_t, isb_t, band, max_cells, anchor_k)
        if dp_status != STATUS_OK:
            status = ROW_DP_CAPPED if dp_status == 1 else ROW_DP_TOO_BIG
        nc = chunks_from_moves(moves, sym_s, tok_s, isb_s, sym_t, tok_t, isb_t, nlen_s,
                               nlen_t, s_chunk, t_chunk, cs0, cs1, ct0, ct1, c_role, c_adj)
    else:
        nc = exact_walk(ids_s, n, nlen_s, s_roles, ids_t, m, nlen_t, t_roles, s_chunk, t_chunk,
                        cs0, cs1, ct0, ct1, c_role, c_adj)
    if space:
        nc = merge_space(nc, lead_space(ids_s, n, s_off, s_data, elen_s, fold),
                         lead_space(ids_t, m, t_off, t_data, elen_t, fold), s_chunk[:n],
                         t_chunk[:m], cs0, cs1, ct0, ct1, c_role, c_adj)
    trust = not fold and not ph_s[:n].any() and not ph_t[:m].any()
    _finish_row(nc, ids_s, n, nlen_s, ids_t, m, nlen_t, s_off, s_data, t_off, t_data, c_role,
                trust, s_chunk, t_chunk, cs0, cs1, ct0, ct1, cvalid, cexact, n_chunks_B, s_cov_B,
                t_cov_B, b)
    return status


@njit
def _finish_row(nc, ids_s, n, elen_s, ids_t, m, elen_t, s_off, s_data, t_off, t_data, c_role,
                trust, s_chunk, t_chunk, cs0, cs1, ct0, ct1, cvalid, cexact, n_chunks_B, s_cov_B,
                t_cov_B, b):
    """Attach transparent tokens, recompute spans from token ids, set exact flags and coverage.

    A text chunk's bytes are identical on both sides, so with no case folding and no phantom
    prefix (``trust``) a 1:1 text chunk is exact without reading the tables."""
    attach_transparent(elen_s, s_chunk[:n])
    attach_transparent(elen_t, t_chunk[:m])
    _spans(s_chunk, n, cs0, cs1)
    _spans(t_chunk, m, ct0, ct1)
    for k in range(nc):
        cvalid[k] = True
        ex = False
        if not c_role[k] and cs1[k] - cs0[k] == 1 and ct1[k] - ct0[k] == 1:
            ex = trust or _same_token_bytes(s_off, s_data, ids_s[cs0[k]], t_off, t_data,
                                            ids_t[ct0[k]])
        cexact[k] = ex
    n_chunks_B[b] = nc
    if n > 0:
        s_cov_B[b] = np.count_nonzero(s_chunk[:n] >= 0) / n
    if m > 0:
        t_cov_B[b] = np.count_nonzero(t_chunk[:m] >= 0) / m


@njit
def _spans(chunk_T, n, c0, c1):
    prev = -1
    for i in range(n):
        k = chunk_T[i]
        if k >= 0:
            if k != prev:
                c0[k] = i
                prev = k
            c1[k] = i + 1


@njit(inline="always")
def _same_token_bytes(s_off, s_data, a, t_off, t_data, c):
    la = s_off[a + 1] - s_off[a]
    if la != t_off[c + 1] - t_off[c] or la == 0:
        return False
    pa = s_off[a]
    pc = t_off[c]
    for q in range(la):
        if s_data[pa + q] != t_data[pc + q]:
            return False
    return True


def kernel_sources_stamp() -> tuple:
    """``(name, mtime, size)`` of each source file whose code ends up in :func:`align_kernel`."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = []
    for name in KERNEL_SOURCES:
        st = os.stat(os.path.join(here, name))
        out.append((name, st.st_mtime, st.st_size))
    return tuple(out)


def _key_cache_on_all_sources(dispatcher) -> None:
    """Make the on-disk cache of ``dispatcher`` depend on every kernel source file (numba
    internals: ``_cache._cache_file._source_stamp``, checked by a test)."""
    try:
        cache_file = dispatcher._cache._cache_file
        cache_file._source_stamp = (cache_file._source_stamp, kernel_sources_stamp())
    except AttributeError:   # pragma: no cover - numba internals moved
        warnings.warn("xdistill.align: cannot key the numba cache on all kernel sources; after "
                      "editing xdistill/align/_*.py delete xdistill/align/__pycache__",
                      RuntimeWarning, stacklevel=2)


_key_cache_on_all_sources(align_kernel)
_key_cache_on_all_sources(align_kernel_serial)
