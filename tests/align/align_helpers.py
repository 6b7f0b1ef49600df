"""Synthetic tokenizations and an invariant checker for the aligner tests.

Legend: B rows, Ts / Tt padded student / teacher tokens, C chunks.

A *synthetic tokenizer* cuts a text's UTF-8 bytes at arbitrary positions (also inside characters,
like byte-fallback / byte-level BPE does) and inserts role tokens between pieces; the table is the
list of pieces plus one id per role. The invariant checker works from the definitions only.
"""

from __future__ import annotations

import numpy as np

from align_reference import RowAlignment, align_row_reference
from xdistill.tokenization.table import ROLE_BOS, ROLE_CHAT, ROLE_EOS, TokenByteTable

ROLES = (ROLE_BOS, ROLE_EOS, ROLE_CHAT)

# characters that stress byte alignment: emoji (4 bytes, ZWJ), CJK, combining marks, controls,
# whitespace runs, code punctuation, accents
SPICY = list("ab xyzABC  \t\n\r\x00\x1b{}()[];=_->é中文字🙂👍🏽‍️"
             "\u0301\u0308\u200b\u3000«»\"'#")


class Vocab:
    """A growing vocabulary of byte pieces; role tokens get fixed ids at the start."""

    def __init__(self, lossy: bool = False):
        self.pieces: list[bytes] = [b""] * len(ROLES)
        self.roles: list[int] = list(ROLES)
        self.index: dict[bytes, int] = {}
        self.lossy = lossy

    def role_id(self, role: int) -> int:
        return ROLES.index(role)

    def id(self, piece: bytes) -> int:
        if piece not in self.index:
            self.index[piece] = len(self.pieces)
            self.pieces.append(piece)
            self.roles.append(0)
        return self.index[piece]

    def table(self) -> TokenByteTable:
        return TokenByteTable.from_bytes_list(self.pieces, roles=self.roles, lossy=self.lossy)


def segment(vocab: Vocab, data: bytes, cuts, roles_at=None) -> list[int]:
    """Ids of ``data`` cut at byte positions ``cuts``; ``roles_at``: {byte pos: [roles]}."""
    roles_at = roles_at or {}
    bounds = sorted({0, len(data), *[c for c in cuts if 0 < c < len(data)]})
    ids = []
    for a, b in zip(bounds, bounds[1:] + [None]):
        ids += [vocab.role_id(r) for r in roles_at.get(a, [])]
        if b is not None:
            ids.append(vocab.id(data[a:b]))
    if not data:
        ids += [vocab.role_id(r) for r in roles_at.get(0, [])]
    return ids


def random_cuts(rng: np.random.Generator, n: int, p: float) -> list[int]:
    return [c for c in range(1, n) if rng.random() < p]


def pad(rows: list[list[int]], fill: int = 0) -> tuple[np.ndarray, np.ndarray]:
    T = max([len(r) for r in rows] + [1])
    ids = np.full((len(rows), T), fill, np.int64)
    for b, r in enumerate(rows):
        ids[b, :len(r)] = r
    return ids, np.array([len(r) for r in rows], np.int64)


def row_of(res, b: int, n: int, m: int) -> RowAlignment:
    """Row ``b`` of an AlignmentResult in the reference's format."""
    return RowAlignment(res.s_chunk_BTs[b, :n].tolist(), res.t_chunk_BTt[b, :m].tolist(),
                        res.chunks(b), bool(res.used_dp_B[b]), float(res.s_coverage_B[b]),
                        float(res.t_coverage_B[b]))


def assert_same(got: RowAlignment, ref: RowAlignment) -> None:
    assert got.chunks == ref.chunks
    assert got.s_chunk == ref.s_chunk
    assert got.t_chunk == ref.t_chunk
    assert got.used_dp == ref.used_dp
    assert abs(got.s_coverage - ref.s_coverage) < 1e-12
    assert abs(got.t_coverage - ref.t_coverage) < 1e-12


def compare_with_reference(res, s_rows, t_rows, s_table, t_table, s_ph=None, t_ph=None,
                           **kw) -> None:
    """Every row of ``res`` equals the pure-Python reference on that row."""
    for b, (s, t) in enumerate(zip(s_rows, t_rows)):
        ref = align_row_reference(s, t, s_table, t_table,
                                  s_phantom=0 if s_ph is None else _phantom_arg(s_ph[b], len(s)),
                                  t_phantom=0 if t_ph is None else _phantom_arg(t_ph[b], len(t)),
                                  **kw)
        assert_same(row_of(res, b, len(s), len(t)), ref)


