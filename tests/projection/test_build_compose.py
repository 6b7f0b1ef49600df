"""Composition, top-k and renormalisation against slow float64 references (synthetic inputs)."""

from __future__ import annotations

import numpy as np
import pytest

from projection_helpers import synthetic_pair
from xdistill.errors import ProjectionError
from xdistill.projection.artifact import SOURCE_CORPUS, SOURCE_EXACT, SOURCE_MULTITOKEN, SOURCE_ROLE
from xdistill.projection.build import (
    BuildConfig, build_projection, coalesce, compose, parse_methods, top_k_renormalise)


def reference_topk(entries: dict[tuple[int, int], float], k: int) -> dict[tuple[int, int], float]:
    """From the definition: per row, k largest (ties: smaller column), divided by their sum."""
    rows: dict[int, list[tuple[int, float]]] = {}
    for (r, c), v in entries.items():
        if v > 0:
            rows.setdefault(r, []).append((c, v))
    out = {}
    for r, items in rows.items():
        kept = sorted(items, key=lambda cv: (-cv[1], cv[0]))[:k]
        total = sum(v for _, v in kept)
        out.update({(r, c): v / total for c, v in kept})
    return out


def test_top_k_renormalise_matches_reference():
    rng = np.random.default_rng(1)
    n = 2000
    rows = rng.integers(0, 50, n)
    cols = rng.integers(0, 40, n)
    vals = rng.choice([0.0, 0.1, 0.25, 0.5, 1.0], n)  # many ties
    r, c, v = coalesce(rows, cols, vals, 40)
    entries = {}
    for a, b, w in zip(rows.tolist(), cols.tolist(), vals.tolist()):
        entries[(a, b)] = entries.get((a, b), 0.0) + w
    for k in (1, 3, 4):
        gr, gc, gv = top_k_renormalise(r, c, v, 50, k)
        got = {(a, b): w for a, b, w in zip(gr.tolist(), gc.tolist(), gv.tolist())}
        ref = reference_topk(entries, k)
        assert got.keys() == ref.keys()
        assert max(abs(got[key] - ref[key]) for key in ref) < 1e-12
        assert np.all(np.diff(gr * 40 + gc) > 0)  # sorted, unique


def test_top_k_rejects_k0():
    with pytest.raises(ProjectionError, match="top-k"):
        top_k_renormalise(np.zeros(1, np.int64), np.zeros(1, np.int64), np.ones(1), 1, 0)


def test_parse_methods():
    assert parse_methods("corpus, multitoken,exact") == ("corpus", "multitoken", "exact")
    with pytest.raises(ProjectionError, match="unknown projection method 'embedding'"):
        parse_methods("exact,embedding")
    with pytest.raises(ProjectionError, match="twice"):
        parse_methods("exact,exact")


def trip(*entries):
    a = np.array(entries, dtype=np.float64).reshape(-1, 3)
    return a[:, 0].astype(np.int64), a[:, 1].astype(np.int64), a[:, 2]


def test_compose_precedence_roles_and_exact_pin():
    corpus = trip((0, 1, 3.0), (0, 2, 1.0), (2, 5, 1.0), (3, 4, 2.0))
    multi = trip((0, 3, 1.0), (1, 4, 0.9), (1, 5, 0.1), (2, 0, 1.0))
    roles = trip((4, 6, 1.0))
    exact = (np.array([3]), np.array([0]))
    mat, src = compose(6, 7, [("corpus", corpus), ("multitoken", multi)], roles, exact, k=4)
    dense = mat.toarray()
    np.testing.assert_allclose(dense[0], [0, 0.75, 0.25, 0, 0, 0, 0], atol=1e-7)  # corpus wins
    np.testing.assert_allclose(dense[1], [0, 0, 0, 0, 0.9, 0.1, 0], atol=1e-7)   # corpus never saw 1
    np.testing.assert_allclose(dense[2], [0, 0, 0, 0, 0, 1, 0], atol=1e-7)
    np.testing.assert_array_equal(dense[3], [1, 0, 0, 0, 0, 0, 0])              # exact pinned one-hot
    np.testing.assert_array_equal(dense[4], [0, 0, 0, 0, 0, 0, 1])
    assert dense[5].sum() == 0
    assert src.tolist() == [SOURCE_CORPUS, SOURCE_MULTITOKEN, SOURCE_CORPUS, SOURCE_EXACT, SOURCE_ROLE, 0]


def test_exact_build_on_synthetic_tables():
    student, teacher = synthetic_pair()
    proj = build_projection(student, teacher, BuildConfig(methods=("exact",), top_k=4))
    assert proj.row(2) == {2: 1.0} and proj.row(3) == {1: 1.0} and proj.row(4) == {3: 1.0}
    assert proj.row(5) in ({0: 1.0}, {4: 1.0})          # one of the two teacher b" " tokens
    assert proj.row(0) == {5: 1.0}                       # bos -> designated bos
    assert proj.row(1) == {6: 0.5, 7: 0.5}               # eos -> both teacher eos tokens (none designated)
    assert proj.row(6) == {} and proj.row(7) == {}       # no partner / chat markers stay unmapped
    assert proj.meta["direction"] == "student_to_teacher"
    assert proj.meta["coverage"]["rows"] == {"unmapped": 2, "exact": 4, "multitoken": 0, "corpus": 0, "role": 2}


def test_corpus_without_files_is_an_error():
    student, teacher = synthetic_pair()
    with pytest.raises(ProjectionError, match="corpus files"):
        build_projection(student, teacher, BuildConfig(methods=("corpus", "exact")))
