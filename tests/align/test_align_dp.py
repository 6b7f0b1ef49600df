"""DP path on synthetic tokenizations: Numba == pure-Python chunk DP reference, invariants,
band widening, anchors (and their cutting back to common cuts), lossy pairs, and the scenarios
of the issue (BOS on one side, chat templates, lowercased WordPiece-like text, truncation
mid-character, different text in the middle). Optimality: ``test_align_optimal.py``."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from align_helpers import (SPICY, Vocab, check_invariants, compare_with_reference, pad,
                           random_cuts, segment)
from align_reference import (anchored_chunk_path, banded_chunk_path, effective_lengths,
                             find_anchors, symbols, trim_anchors)
from xdistill.align import align_batch, align_pair
from xdistill.tokenization.table import ROLE_BOS, ROLE_CHAT, ROLE_EOS

TEXT = st.text(st.one_of(st.sampled_from(SPICY), st.characters(exclude_categories=("Cs",))),
               max_size=25)
SETTINGS = settings(max_examples=50, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def edited_pair(draw):
    """A text and an edited copy (insert/delete/replace a region, prefix/suffix, lowercase)."""
    a = draw(TEXT)
    edit = draw(st.sampled_from(["replace", "insert", "delete", "prefix", "suffix", "lower",
                                 "nospace"]))
    i = draw(st.integers(0, len(a)))
    j = draw(st.integers(i, len(a)))
    other = draw(TEXT)
    b = {"replace": a[:i] + other + a[j:], "insert": a[:i] + other + a[i:],
         "delete": a[:i] + a[j:], "prefix": other + a, "suffix": a + other,
         "lower": a.lower(), "nospace": a.replace(" ", "").lower()}[edit]
    seed = draw(st.integers(0, 2**31))
    return a.encode(), b.encode(), seed, edit in ("lower", "nospace")


@SETTINGS
@given(st.lists(edited_pair(), min_size=1, max_size=3), st.sampled_from(["minimal", "space"]),
       st.sampled_from([1, 4, 32]))
def test_dp_matches_reference_and_invariants(pairs, chunks, band):
    lossy = any(p[3] for p in pairs)
    vocab = Vocab(lossy=lossy)
    s_rows, t_rows = [], []
    for a, b, seed, _ in pairs:
        rng = np.random.default_rng(seed)
        roles = {0: [ROLE_BOS]} if rng.random() < 0.5 else {}
        s_rows.append(segment(vocab, a, random_cuts(rng, len(a), 0.4) + list(roles), roles))
        t_rows.append(segment(vocab, b, random_cuts(rng, len(b), 0.3)))
    table = vocab.table()
    s_ids, s_len = pad(s_rows)
    t_ids, t_len = pad(t_rows)
    res = align_batch(s_ids, s_len, t_ids, t_len, table, table, chunks=chunks, method="dp",
                      dp_band=band)
    assert res.used_dp_B.all()
    compare_with_reference(res, s_rows, t_rows, table, table, chunks=chunks, method="dp",
                           dp_band=band)
    auto = align_batch(s_ids, s_len, t_ids, t_len, table, table, chunks=chunks, dp_band=band)
    compare_with_reference(auto, s_rows, t_rows, table, table, chunks=chunks, dp_band=band)
    for b, (s, t) in enumerate(zip(s_rows, t_rows)):
        check_invariants(res, b, s, t, table, table, chunks=chunks)
        check_invariants(auto, b, s, t, table, table, chunks=chunks)


def _matched(path) -> int:
    return sum(mv == 0 for mv in path)


@SETTINGS
@given(edited_pair(), st.sampled_from([1, 2, 8]))
def test_band_widening_reaches_the_full_matrix_optimum(pair, band):
    """A narrow initial band widens until its optimum is proven: as many symbols inside chunks
    as the DP over the full matrix; the Numba DP takes the same path as the reference."""
    from xdistill.align._dp import banded_dp

    a, b, seed, lossy = pair
    vocab = Vocab(lossy=lossy)
    rng = np.random.default_rng(seed)
    s = segment(vocab, a, random_cuts(rng, len(a), 0.5))
    t = segment(vocab, b, random_cuts(rng, len(b), 0.5))
    table = vocab.table()
    sym_s, _, isb_s = symbols(s, effective_lengths(s, table, 0), table, lossy)
    sym_t, _, isb_t = symbols(t, effective_lengths(t, table, 0), table, lossy)
    path = banded_chunk_path(sym_s, sym_t, isb_s, isb_t, band)
    full = banded_chunk_path(sym_s, sym_t, isb_s, isb_t, len(sym_s) + len(sym_t) + 1)
    assert _matched(path) == _matched(full)
    moves, status = banded_dp(np.array(sym_s, np.int32), np.array(sym_t, np.int32),
                              np.array(isb_s), np.array(isb_t), band, 1 << 26)
    assert status == 0 and moves.tolist() == path


def _unaligned_bytes(res, ids, table, side: str) -> bytes:
    chunk = (res.s_chunk_BTs if side == "s" else res.t_chunk_BTt)[0]
    return b"".join(table.token_bytes(int(i)) for i, c in zip(ids, chunk) if c < 0)


def test_different_region_in_the_middle_is_unaligned_and_the_rest_exact():
    vocab = Vocab()
    a = b"The quick brown fox | jumps over | the lazy dog"
    b = b"The quick brown fox | LEAPS ACROSS | the lazy dog"
    words = lambda d: [k for k in range(1, len(d)) if d[k:k + 1] == b" "]  # noqa: E731
    s = segment(vocab, a, words(a))
    t = segment(vocab, b, words(b))
    table = vocab.table()
    res = align_pair(s, t, table, table)
    assert res.used_dp_B[0]
    compare_with_reference(res, [s], [t], table, table)
    check_invariants(res, 0, s, t, table, table)
    assert _unaligned_bytes(res, s, table, "s") == b" jumps over"
    assert _unaligned_bytes(res, t, table, "t") == b" LEAPS ACROSS"
    assert res.chunk_exact_BC[0].all() and res.n_chunks_B[0] == 9


def test_truncated_mid_character_leaves_only_the_tail_unaligned():
    vocab = Vocab()
    a = "abc 中文".encode()
    s = segment(vocab, a[:-1], [3, 4, 7])          # "abc" " " "中" "\xe6\x96" (cut mid-char)
    t = segment(vocab, a, [3, 4, 7])               # "abc" " " "中" "文"
    table = vocab.table()
    res = align_pair(s, t, table, table)
    assert res.used_dp_B[0]
    compare_with_reference(res, [s], [t], table, table)
    assert res.s_chunk_BTs[0].tolist() == [0, 1, 2, -1]
    assert res.t_chunk_BTt[0].tolist() == [0, 1, 2, -1]


def test_chat_templates_pair_roles_and_text():
    """Two templates around the same messages: different role markers and separators."""
    vocab = Vocab()
    chat, eos, bos = (vocab.role_id(r) for r in (ROLE_CHAT, ROLE_EOS, ROLE_BOS))
    w = lambda d: segment(vocab, d, [k for k in range(1, len(d)) if d[k:k + 1] in b" \n"])  # noqa
    # student: <chat>user\nHi there<eos>\n<chat>assistant\nHello you<eos>
    s = ([chat] + w(b"user\nHi there") + [eos] + w(b"\n") + [chat] + w(b"assistant\nHello you")
         + [eos])
    # teacher: <bos><chat>user<chat>\n\nHi there<eos><chat>assistant<chat>\n\nHello you<eos>
    t = ([bos, chat] + w(b"user") + [chat] + w(b"\n\nHi there") + [eos, chat] + w(b"assistant")
         + [chat] + w(b"\n\nHello you") + [eos])
    table = vocab.table()
    res = align_pair(s, t, table, table)
    assert res.used_dp_B[0]
    compare_with_reference(res, [s], [t], table, table)
    check_invariants(res, 0, s, t, table, table)
    assigned = {table.token_bytes(int(s[i])) for i, c in enumerate(res.s_chunk_BTs[0]) if c >= 0}
    assert {b"user", b"\nHi", b" there", b"assistant", b"\nHello", b" you"} <= assigned
    roles_paired = sum(1 for i, c in enumerate(res.s_chunk_BTs[0])
                       if c >= 0 and table.roles_V[s[i]] != 0)
    assert roles_paired == 4           # both <chat> openers and both <eos>
    assert res.t_chunk_BTt[0][0] == -1  # the teacher's BOS has no partner


def test_lowercased_wordpiece_like_teacher():
    """A lossy teacher (lowercased, no spaces): texts are equal after normalisation (ASCII lower
    case, whitespace removed), so the exact path aligns everything; whitespace the teacher lacks
    is absorbed (" World" ~ "world", a lone " " joins the next chunk)."""
    vocab = Vocab(lossy=True)
    a = b"Hello World, it is Fine"
    s = segment(vocab, a, [5, 6, 11, 12, 15, 18, 19])   # Hello| |World|,| it| is| |Fine
    b = a.lower().replace(b" ", b"")
    t = segment(vocab, b, [5, 10, 11, 13, 15])           # hello|world|,|it|is|fine
    table = vocab.table()
    for method in ("auto", "dp"):
        res = align_pair(s, t, table, table, method=method)
        assert res.used_dp_B[0] == (method == "dp")
        compare_with_reference(res, [s], [t], table, table, method=method)
        check_invariants(res, 0, s, t, table, table)
        assert res.s_chunk_BTs[0].tolist() == [0, 1, 1, 2, 3, 4, 5, 5]
        assert res.t_chunk_BTt[0].tolist() == [0, 1, 2, 3, 4, 5]
        assert res.chunk_exact_BC[0].tolist() == [False, False, True, False, False, False]
    space = align_pair(s, t, table, table, chunks="space")
    compare_with_reference(space, [s], [t], table, table, chunks="space")
    # groups start where whitespace precedes on either side: Hello | World, | it | is | Fine
    assert space.t_chunk_BTt[0].tolist() == [0, 1, 1, 2, 3, 4]


def test_lossy_teacher_with_a_different_region():
    vocab = Vocab(lossy=True)
    a = b"The Quick brown fox jumps over the lazy dog"
    b = b"thequickredcatjumpsoverthelazydog"
    cut = lambda d: [k for k in range(1, len(d)) if d[k:k + 1] == b" "]  # noqa: E731
    s = segment(vocab, a, cut(a))
    t = segment(vocab, b, [3, 8, 11, 14, 19, 23, 26, 30])   # the|quick|red|cat|jumps|...
    table = vocab.table()
    res = align_pair(s, t, table, table)
    assert res.used_dp_B[0]
    compare_with_reference(res, [s], [t], table, table)
    check_invariants(res, 0, s, t, table, table)
    assert res.s_chunk_BTs[0].tolist() == [0, 1, -1, -1, 2, 3, 4, 5, 6]
    assert res.t_chunk_BTt[0].tolist() == [0, 1, -1, -1, 2, 3, 4, 5, 6]


@SETTINGS
@given(st.lists(st.integers(0, 3), max_size=60), st.lists(st.integers(0, 3), max_size=60),
       st.integers(1, 4))
def test_anchor_segments_match_the_reference(a, b, k):
    """Unique K-grams, LIS chain and segment merging: Numba == dict-based reference (a small
    alphabet makes repeated K-grams, ties and overlapping chains common)."""
    from xdistill.align._anchor import find_anchors as nb_find_anchors

    sx, sy, sl = nb_find_anchors(np.array(a, np.int32), np.array(b, np.int32), k)
    got = list(zip(sx.tolist(), sy.tolist(), sl.tolist()))
    assert got == find_anchors(a, b, k)
    for x, y, n in got:
        assert a[x:x + n] == b[y:y + n]


@SETTINGS
@given(st.lists(st.integers(0, 3), max_size=60), st.lists(st.integers(0, 3), max_size=60),
       st.integers(1, 4), st.integers(0, 2**31))
def test_anchors_are_cut_back_to_common_cuts(a, b, k, seed):
    """Each kept anchor starts and ends at a common cut, lies inside its uncut segment, and the
    Numba version equals the reference."""
    from xdistill.align._anchor import trim_anchors as nb_trim_anchors

    rng = np.random.default_rng(seed)
    ia = [True] + [bool(v) for v in rng.random(len(a)) < 0.4]
    ib = [True] + [bool(v) for v in rng.random(len(b)) < 0.4]
    ia[-1] = ib[-1] = True
    segs = find_anchors(a, b, k)
    got = trim_anchors(segs, ia, ib, 0, 0)
    arrays = [np.array(v, np.int64).reshape(-1) for v in zip(*segs)] if segs else \
        [np.zeros(0, np.int64)] * 3
    nb = nb_trim_anchors(*arrays, np.array(ia), np.array(ib), 0)
    assert list(zip(*(v.tolist() for v in nb))) == got
    for x, y, n in got:
        assert n > 0 and ia[x] and ib[y] and ia[x + n] and ib[y + n]
        assert any(sx <= x and x + n <= sx + sl and x - y == sx - sy for sx, sy, sl in segs)


def test_long_rows_with_scattered_edits_use_anchors():
    """Every 15th word replaced, so the lengths drift apart: anchors keep the DP gaps short, the
    result equals the reference and (here) the unanchored optimum. Both sides are cut at random
    (p = 0.3 each), so common cuts are ~11 bytes apart and each edit leaves its surrounding
    chunk unaligned: ~70% of the tokens are covered."""
    rng = np.random.default_rng(3)
    words = [bytes(rng.choice(list(b"abcdefghij"), rng.integers(1, 9)).astype(np.uint8))
             for _ in range(150)]
    a = b" ".join(words)
    b = b" ".join(b"XYZXYZ" if k % 15 == 14 else w for k, w in enumerate(words))
    vocab = Vocab()
    s = segment(vocab, a, random_cuts(rng, len(a), 0.3))
    t = segment(vocab, b, random_cuts(rng, len(b), 0.3))
    table = vocab.table()
    sym_s, _, isb_s = symbols(s, effective_lengths(s, table, 0), table, False)
    sym_t, _, isb_t = symbols(t, effective_lengths(t, table, 0), table, False)
    assert len(find_anchors(sym_s, sym_t, 32)) >= 5
    path = anchored_chunk_path(sym_s, sym_t, isb_s, isb_t, 4)
    assert _matched(path) == _matched(anchored_chunk_path(sym_s, sym_t, isb_s, isb_t, 4,
                                                          anchor_k=0))
    res = align_pair(s, t, table, table, dp_band=4)
    compare_with_reference(res, [s], [t], table, table, dp_band=4)
    check_invariants(res, 0, s, t, table, table)
    assert res.s_coverage_B[0] > 0.7


def test_max_cells_counts_the_band_cells_inside_the_matrix():
    """``max_cells`` limits the band's cells that lie inside the matrix: a gap of 200 student
    bytes against 3 teacher bytes has (200 + 1) x (3 + 1) = 804 cells, although its band spans
    W = 204 diagonals (the old charge, (Ls + 1) * W = 41,004, left such gaps unaligned for any
    long student side). At 804 the Numba DP and the reference align it the same way; at 803
    both refuse it (the row is then flagged, nothing is allocated)."""
    from align_reference.dp import band_cells
    from xdistill.align._dp import STATUS_OK, STATUS_TOO_BIG, banded_dp

    rng = np.random.default_rng(5)
    a = bytes(rng.integers(97, 100, 200).astype(np.uint8))
    b = a[-3:]
    sym_s, sym_t = list(a), list(b)
    isb_s = [True] + [(k % 4) == 1 for k in range(1, 200)] + [True]    # a cut at 197
    isb_t = [True, False, False, True]
    assert band_cells(200, 3, -200, 204) == 804
    args = (np.array(sym_s, np.int32), np.array(sym_t, np.int32), np.array(isb_s),
            np.array(isb_t), 32)
    moves, status = banded_dp(*args, 804)
    assert status == STATUS_OK
    assert moves.tolist() == banded_chunk_path(sym_s, sym_t, isb_s, isb_t, 32, 804)
    assert _matched(moves.tolist()) == 3                      # the teacher's token, in place
    moves, status = banded_dp(*args, 803)
    assert status == STATUS_TOO_BIG and moves.size == 0
    assert banded_chunk_path(sym_s, sym_t, isb_s, isb_t, 32, 803) is None
