"""Vectorised matching of token byte strings between two vocabularies (numpy only).

Tokens are compared by the bytes they contribute to the decoded text (``TokenByteTable``), never by
their raw vocabulary strings, so GPT-2's ``Ġhello`` and SentencePiece's ``▁hello`` (both
``b" hello"``) match. Matching sorts fixed-width byte keys: tokens are bucketed by byte length
``L``; inside a bucket each token becomes one ``S{L}`` key (numpy compares fixed-width byte strings
with memcmp; within one length bucket trailing NUL bytes cannot make two different strings equal),
the reference keys are sorted once and the query keys found with ``searchsorted``. Cost is
``O(total bytes + V log V)``, memory proportional to the total number of bytes.

Legend: ``Vs``/``Vt`` student/teacher vocabularies, ``N`` number of matched pairs, ``Q``/``R``
query/reference id lists.
"""

from __future__ import annotations

import numpy as np

from xdistill.tokenization.table import ROLE_TEXT, TokenByteTable


def text_ids(table: TokenByteTable) -> np.ndarray:
    """Ids of ordinary (role ``text``) tokens that contribute at least one byte (int64)."""
    mask = (table.roles_V == ROLE_TEXT) & (table.lengths_V > 0)
    return np.flatnonzero(mask).astype(np.int64)


def _keys(table: TokenByteTable, ids_Q: np.ndarray, length: int) -> np.ndarray:
    """Fixed-width ``S{length}`` keys of tokens ``ids_Q`` (all of byte length ``length``)."""
    idx_QL = table.offsets_V1[ids_Q][:, None] + np.arange(length, dtype=np.int64)[None, :]
    return np.ascontiguousarray(table.data[idx_QL]).view(f"S{length}")[:, 0]


def match_bytes(q_table: TokenByteTable, q_ids_Q: np.ndarray,
                r_table: TokenByteTable, r_ids_R: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All pairs ``(q, r)`` with ``bytes(q) == bytes(r)``, ``q`` from ``q_ids_Q``, ``r`` from ``r_ids_R``.

    Returns ``(q_N, r_N)`` (int64), sorted by ``q`` then ``r``. Zero-length tokens never match.
    A query token equal to several reference tokens (e.g. SentencePiece ``▁`` and ``<0x20>`` are both
    ``b" "``) yields one pair per reference token.
    """
    q_ids_Q = np.asarray(q_ids_Q, dtype=np.int64)
    r_ids_R = np.asarray(r_ids_R, dtype=np.int64)
    q_len_Q = q_table.lengths_V[q_ids_Q]
    r_len_R = r_table.lengths_V[r_ids_R]
    out_q, out_r = [], []
    for length in np.intersect1d(np.unique(q_len_Q), np.unique(r_len_R)):
        if length == 0:
            continue
        qi = q_ids_Q[q_len_Q == length]
        ri = r_ids_R[r_len_R == length]
        qk = _keys(q_table, qi, int(length))
        rk = _keys(r_table, ri, int(length))
        order = np.argsort(rk, kind="stable")
        rk_sorted = rk[order]
        lo = np.searchsorted(rk_sorted, qk, side="left")
        hi = np.searchsorted(rk_sorted, qk, side="right")
        count = hi - lo
        if not count.any():
            continue
        q_rep = np.repeat(qi, count)
        # position inside each query's run of equal reference keys: 0..count-1
        run_start = np.repeat(np.cumsum(count) - count, count)
        within = np.arange(q_rep.size, dtype=np.int64) - run_start
        r_rep = ri[order[np.repeat(lo, count) + within]]
        out_q.append(q_rep)
        out_r.append(r_rep)
    if not out_q:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    q_N = np.concatenate(out_q)
    r_N = np.concatenate(out_r)
    order = np.lexsort((r_N, q_N))
    return q_N[order], r_N[order]


def lookup_bytes(table: TokenByteTable, pieces: list[bytes], preferred_V: np.ndarray | None = None
                 ) -> np.ndarray:
    """Id of the token whose bytes equal each of ``pieces`` (-1 when none), vectorised.

    Where several tokens share the bytes, the one with the smallest ``preferred_V`` rank wins
    (default: the smallest id).
    """
    query = TokenByteTable.from_bytes_list(list(pieces))
    q_N, r_N = match_bytes(query, np.arange(len(pieces)), table, text_ids(table))
    out = np.full(len(pieces), -1, dtype=np.int64)
    q_N, r_N = resolve_one_per_row(q_N, r_N, preferred_V)
    out[q_N] = r_N
    return out


def resolve_one_per_row(q_N: np.ndarray, r_N: np.ndarray, preferred_R: np.ndarray | None = None
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Keep one pair per query id: the reference id with the smallest preference rank, then id."""
    if q_N.size == 0:
        return q_N, r_N
    rank = r_N if preferred_R is None else preferred_R[r_N]
    order = np.lexsort((r_N, rank, q_N))
    q_N, r_N = q_N[order], r_N[order]
    first = np.ones(q_N.size, dtype=bool)
    first[1:] = q_N[1:] != q_N[:-1]
    return q_N[first], r_N[first]


def byte_token_map(table: TokenByteTable, preferred_V: np.ndarray | None = None) -> np.ndarray:
    """``[256]`` int64: the id of the token that is exactly the single byte ``b`` (-1 if none).

    Byte-level BPE vocabularies have all 256; SentencePiece with byte fallback has ``<0xNN>``
    (its table bytes are the raw byte); WordPiece has only some ASCII characters.
    """
    return lookup_bytes(table, [bytes([b]) for b in range(256)], preferred_V)
