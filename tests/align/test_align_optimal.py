"""Coverage of the DP path: rows whose texts differ keep every in-place identical token, and the
chunks cover as many bytes as the best byte-identical chunking (exhaustive search over token
boundaries, written here from the definition), within the class the aligner guarantees.

Guaranteed class (``xdistill.align._anchor``): on the DP path with no anchors, the most bytes
(then the most role pairs) among all chunkings that keep the chunks of the common prefix cut back
to its last common cut. (Rows with equal texts take the exact path under ``method="auto"``: all
bytes in place, by definition, unless a role token falls inside a chunk.) The test computes that
forced prefix from the definition too, and a separate test shows a row where keeping the prefix
costs bytes (the limit of the class, stated, not hidden).
"""

from __future__ import annotations

import functools

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from align_helpers import ROLES, Vocab, check_invariants, compare_with_reference, pad, segment
from xdistill.align import align_batch, align_pair
from xdistill.tokenization.table import ROLE_EOS

# few distinct characters (repeats make ties and shifted matches common), multi-byte ones too
ALPHABET = st.sampled_from(list("ab ,=1\n") + ["é", "中", "🙂"])
TEXT = st.lists(ALPHABET, max_size=12).map("".join)
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ------------------------------------------------------------------ the definition
def _pieces(ids, table) -> list:
    """Token ``i`` as its bytes, or ``("role", r)`` for a role token."""
    return [("role", int(table.roles_V[i])) if table.roles_V[i] else table.token_bytes(int(i))
            for i in ids]


def best_chunking(s: tuple, t: tuple) -> tuple[int, int]:
    """(bytes, role pairs) of the best chunking, maximised in that order: ordered, disjoint pairs
    of token spans, each either text tokens with identical, non-empty concatenated bytes, or one
    role token on each side with the same role."""
    n, m = len(s), len(t)

    @functools.lru_cache(maxsize=None)
    def best(i: int, j: int) -> tuple[int, int]:
        if i == n or j == m:
            return (0, 0)
        out = max(best(i + 1, j), best(i, j + 1))
        if isinstance(s[i], tuple):
            if s[i] == t[j]:
                nb, nr = best(i + 1, j + 1)
                out = max(out, (nb, nr + 1))
            return out
        sb = b""
        for i1 in range(i, n):
            if isinstance(s[i1], tuple):
                break
            sb += s[i1]
            tb = b""
            for j1 in range(j, m):
                if isinstance(t[j1], tuple) or len(tb) + len(t[j1]) > len(sb):
                    break
                tb += t[j1]
                if tb == sb:
                    nb, nr = best(i1 + 1, j1 + 1)
                    out = max(out, (nb + len(sb), nr))
        return out

    return best(0, 0)


def forced_prefix(s: list, t: list) -> tuple[int, int]:
    """Tokens ``(i, j)`` of the common prefix cut back to its last common cut: the symbol strings
    (text bytes; one symbol per role token) agree up to there and both sides start a token (or
    end) there."""
    def symbols(pieces):
        out, starts = [], {}
        for k, p in enumerate(pieces):
            starts[len(out)] = k
            out += [p] if isinstance(p, tuple) else list(p)
        starts[len(out)] = len(pieces)
        return out, starts

    a, sa = symbols(s)
    b, sb = symbols(t)
    cut, p = 0, 0
    while True:
        if p in sa and p in sb:
            cut = p
        if p == min(len(a), len(b)) or a[p] != b[p]:
            return sa[cut], sb[cut]
        p += 1


def covered(res, b: int, s_ids, table) -> tuple[int, int]:
    """(bytes, role pairs) inside the aligner's valid chunks of row ``b``."""
    nbytes = nroles = 0
    for s0, s1, _, _, _ in res.chunks(b):
        if table.roles_V[s_ids[s0]]:
            nroles += 1
        else:
            nbytes += sum(len(table.token_bytes(int(i))) for i in s_ids[s0:s1])
    return nbytes, nroles


