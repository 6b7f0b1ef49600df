"""Public aligner API: :func:`align_batch`, :func:`align_pair`, :class:`AlignmentResult`.

Legend: B rows, Ts / Tt padded student / teacher tokens, C chunks (padded per batch), V vocab.

Definitions (docs/architecture.md §4). Each side's *text* is the concatenation of its text
tokens' bytes (``TokenByteTable``) minus their *phantom bytes*: bytes at the start of a token
that are not in the text, e.g. the dummy-prefix space a SentencePiece tokenizer puts on the
first token of the text and (legacy SentencePiece) on the first token after each special token
written in the text. They are given per token (``s_phantom_BTs``, e.g. ``Encoding.phantom_T``)
or, the older form, per row (``s_phantom_B``: the row's phantom prefix, i.e. phantom bytes at
token 0). A count larger than its token carries on into the next text tokens. A *chunk* is a
pair of contiguous token spans whose bytes are identical; chunks are minimal (no common token
boundary strictly inside), disjoint, ordered, and only valid chunks get ids ``0..n-1``. Tokens outside chunks (padding, role tokens without a
partner, regions where the texts differ) have chunk id -1.

* ``method="auto"``: the exact O(n+m) path when the two texts are byte-identical, otherwise the
  banded chunk DP (``used_dp_B``). ``"exact"`` raises when a row's texts differ; ``"dp"``
  always runs the DP.
* Role tokens (``roles_V != ROLE_TEXT``) pair with a role token of the same role at the
  corresponding place (1:1 chunk, never exact); unpaired ones stay unaligned.
* Lossy pairs (either ``table.lossy``, e.g. uncased WordPiece, which lower-cases, strips accents
  and does not represent whitespace): both paths compare the texts in a *comparison space* where
  ASCII letters are lower-cased and ASCII whitespace (space, \t, \n, \v, \f, \r) is removed
  on both sides. Token lengths, cuts and minimality are measured in that space, so whitespace
  present on one side only is absorbed (" World" pairs with "world"; a whitespace-only token
  is transparent and joins the next, else the previous, aligned chunk). Relaxed invariant for
  lossy pairs: each valid text chunk's bytes are equal *after normalisation* (ASCII lower case +
  whitespace removal); lossless pairs keep the strict one (identical bytes). Non-ASCII case and
  accents are not folded (such bytes stay unaligned, e.g. "café" vs BERT's "cafe").
* DP path: the common prefix (to its last common token boundary) walked, unique K-gram anchors
  (``dp_anchor``; also a common suffix of at least K symbols) matched, and on the gaps in between
  a banded DP that maximises the bytes inside chunks (then the paired role tokens); on ties
  unaligned text goes to the end, so an edited or truncated row pairs its tokens in place
  (``_anchor``, ``_dp``). Guarantee: with nothing anchored (``dp_anchor=0``, or rows shorter
  than K symbols) the chunks cover the most bytes possible among chunkings that keep the
  common-prefix chunks; with anchors, each gap is optimal.
* ``chunks="space"``: adjacent minimal text chunks are merged unless the next chunk starts with
  ASCII whitespace (tokenkit's "space" variant); role chunks are never merged.
* ``chunk_exact_BC``: 1:1 text chunk whose two tokens have identical table bytes (so a
  SentencePiece first token ``"▁Hi"`` with a phantom space is not exact against ``"Hi"``).
* Coverage: fraction of a row's non-padding tokens inside valid chunks (1.0 for an empty row).
* Zero-length text tokens join the chunk of the next (else previous) aligned text token.

Compiled with ``numba.njit(cache=True)``: the cache lives in ``xdistill/align/__pycache__`` or, if
that is not writable, in ``$NUMBA_CACHE_DIR`` (set it to a writable folder in read-only installs,
otherwise every new process recompiles for several seconds).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import numpy as np

from xdistill.errors import AlignmentError
from xdistill.tokenization.table import TokenByteTable

_METHODS = {"auto": 0, "exact": 1, "dp": 2}
_CHUNKS = ("minimal", "space")


@dataclass(frozen=True, eq=False)
class AlignmentResult:
    """Alignment of a batch (numpy arrays; see the module docstring for the definitions)."""

    # chunk id of each student token (-1 = unaligned or padding), int32 [B, Ts]
    s_chunk_BTs: np.ndarray
    # chunk id of each teacher token (-1 = unaligned or padding), int32 [B, Tt]
    t_chunk_BTt: np.ndarray
    # student token span of each chunk, end exclusive (0 on chunk padding), int32 [B, C]
    chunk_s_start_BC: np.ndarray
    chunk_s_end_BC: np.ndarray
    # teacher token span of each chunk, end exclusive (0 on chunk padding), int32 [B, C]
    chunk_t_start_BC: np.ndarray
    chunk_t_end_BC: np.ndarray
    # True on real chunks, False on per-row padding of the chunk axis, bool [B, C]
    chunk_valid_BC: np.ndarray
    # True on 1:1 text chunks whose two tokens have identical bytes, bool [B, C]
    chunk_exact_BC: np.ndarray
    # number of chunks per row, int32 [B]
    n_chunks_B: np.ndarray
    # fraction of non-padding student / teacher tokens inside valid chunks, float64 [B]
    s_coverage_B: np.ndarray
    t_coverage_B: np.ndarray
    # True where the row went through the DP path, bool [B]
    used_dp_B: np.ndarray

    @property
    def batch_size(self) -> int:
        return int(self.n_chunks_B.shape[0])

    def chunks(self, b: int) -> list[tuple[int, int, int, int, bool]]:
        """Row ``b``'s chunks as ``(s_start, s_end, t_start, t_end, exact)`` tuples."""
        return [(int(self.chunk_s_start_BC[b, k]), int(self.chunk_s_end_BC[b, k]),
                 int(self.chunk_t_start_BC[b, k]), int(self.chunk_t_end_BC[b, k]),
                 bool(self.chunk_exact_BC[b, k])) for k in range(int(self.n_chunks_B[b]))]


