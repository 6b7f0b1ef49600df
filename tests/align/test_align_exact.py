"""Exact path on synthetic tokenizations: Numba == two-pointer reference == set definition."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from align_helpers import (ROLES, SPICY, Vocab, check_invariants, compare_with_reference, pad,
                           segment)
from align_reference import align_row_reference
from xdistill.align import align_batch, align_pair
from xdistill.tokenization.table import ROLE_BOS, ROLE_EOS

TEXT = st.text(st.one_of(st.sampled_from(SPICY), st.characters(exclude_categories=("Cs",))),
               max_size=30)
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def tokenized_pair(draw, roles: bool = True):
    """A text cut two ways (student, teacher), optionally with role tokens at boundaries."""
    data = draw(TEXT).encode("utf-8")
    positions = st.integers(0, max(len(data), 0))
    s_cuts = draw(st.lists(positions, max_size=12))
    t_cuts = draw(st.lists(positions, max_size=12))
    s_roles, t_roles = {}, {}
    if roles:
        for target in (s_roles, t_roles):
            for pos, role in draw(st.lists(st.tuples(positions, st.sampled_from(ROLES)),
                                           max_size=3)):
                target.setdefault(pos, []).append(role)
    return data, s_cuts, t_cuts, s_roles, t_roles


def _cut_roles(cuts, roles):
    """Role tokens sit at token boundaries of their own side: add their positions as cuts."""
    return list(cuts) + list(roles)


@SETTINGS
@given(st.lists(tokenized_pair(), min_size=1, max_size=4), st.sampled_from(["minimal", "space"]))
def test_exact_path_matches_references_and_invariants(rows, chunks):
    vocab = Vocab()
    s_rows, t_rows = [], []
    for data, s_cuts, t_cuts, s_roles, t_roles in rows:
        s_rows.append(segment(vocab, data, _cut_roles(s_cuts, s_roles), s_roles))
        t_rows.append(segment(vocab, data, _cut_roles(t_cuts, t_roles), t_roles))
    table = vocab.table()
    s_ids, s_len = pad(s_rows, fill=10**6)      # padding values are never read
    t_ids, t_len = pad(t_rows, fill=-5)
    res = align_batch(s_ids, s_len, t_ids, t_len, table, table, chunks=chunks)
    assert not res.used_dp_B.any()
    compare_with_reference(res, s_rows, t_rows, table, table, chunks=chunks)
    for b, (s, t) in enumerate(zip(s_rows, t_rows)):
        check_invariants(res, b, s, t, table, table, chunks=chunks)
        if chunks == "minimal":   # the walk and the set definition agree
            walk = align_row_reference(s, t, table, table)
            sets = align_row_reference(s, t, table, table, exact_impl="sets")
            assert walk == sets
        if not any(table.roles_V[s]) and not any(table.roles_V[t]):
            assert res.s_coverage_B[b] == 1.0 and res.t_coverage_B[b] == 1.0


@SETTINGS
@given(tokenized_pair(), st.sampled_from(["minimal", "space"]))
def test_same_tokenization_is_all_exact_one_to_one(pair, chunks):
    data, s_cuts, _, s_roles, _ = pair
    vocab = Vocab()
    ids = segment(vocab, data, _cut_roles(s_cuts, s_roles), s_roles)
    table = vocab.table()
    res = align_pair(ids, ids, table, table)
    n = len(ids)
    assert res.s_chunk_BTs[0].tolist() == res.t_chunk_BTt[0].tolist() == list(range(n))
    roles = table.roles_V[np.asarray(ids, np.int64)] if n else np.zeros(0)
    assert res.chunk_exact_BC[0].tolist() == [r == 0 for r in roles.tolist()]
    assert res.s_coverage_B[0] == res.t_coverage_B[0] == 1.0


@SETTINGS
@given(tokenized_pair(roles=False), st.integers(0, 3), st.integers(0, 3))
def test_phantom_prefix_matches_reference(pair, s_ph, t_ph):
    """A phantom prefix (bytes token 0 holds that the text lacks) is removed before aligning."""
    data, s_cuts, t_cuts, _, _ = pair
    vocab = Vocab()
    s = segment(vocab, b"\xe2\x96\x81"[:s_ph] + data, [c + s_ph for c in s_cuts] + [s_ph + 1])
    t = segment(vocab, b"  \t"[:t_ph] + data, [c + t_ph for c in t_cuts])
    table = vocab.table()
    res = align_pair(s, t, table, table, s_phantom=s_ph, t_phantom=t_ph)
    assert not res.used_dp_B[0]
    compare_with_reference(res, [s], [t], table, table, s_ph=[s_ph], t_ph=[t_ph])
    check_invariants(res, 0, s, t, table, table, s_ph, t_ph)
    if data:
        assert res.s_coverage_B[0] == res.t_coverage_B[0] == 1.0


def test_worked_example_minimal_and_space():
    vocab = Vocab()
    data = "Hello world, hi".encode()
    s = segment(vocab, data, [5, 11, 12])          # Hello| world|,| hi
    t = segment(vocab, data, [4, 5, 8, 11, 12])    # Hell|o| wo|rld|,| hi
    table = vocab.table()
    res = align_pair(s, t, table, table)
    assert res.chunks(0) == [(0, 1, 0, 2, False), (1, 2, 2, 4, False), (2, 3, 4, 5, True),
                             (3, 4, 5, 6, True)]
    space = align_pair(s, t, table, table, chunks="space")
    # boundaries only before " world" and " hi": "Hello" | " world," | " hi"
    assert space.chunks(0) == [(0, 1, 0, 2, False), (1, 3, 2, 5, False), (3, 4, 5, 6, True)]


def test_bos_on_one_side_and_role_inside_a_token():
    vocab = Vocab()
    data = b"abcdef"
    s = [vocab.role_id(ROLE_BOS)] + segment(vocab, data, [3])                       # BOS abc def
    t = segment(vocab, data, [2]) + [vocab.role_id(ROLE_EOS)]                        # ab cdef EOS
    s2 = segment(vocab, data, [])
    t2 = segment(vocab, data, [3], {3: [ROLE_EOS]})
    table = vocab.table()
    res = align_pair(s, t, table, table)
    assert not res.used_dp_B[0]
    assert res.s_chunk_BTs[0].tolist() == [-1, 0, 0]
    assert res.t_chunk_BTt[0].tolist() == [0, 0, -1]
    # an EOS the teacher has between "abc" and "def" falls inside the student's token "abcdef"
    res2 = align_pair(s2, t2, table, table)
    assert res2.n_chunks_B[0] == 0 and res2.s_coverage_B[0] == 0.0
    for dp in ("auto", "dp"):
        compare_with_reference(align_pair(s2, t2, table, table, method=dp), [s2], [t2], table,
                               table, method=dp)


def test_transparent_tokens_join_the_next_chunk():
    vocab = Vocab()
    empty = vocab.id(b"")
    s = [empty] + segment(vocab, b"abcd", [2]) + [empty]
    t = segment(vocab, b"abcd", [])
    table = vocab.table()
    res = align_pair(s, t, table, table)
    assert res.s_chunk_BTs[0].tolist() == [0, 0, 0, 0]
    assert res.chunks(0) == [(0, 4, 0, 1, False)]
    compare_with_reference(res, [s], [t], table, table)