def class_optimum(s_ids, t_ids, table) -> tuple[int, int]:
    s, t = _pieces(s_ids, table), _pieces(t_ids, table)
    i, j = forced_prefix(s, t)
    kept = (sum(len(p) for p in s[:i] if not isinstance(p, tuple)),
            sum(isinstance(p, tuple) for p in s[:i]))
    rest = best_chunking(tuple(s[i:]), tuple(t[j:]))
    return kept[0] + rest[0], kept[1] + rest[1]


# ------------------------------------------------------------------ property
@st.composite
def edited_rows(draw):
    """A text and an edited copy (replace/insert/delete a region, truncate, add a prefix, change
    case), each cut into tokens at random, with role tokens sometimes."""
    a = draw(TEXT)
    i = draw(st.integers(0, len(a)))
    j = draw(st.integers(i, len(a)))
    other = draw(st.lists(ALPHABET, max_size=4).map("".join))
    b = draw(st.sampled_from([a[:i] + other + a[j:], a[:i] + other + a[i:], a[:i] + a[j:],
                              a[:i], other + a, a[:1].upper() + a[1:]]))
    rows = []
    for text in (a.encode(), b.encode()):
        cuts = draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=len(text)))
        roles = draw(st.dictionaries(st.integers(0, len(text)), st.lists(st.sampled_from(ROLES),
                                                                         min_size=1, max_size=1),
                                     max_size=2))
        rows.append((text, sorted(cuts), roles))
    return rows


@SETTINGS
@given(st.lists(edited_rows(), min_size=1, max_size=4), st.sampled_from([1, 2, 32]))
def test_dp_covers_the_most_bytes_of_its_class(batch, band):
    vocab = Vocab()
    s_rows = [segment(vocab, *rows[0]) for rows in batch]
    t_rows = [segment(vocab, *rows[1]) for rows in batch]
    table = vocab.table()
    s_ids, s_len = pad(s_rows)
    t_ids, t_len = pad(t_rows)
    for method in ("dp", "auto"):
        res = align_batch(s_ids, s_len, t_ids, t_len, table, table, method=method, dp_band=band,
                          dp_anchor=0)
        compare_with_reference(res, s_rows, t_rows, table, table, method=method, dp_band=band,
                               dp_anchor=0)
        for b, (s, t) in enumerate(zip(s_rows, t_rows)):
            check_invariants(res, b, s, t, table, table)
            # "auto" sends rows with equal texts to the exact path: in-place cuts by definition
            # (all bytes, unless a role token sits inside a chunk), not covered by this class
            if res.used_dp_B[b]:
                assert covered(res, b, s, table) == class_optimum(s, t, table), (s, t)


# ------------------------------------------------------------------ the rows
def _in_place_pairs(s_ids, t_ids, s_table, t_table) -> list[tuple[int, int]]:
    """Token pairs with identical bytes at the same byte offsets of their texts."""
    def spans(ids, table):
        out, pos = {}, 0
        for k, tid in enumerate(ids):
            piece = table.token_bytes(int(tid))
            out[(pos, piece)] = k
            pos += len(piece)
        return out

    ss, ts = spans(s_ids, s_table), spans(t_ids, t_table)
    return sorted((k, ts[key]) for key, k in ss.items() if key in ts)


def test_rows_whose_texts_differ_keep_every_in_place_token(get_tokenizer):
    """The issue's three rows (gpt2 student, qwen2 teacher): an edit at the start, then the
    shorter text is a truncation of the longer one. Every token that sits at the same bytes on
    both sides is a 1:1 chunk, and nothing pairs a later copy (``","`` after ``3``)."""
    s_tok, t_tok = get_tokenizer("gpt2"), get_tokenizer("qwen2")
    cases = {
        ("alpha beta gamma delta", "Alpha beta"): [(1, 2, 1, 2, True)],
        ("The cat sat on the mat and then it slept.", "the cat sat on the mat"):
            [(k, k + 1, k, k + 1, True) for k in range(1, 6)],
        ("x = 1, y = 2, z = 3,", "X = 1, y = 2,"):
            [(1, 2, 1, 2, True), (2, 3, 2, 4, False), (3, 4, 4, 5, True), (4, 5, 5, 6, True),
             (5, 6, 6, 7, True), (6, 7, 7, 9, False), (7, 8, 9, 10, True)],
    }
    for (a, b), want in cases.items():
        s, t = s_tok.encode(a).ids, t_tok.encode(b).ids
        res = align_pair(s, t, s_tok.table, t_tok.table)
        assert res.used_dp_B[0]
        assert res.chunks(0) == want, (a, b)
        compare_with_reference(res, [s.tolist()], [t.tolist()], s_tok.table, t_tok.table)
        check_invariants(res, 0, s, t, s_tok.table, t_tok.table)
        one_to_one = {(c[0], c[2]) for c in res.chunks(0) if c[1] - c[0] == c[3] - c[2] == 1}
        assert set(_in_place_pairs(s, t, s_tok.table, t_tok.table)) <= one_to_one