def align_batch(s_ids_BTs, s_len_B, t_ids_BTt, t_len_B, s_table: TokenByteTable,
                t_table: TokenByteTable, *, s_phantom_B=None, t_phantom_B=None,
                s_phantom_BTs=None, t_phantom_BTt=None, chunks: str = "minimal",
                method: str = "auto", dp_band: int = 32, dp_max_cells: int = 1 << 26,
                dp_anchor: int = 32) -> AlignmentResult:
    """Align student and teacher tokenizations of the same texts, row by row (see module doc).

    ``s_ids_BTs``/``t_ids_BTt``: right-padded integer ids; ``s_len_B``/``t_len_B``: real lengths
    (tokens beyond are padding, never read). Phantom bytes (default none): per token,
    ``s_phantom_BTs``/``t_phantom_BTt`` (same shape as the ids; entries on padding are ignored),
    or per row, ``s_phantom_B``/``t_phantom_B`` (the row's phantom prefix, at token 0); at most
    one form per side. ``dp_band``: initial DP band half-width; ``dp_max_cells``: most traceback
    cells (bytes of memory per row in flight) one DP gap may use before settling for the banded
    result; ``dp_anchor``: length K of the unique exact K-gram anchors between which the DP runs,
    and the least length of a common suffix matched as one (0: no anchors, only the common
    prefix; see ``_anchor``).
    """
    if chunks not in _CHUNKS:
        raise AlignmentError(f"chunks must be one of {_CHUNKS}, got {chunks!r}")
    if method not in _METHODS:
        raise AlignmentError(f"method must be one of {tuple(_METHODS)}, got {method!r}")
    _check_table(s_table, "s_table")
    _check_table(t_table, "t_table")
    s_ids, s_len = _check_side(s_ids_BTs, s_len_B, s_table, "student", "s")
    t_ids, t_len = _check_side(t_ids_BTt, t_len_B, t_table, "teacher", "t")
    B = s_ids.shape[0]
    if t_ids.shape[0] != B:
        raise AlignmentError(f"batch sizes differ: student ids have {B} rows, teacher ids "
                             f"{t_ids.shape[0]}")
    s_ph = _check_phantom(s_phantom_B, s_phantom_BTs, s_ids.shape, s_len, "s")
    t_ph = _check_phantom(t_phantom_B, t_phantom_BTt, t_ids.shape, t_len, "t")
    C = max(1, int(np.minimum(s_len, t_len).max(initial=0)))
    out = _allocate(B, s_ids.shape[1], t_ids.shape[1], C)
    status_B = np.zeros(B, np.int8)
    fold = bool(s_table.lossy or t_table.lossy)
    kernel = _kernel()
    kernel(s_ids, s_len, t_ids, t_len, s_table.offsets_V1, s_table.data, s_table.roles_V,
           t_table.offsets_V1, t_table.data, t_table.roles_V, s_ph, t_ph, fold,
           _METHODS[method], chunks == "space", int(max(1, dp_band)), int(dp_max_cells),
           int(max(0, dp_anchor)), *out, status_B)
    _report_status(status_B, s_ids, s_len, t_ids, t_len, s_table, t_table, s_ph, t_ph)
    s_chunk, t_chunk, cs0, cs1, ct0, ct1, cvalid, cexact, n_chunks, s_cov, t_cov, used_dp = out
    Cn = int(n_chunks.max(initial=0))
    return AlignmentResult(s_chunk, t_chunk, cs0[:, :Cn], cs1[:, :Cn], ct0[:, :Cn], ct1[:, :Cn],
                           cvalid[:, :Cn], cexact[:, :Cn], n_chunks, s_cov, t_cov, used_dp)