def _phantom_arg(ph, n: int):
    """A row's phantom argument: an int, or per-token counts (trimmed to the row's length)."""
    return int(ph) if np.ndim(ph) == 0 else [int(v) for v in list(ph)[:n]]


def _eff_bytes(ids, table: TokenByteTable, phantom) -> list[bytes]:
    """Effective bytes per token: phantom bytes removed (``phantom``: an int at token 0, or per
    token; a count larger than its token carries on into the next text tokens)."""
    per_T = [int(phantom)] + [0] * len(ids) if np.ndim(phantom) == 0 else list(phantom)
    out, rem = [], 0
    for k, tid in enumerate(ids):
        rem += int(per_T[k])
        raw = table.token_bytes(int(tid)) if table.roles_V[tid] == 0 else b""
        take = min(rem, len(raw))
        rem -= take
        out.append(raw[take:])
    return out


def norm(b: bytes, on: bool) -> bytes:
    """The lossy comparison space: ASCII lower case (``bytes.lower`` folds ASCII only), no
    whitespace; the identity for lossless pairs."""
    return b"".join(b.lower().split()) if on else b


def check_invariants(res, b: int, s_ids, t_ids, s_table, t_table, s_ph=0, t_ph=0,
                     chunks: str = "minimal") -> None:
    """The definitions: identical bytes (lossless pairs) or bytes equal after ``norm`` (lossy
    pairs), contiguous ordered disjoint spans, minimality (in the comparison space), roles,
    padding never aligned, exact flags and coverage consistent."""
    n, m = len(s_ids), len(t_ids)
    folded = s_table.lossy or t_table.lossy
    sc, tc = res.s_chunk_BTs[b], res.t_chunk_BTt[b]
    assert np.all(sc[n:] == -1) and np.all(tc[m:] == -1), "padding must never be aligned"
    nc = int(res.n_chunks_B[b])
    assert res.chunk_valid_BC[b, :nc].all() and not res.chunk_valid_BC[b, nc:].any()
    assert set(sc[:n].tolist()) <= set(range(-1, nc)) and set(tc[:m].tolist()) <= set(range(-1, nc))
    sb, tb = _eff_bytes(s_ids, s_table, s_ph), _eff_bytes(t_ids, t_table, t_ph)
    prev_s = prev_t = 0
    for k in range(nc):
        s0, s1 = int(res.chunk_s_start_BC[b, k]), int(res.chunk_s_end_BC[b, k])
        t0, t1 = int(res.chunk_t_start_BC[b, k]), int(res.chunk_t_end_BC[b, k])
        assert prev_s <= s0 < s1 and prev_t <= t0 < t1, "chunks ordered, disjoint, non-empty"
        assert np.flatnonzero(sc[:n] == k).tolist() == list(range(s0, s1))
        assert np.flatnonzero(tc[:m] == k).tolist() == list(range(t0, t1))
        prev_s, prev_t = s1, t1
        s_roles = s_table.roles_V[np.asarray(s_ids[s0:s1])]
        t_roles = t_table.roles_V[np.asarray(t_ids[t0:t1])]
        if s_roles.any() or t_roles.any():
            assert s1 - s0 == 1 and t1 - t0 == 1 and s_roles[0] == t_roles[0], "role pair 1:1"
            assert not res.chunk_exact_BC[b, k]
            continue
        sbytes = [norm(x, folded) for x in sb[s0:s1]]
        tbytes = [norm(x, folded) for x in tb[t0:t1]]
        assert b"".join(sbytes) == b"".join(tbytes), "equal bytes (lossy: after normalisation)"
        assert b"".join(sbytes), "a text chunk holds bytes"
        if chunks == "minimal":
            s_cuts = set(np.cumsum([len(x) for x in sbytes])[:-1].tolist())
            t_cuts = set(np.cumsum([len(x) for x in tbytes])[:-1].tolist())
            total = len(b"".join(sbytes))
            assert not ((s_cuts & t_cuts) - {0, total}), f"chunk {k} is not minimal"
        exact = (s1 - s0 == 1 and t1 - t0 == 1
                 and s_table.token_bytes(int(s_ids[s0])) == t_table.token_bytes(int(t_ids[t0])))
        assert bool(res.chunk_exact_BC[b, k]) == exact
    for cov, chunk_ids, ln in ((res.s_coverage_B[b], sc, n), (res.t_coverage_B[b], tc, m)):
        expect = 1.0 if ln == 0 else float(np.mean(chunk_ids[:ln] >= 0))
        assert abs(cov - expect) < 1e-12
