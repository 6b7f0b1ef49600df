"""Review s22: aligner defects found by probing against the definitions (each test fails on the
code it was written against)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from align_helpers import Vocab, check_invariants, segment
from xdistill.align import align_pair


def _skewed_gap_rows(nx: int):
    """Student text ``X + Y`` (``X``: ``nx`` random lower-case bytes, ``Y``: 300 upper-case
    bytes), teacher text ``X[-5:] + "~" + Y``: the teacher starts with the last 5 bytes of ``X``
    as one token, then one byte the student lacks, then ``Y``. Both sides cut every 5 bytes, so
    the teacher's first token has an exact partner: the student's last token of ``X``."""
    rng = np.random.default_rng(0)
    X = bytes(rng.integers(97, 123, nx).astype(np.uint8))
    Y = bytes(rng.integers(65, 91, 300).astype(np.uint8))
    vocab = Vocab()
    s = segment(vocab, X + Y, list(range(5, nx + 300, 5)))
    t_text = X[-5:] + b"~" + Y
    t = segment(vocab, t_text, [5, 6] + list(range(11, len(t_text), 5)))
    return s, t, vocab.table(), nx // 5 - 1


def test_a_gap_with_one_short_side_is_aligned_whatever_the_long_side():
    """The first DP gap (before the first anchor in ``Y``) is the student's ``X`` (10,000 bytes)
    vs the teacher's ``X[-5:] + "~"`` (6 bytes): its full DP matrix has 10,001 x 7 = 70k cells,
    far below ``dp_max_cells`` (2**26), so the gap must be aligned optimally (the teacher's
    first token pairs with the student token holding ``X[-5:]``), as it is for ``nx = 8000``.

    ``_dp.banded_dp`` charged the cap for its diagonal band layout, ``(Ls + 1) * W`` with
    ``W = Ls + Lt + 1`` here (about Ls**2 = 1e8 cells), so it declared the gap TOO_BIG, left
    it unaligned and warned "needs more than dp_max_cells" (fixed: the band's cells inside the
    matrix are counted and stored, ``_dp._band_rows``). With the sides swapped (the long side
    as the teacher) the same gap is aligned: the result depends on which side is the student."""
    s, t, table, partner = _skewed_gap_rows(10_000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = align_pair(s, t, table, table)
    swapped = align_pair(t, s, table, table)
    check_invariants(res, 0, s, t, table, table)
    # the swapped call (long side = teacher) pairs the token in place: the definition's answer
    assert swapped.s_chunk_BTs[0, 0] >= 0
    assert swapped.t_chunk_BTt[0, partner] == swapped.s_chunk_BTs[0, 0]
    assert not caught, [str(w.message) for w in caught]
    assert res.t_chunk_BTt[0, 0] >= 0, "teacher token 0 (X[-5:]) left unaligned"
    assert res.s_chunk_BTs[0, partner] == res.t_chunk_BTt[0, 0]
