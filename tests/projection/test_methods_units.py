"""Small pure functions of the multitoken method."""

from __future__ import annotations

import numpy as np

from xdistill.projection.methods import _greedy_split, _role_targets, _segments, piece_weights
from xdistill.tokenization.table import ROLE_BOS, ROLE_EOS


def test_segments_split_invalid_utf8_into_single_bytes():
    assert _segments(b" hello") == [" hello"]
    assert _segments(b" \xe4\xb8") == [" ", 0xE4, 0xB8]
    assert _segments("中".encode() + b"\xe4") == ["中", 0xE4]
    assert _segments(b"\xff") == [0xFF]


def test_piece_weights_are_normalised_geometric():
    w = piece_weights(3, 0.1)
    np.testing.assert_allclose(w, np.array([1.0, 0.1, 0.01]) / 1.11, rtol=1e-15)
    np.testing.assert_allclose(piece_weights(2, 0.1), [0.9 / 0.99, 0.09 / 0.99])  # NeMo's 0.9*0.1**i
    assert piece_weights(3, 0.0).tolist() == [1.0, 0.0, 0.0]
    np.testing.assert_allclose(piece_weights(4, 1.0), 0.25)


def test_greedy_split_longest_match():
    lookup = {b"a": 1, b"ab": 2, b"abc": 3, b"c": 4}
    assert _greedy_split(b"abcab", lookup) == [3, 2]
    assert _greedy_split(b"xac", lookup) == [1, 4]  # b"x" has no token: dropped


def test_role_targets():
    roles = np.array([0, ROLE_EOS, ROLE_EOS, 0], dtype=np.int8)
    assert _role_targets(roles, ROLE_EOS, 2).tolist() == [2]
    assert _role_targets(roles, ROLE_EOS, None).tolist() == [1, 2]
    assert _role_targets(roles, ROLE_BOS, 1).tolist() == [1]  # no bos-role token: designated id
    assert _role_targets(roles, ROLE_BOS, None).tolist() == []