def align_pair(s_ids, t_ids, s_table: TokenByteTable, t_table: TokenByteTable, *,
               s_phantom=0, t_phantom=0, chunks: str = "minimal", method: str = "auto",
               **kwargs) -> AlignmentResult:
    """:func:`align_batch` for one unpadded pair of id sequences (a result with ``B = 1``).

    ``s_phantom``/``t_phantom``: an int (the phantom prefix, at token 0) or one count per token
    (e.g. ``Encoding.phantom_T``)."""
    s = _as_int_array(s_ids, "s_ids", 1)
    t = _as_int_array(t_ids, "t_ids", 1)
    ph = {}
    for side, arr, val in (("s", s, s_phantom), ("t", t, t_phantom)):
        if np.ndim(val) == 0:
            ph[f"{side}_phantom_B"] = np.array([val])
        else:
            ph[f"{side}_phantom_BT{side}"] = _as_int_array(val, f"{side}_phantom", 1)[None]
    return align_batch(s[None], np.array([s.size]), t[None], np.array([t.size]), s_table,
                       t_table, chunks=chunks, method=method, **ph, **kwargs)


_THREAD_CAP = [0]  # 0 = numba's default pool size
# True in a process created by fork() from one that imported this module (data-loader workers)
_FORKED = [False]


def _mark_forked() -> None:
    _FORKED[0] = True


os.register_at_fork(after_in_child=_mark_forked)


def set_align_threads(n: int) -> int:
    """Cap the aligner's numba worker threads at ``n`` (>= 1, at most numba's pool size); returns
    the number in effect. The trainers call it with ``train.num_threads``: numba's default pool
    has one thread per core, and with several training processes per host (or torch using the
    same cores) the oversubscribed, spinning pools made small CPU steps ~4x slower here.

    The cap is applied lazily, by :func:`align_batch` in the process that aligns.
    """
    # deferred: numba (slow import; `import xdistill.align` stays numpy-only)
    import numba

    _THREAD_CAP[0] = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
    return _THREAD_CAP[0]


def _kernel():
    """The compiled kernel for this process: the serial one in a forked process or under a
    one-thread cap, else the ``prange`` one with the thread cap applied.

    Fork safety: numba's threading layer here is GNU OpenMP, which is not fork-safe. Once the
    parent's torch has run an OpenMP region (loading a model is enough), a forked child that
    starts a numba parallel region waits forever on threads that do not exist. Forked children
    (data-loader workers) therefore never start numba's threading layer; they align on their own
    thread, and the loader's worker processes provide the parallelism.
    """
    # deferred: numba, via align._batch (`import xdistill.align` stays numpy-only)
    from xdistill.align._batch import align_kernel, align_kernel_serial

    if _FORKED[0] or _THREAD_CAP[0] == 1:
        return align_kernel_serial
    if _THREAD_CAP[0]:
        # deferred: numba (slow import; `import xdistill.align` stays numpy-only)
        import numba

        if numba.get_num_threads() != _THREAD_CAP[0]:
            numba.set_num_threads(_THREAD_CAP[0])
    return align_kernel