def test_truncated_row_pairs_in_place_not_at_the_end():
    """Ties (the same bytes available at several places) go to the earliest match: a truncated
    teacher row pairs its last token in place, and the student's tail stays unaligned."""
    vocab = Vocab()
    a = b"k1, k2, k3,"
    s = segment(vocab, a, [2, 3, 6, 7, 10])          # k1|,| k2|,| k3|,
    t = segment(vocab, b"K1, k2,", [2, 3, 6])         # K1|,| k2|,
    table = vocab.table()
    res = align_pair(s, t, table, table)
    assert res.chunks(0) == [(1, 2, 1, 2, True), (2, 3, 2, 3, True), (3, 4, 3, 4, True)]
    assert res.s_chunk_BTs[0].tolist() == [-1, 0, 1, 2, -1, -1]


def test_bytes_outrank_role_pairs():
    """A role pair never costs text bytes: "a" is paired, the crossing EOS pair is not."""
    vocab = Vocab()
    eos = vocab.role_id(ROLE_EOS)
    s = segment(vocab, b"ab", []) + [eos]
    t = [eos] + segment(vocab, b"ab", [])
    table = vocab.table()
    res = align_pair(s, t, table, table)
    assert res.chunks(0) == [(0, 1, 1, 2, True)]
    assert class_optimum(s, t, table) == covered(res, 0, s, table) == (2, 0)


def test_the_kept_common_prefix_can_cost_bytes():
    """The limit of the guaranteed class: the teacher repeats "a " at the start. The aligner keeps
    the common prefix "a " (2 bytes); pairing the student's "a" with the second one would cover
    5 bytes. The exhaustive optimum is 5, the class optimum (prefix kept) 2."""
    vocab = Vocab()
    s = segment(vocab, "a  é".encode(), [1, 2, 3])            # a| | |é
    t = segment(vocab, "a a  é".encode(), [1, 2, 3])          # a| |a|  é
    table = vocab.table()
    res = align_pair(s, t, table, table)
    assert covered(res, 0, s, table) == class_optimum(s, t, table) == (2, 0)
    assert best_chunking(tuple(_pieces(s, table)), tuple(_pieces(t, table))) == (5, 0)
    # without the shared start the DP finds the 5 bytes
    res = align_pair(s, t[2:], table, table)
    assert covered(res, 0, s, table) == (5, 0)


def test_anchored_rows_keep_their_gaps_optimal():
    """Long rows with anchors: the result equals the reference, satisfies the invariants, and on
    these (non-periodic) rows covers the unanchored optimum."""
    rng = np.random.default_rng(7)
    words = [bytes(rng.choice(list(b"abcdefghijklmnop"), rng.integers(1, 8)).astype(np.uint8))
             for _ in range(80)]
    a = b" ".join(words)
    b = b" ".join(b"ZZ" if k % 9 == 4 else w for k, w in enumerate(words))[:-7]
    vocab = Vocab()
    def cut(d):
        return [k for k in range(1, len(d)) if d[k - 1:k] == b" " or rng.random() < 0.2]

    s, t = segment(vocab, a, cut(a)), segment(vocab, b, cut(b))
    table = vocab.table()
    res = align_pair(s, t, table, table, dp_anchor=8)
    compare_with_reference(res, [s], [t], table, table, dp_anchor=8)
    check_invariants(res, 0, s, t, table, table)
    none = align_pair(s, t, table, table, dp_anchor=0)
    assert covered(res, 0, s, table) == covered(none, 0, s, table)
