"""Vectorised byte matching against a pure-Python dictionary reference."""

from __future__ import annotations

import numpy as np

from projection_helpers import random_table
from xdistill.projection.bytematch import byte_token_map, lookup_bytes, match_bytes, text_ids
from xdistill.tokenization.table import ROLE_BOS, TokenByteTable


def reference_pairs(q: TokenByteTable, r: TokenByteTable) -> set[tuple[int, int]]:
    by_bytes: dict[bytes, list[int]] = {}
    for j in range(r.vocab_size):
        if r.lengths_V[j] and r.roles_V[j] == 0:
            by_bytes.setdefault(r.token_bytes(j), []).append(j)
    return {(i, j) for i in range(q.vocab_size) if q.lengths_V[i] and q.roles_V[i] == 0
            for j in by_bytes.get(q.token_bytes(i), [])}


def test_match_bytes_agrees_with_reference_on_random_tables():
    rng = np.random.default_rng(0)
    for trial in range(5):
        q = random_table(rng, 300)
        r = random_table(rng, 250)
        q_N, r_N = match_bytes(q, text_ids(q), r, text_ids(r))
        got = set(zip(q_N.tolist(), r_N.tolist()))
        assert got == reference_pairs(q, r)
        assert len(got) == q_N.size  # no duplicate pairs
        assert np.all(np.diff(q_N) >= 0)


def test_nul_bytes_and_lengths_are_distinguished():
    q = TokenByteTable.from_bytes_list([b"a", b"a\x00", b"\x00a", b"\x00", b""])
    r = TokenByteTable.from_bytes_list([b"\x00", b"a\x00", b"a", b"\x00a", b""])
    q_N, r_N = match_bytes(q, np.arange(5), r, np.arange(5))
    assert list(zip(q_N.tolist(), r_N.tolist())) == [(0, 2), (1, 1), (2, 3), (3, 0)]


def test_role_tokens_are_not_text():
    t = TokenByteTable.from_bytes_list([b"", b"x", b"y"], roles=[ROLE_BOS, 0, 0])
    assert text_ids(t).tolist() == [1, 2]


def test_lookup_prefers_given_rank_and_byte_map():
    t = TokenByteTable.from_bytes_list([b" ", b"x", b" ", b"\xe4"])
    assert lookup_bytes(t, [b" ", b"x", b"zz"]).tolist() == [0, 1, -1]
    pref = np.array([5, 0, 1, 0])
    assert lookup_bytes(t, [b" "], pref).tolist() == [2]
    bmap = byte_token_map(t)
    assert bmap[0x20] == 0 and bmap[ord("x")] == 1 and bmap[0xE4] == 3 and bmap[ord("q")] == -1