def kernels_cached() -> bool:
    """Whether numba's on-disk cache holds compiled aligner kernels for the current sources. When
    it does not (the first run after an install or an edit of ``xdistill/align``), the first
    alignment in a process compiles them: about 30 s on 2 CPU cores. True when unknown."""
    # deferred: numba, via align._batch (`import xdistill.align` stays numpy-only)
    from xdistill.align._batch import align_kernel, align_kernel_serial

    try:
        return all(bool(k._cache._cache_file._load_index())
                   for k in (align_kernel, align_kernel_serial))
    except Exception:   # noqa: BLE001 - numba internals moved: say nothing
        return True


def compile_kernels() -> bool:
    """Compile both aligner kernels into numba's on-disk cache now (a no-op when cached); returns
    whether they were compiled. ``make test`` calls it before starting its test processes, which
    would otherwise each compile them at once on a fresh install."""
    if kernels_cached():
        return False
    roles = np.zeros(3, dtype=np.int8)
    table = TokenByteTable(np.array([0, 1, 2, 4], dtype=np.int64),
                           np.frombuffer(b"abab", dtype=np.uint8).copy(), roles)
    saved = _THREAD_CAP[0]
    try:
        for cap in (1, 0):   # the serial kernel, then the prange one
            _THREAD_CAP[0] = cap
            align_pair([2], [0, 1], table, table)
    finally:
        _THREAD_CAP[0] = saved
    return True


def _allocate(B: int, Ts: int, Tt: int, C: int) -> tuple:
    return (np.empty((B, Ts), np.int32), np.empty((B, Tt), np.int32),
            np.zeros((B, C), np.int32), np.zeros((B, C), np.int32), np.zeros((B, C), np.int32),
            np.zeros((B, C), np.int32), np.zeros((B, C), np.bool_), np.zeros((B, C), np.bool_),
            np.zeros(B, np.int32), np.zeros(B, np.float64), np.zeros(B, np.float64),
            np.zeros(B, np.bool_))


def _check_table(table, name: str) -> None:
    if not isinstance(table, TokenByteTable):
        raise AlignmentError(f"{name} must be a TokenByteTable, got {type(table).__name__}")


def _as_int_array(x, name: str, ndim: int) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        if arr.size == 0 and ndim == 1 and arr.dtype == np.float64:   # np.array([]) is float
            arr = arr.astype(np.int64)
        else:
            raise AlignmentError(f"{name} must be an integer array, got dtype {arr.dtype}")
    if arr.ndim != ndim:
        raise AlignmentError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise AlignmentError(f"{name} has values beyond int64")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _check_side(ids, lens, table: TokenByteTable, who: str, p: str):
    ids = _as_int_array(ids, f"{p}_ids_BT{p}", 2)
    lens = _as_int_array(lens, f"{p}_len_B", 1)
    B, T = ids.shape
    if lens.shape[0] != B:
        raise AlignmentError(f"{p}_len_B has {lens.shape[0]} entries for {B} {who} rows")
    bad = np.flatnonzero((lens < 0) | (lens > T))
    if bad.size:
        b = int(bad[0])
        raise AlignmentError(f"{who} row {b}: length {int(lens[b])} outside [0, {T}] "
                             f"(the padded width)")
    V = table.vocab_size
    real = np.arange(T)[None, :] < lens[:, None]
    oob = real & ((ids < 0) | (ids >= V))
    if oob.any():
        b, i = (int(v) for v in np.argwhere(oob)[0])
        raise AlignmentError(
            f"{who} row {b}, token {i}: id {int(ids[b, i])} outside the table's vocabulary "
            f"[0, {V}) (ids and table from different tokenizers?)")
    return ids, lens


def _check_phantom(ph_B, ph_BT, shape: tuple, lens: np.ndarray, p: str) -> np.ndarray:
    """Per-token phantom counts, int64 ``[B, T]``, or ``[B, 1]`` for the per-row form (token 0;
    the kernel reads no further)."""
    B, T = shape
    name_B, name_BT = f"{p}_phantom_B", f"{p}_phantom_BT{p}"
    if ph_B is not None and ph_BT is not None:
        raise AlignmentError(f"give {name_B} or {name_BT}, not both")
    out = np.zeros((B, 1), np.int64)
    if ph_BT is not None:
        arr = _as_int_array(ph_BT, name_BT, 2)
        if arr.shape != (B, T):
            raise AlignmentError(f"{name_BT} has shape {arr.shape}, the ids {(B, T)}")
        real = (np.arange(T)[None, :] < lens[:, None]) & (arr < 0)
        if real.any():
            b, i = (int(v) for v in np.argwhere(real)[0])
            raise AlignmentError(f"{name_BT}[{b}, {i}] = {int(arr[b, i])} is negative")
        return arr
    if ph_B is None:
        return out
    arr = _as_int_array(ph_B, name_B, 1)
    if arr.shape[0] != B:
        raise AlignmentError(f"{name_B} has {arr.shape[0]} entries for {B} rows")
    neg = np.flatnonzero(arr < 0)
    if neg.size:
        raise AlignmentError(f"{name_B}[{int(neg[0])}] = {int(arr[neg[0]])} is negative")
    empty = np.flatnonzero((arr > 0) & (lens == 0))
    if empty.size:
        who = "student" if p == "s" else "teacher"
        b = int(empty[0])
        raise AlignmentError(f"{who} row {b}: phantom prefix of {int(arr[b])} bytes is longer "
                             f"than the row's text")
    out[:, 0] = arr
    return out


def _report_status(status_B, s_ids, s_len, t_ids, t_len, s_table, t_table, s_ph, t_ph) -> None:
    """Turn per-row kernel statuses into errors (bad input) or warnings (DP limits)."""
    # deferred: numba, via align._batch (`import xdistill.align` stays numpy-only)
    from xdistill.align._batch import (ROW_DP_CAPPED, ROW_DP_TOO_BIG, ROW_PHANTOM_S,
                                       ROW_PHANTOM_T, ROW_TEXT_DIFFERS)

    if not status_B.any():
        return
    for code, side, lens, ph in ((ROW_PHANTOM_S, "student", s_len, s_ph),
                                 (ROW_PHANTOM_T, "teacher", t_len, t_ph)):
        rows = np.flatnonzero(status_B == code)
        if rows.size:
            b = int(rows[0])
            row = ph[b, :lens[b]]
            if not row[1:].any():
                raise AlignmentError(f"{side} row {b}: phantom prefix of {int(row[0])} bytes is "
                                     f"longer than the row's text")
            raise AlignmentError(f"{side} row {b}: phantom bytes ({int(row.sum())} in all, at "
                                 f"tokens {np.flatnonzero(row).tolist()[:8]}) run past the "
                                 f"row's text")
    rows = np.flatnonzero(status_B == ROW_TEXT_DIFFERS)
    if rows.size:
        b = int(rows[0])
        where = _first_difference(s_ids[b, :s_len[b]], t_ids[b, :t_len[b]], s_table, t_table,
                                  s_ph[b, :s_len[b]], t_ph[b, :t_len[b]])
        raise AlignmentError(f"row {b}: method='exact' but the student and teacher texts differ "
                             f"({where}); use method='auto' or 'dp'")
    for code, what in ((ROW_DP_TOO_BIG, "have regions left unaligned: the DP of a gap between "
                                        "anchors needs more than dp_max_cells"),
                       (ROW_DP_CAPPED, "aligned with a DP band limited by dp_max_cells "
                                       "(valid chunks, possibly fewer than optimal)")):
        rows = np.flatnonzero(status_B == code)
        if rows.size:
            warnings.warn(f"align: rows {rows[:10].tolist()} {what}", RuntimeWarning,
                          stacklevel=3)


def _first_difference(s_ids, t_ids, s_table, t_table, s_ph_T, t_ph_T) -> str:
    def text(ids, table, ph_T):
        out, rem = [], 0
        ph = [int(v) for v in ph_T] + [0] * (len(ids) - len(ph_T))   # row form: token 0 only
        for i, p in zip(ids, ph):
            rem += p
            if table.roles_V[i] == 0:
                piece = table.token_bytes(int(i))
                take = min(rem, len(piece))
                rem -= take
                out.append(piece[take:])
        return b"".join(out)

    a, c = text(s_ids, s_table, s_ph_T), text(t_ids, t_table, t_ph_T)
    q = next((k for k in range(min(len(a), len(c))) if a[k] != c[k]), min(len(a), len(c)))
    return (f"first difference at text byte {q}: student {a[q:q + 12]!r} vs teacher "
            f"{c[q:q + 12]!r}; lengths {len(a)} and {len(c)}")
