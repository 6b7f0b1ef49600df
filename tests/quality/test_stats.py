"""Welch / paired t and Holm's adjustment against scipy.stats and hand-computed definitions."""

from __future__ import annotations

import math
import random

import pytest
from scipy import stats as ss

from toyq.stats import compare, format_comparisons, holm, paired, welch


@pytest.mark.parametrize("seed", range(5))
def test_welch_and_paired_match_scipy(seed):
    rng = random.Random(seed)
    n = rng.randint(3, 8)
    a = [rng.gauss(1.8, 0.01) for _ in range(n)]
    b = [x + rng.gauss(0.005, 0.004) for x in a]
    w, ref = welch(a, b), ss.ttest_ind(a, b, equal_var=False)
    assert w.t == pytest.approx(ref.statistic, rel=1e-10)
    assert w.p == pytest.approx(ref.pvalue, rel=1e-9)
    p, ref = paired(dict(enumerate(a)), dict(enumerate(b))), ss.ttest_rel(a, b)
    assert p.t == pytest.approx(ref.statistic, rel=1e-10) and p.df == n - 1
    assert p.p == pytest.approx(ref.pvalue, rel=1e-9)


def test_welch_df_is_welch_satterthwaite_by_hand():
    a, b = [1.0, 2.0, 4.0], [2.0, 2.5, 3.0, 3.5]
    va, vb = (7 / 3) / 3, (5 / 12) / 4  # sample variances 7/3 and 5/12, over n
    t = (7 / 3 - 2.75) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 3)
    r = welch(a, b)
    assert r.t == pytest.approx(t, rel=1e-12) and r.df == pytest.approx(df, rel=1e-12)


def test_paired_uses_only_common_seeds_and_degenerate_cases():
    a, b = {0: 1.0, 1: 2.0, 2: 3.5, 7: 9.0}, {0: 0.5, 1: 1.0, 2: 3.0}
    r, ref = paired(a, b), ss.ttest_rel([1.0, 2.0, 3.5], [0.5, 1.0, 3.0])
    assert r.df == 2 and r.p == pytest.approx(ref.pvalue, rel=1e-9)
    with pytest.raises(ValueError, match="at least 2 pairs"):   # one common seed: undefined
        paired({0: 1.0}, {0: 2.0})
    assert paired({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0}).p == 1.0  # identical arms: no difference
    assert paired([1.0, 2.0, 3.5], [0.5, 1.0, 3.0]) == r        # sequences pair by position
    with pytest.raises(ValueError, match="2 values per arm"):
        welch([1.0], [2.0, 3.0])


def test_holm_from_the_definition():
    # sorted p: 0.01, 0.02, 0.03, 0.5 -> 4*0.01, 3*0.02, 2*0.03, 1*0.5, running max
    assert holm([0.03, 0.5, 0.01, 0.02]) == pytest.approx([0.06, 0.5, 0.04, 0.06])
    assert holm([0.2, 0.3]) == pytest.approx([0.4, 0.4])     # monotone: max(0.4, 0.3) = 0.4
    out = holm([0.01, float("nan"), 0.04])
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1]) and out[2] == pytest.approx(0.04)
    assert holm([0.9, 0.8]) == [1.0, 1.0]                      # capped at 1


def test_compare_adjusts_the_listed_family_and_respects_direction():
    per_seed = {"ce": {s: 1.824 + 0.004 * (s % 3 - 1) for s in range(5)},
                "pkl": {s: 1.813 + 0.004 * (s % 3 - 1) + 0.0005 * s for s in range(5)},
                "null": {s: 1.824 + 0.004 * (s % 3 - 1) + 0.0001 * (-1) ** s for s in range(5)}}
    rows = compare(per_seed, [("pkl", "ce"), ("null", "ce")], higher_is_better=False)
    assert rows[0].gain > 0.008 and rows[0].passes()          # lower bits/byte is better
    assert not rows[1].passes()
    raw = [rows[0].paired.p, rows[1].paired.p]
    assert [r.paired_holm for r in rows] == pytest.approx(holm(raw))
    assert rows[0].welch_holm >= rows[0].welch.p
    table = format_comparisons(rows, "bits/byte")
    assert "| pkl vs ce | 5 / 5 |" in table and "better (Holm p < 0.05)" in table
    with pytest.raises(KeyError, match="arm 'alm'"):
        compare(per_seed, [("alm", "ce")], higher_is_better=False)
    one = compare(dict(per_seed, solo={0: 1.7}), [("solo", "ce"), ("pkl", "ce")],
                  higher_is_better=False)                      # 1 seed: nan, not in the family
    assert math.isnan(one[0].welch.p) and not one[0].passes()
    assert one[1].paired_holm == pytest.approx(one[1].paired.p)


def test_compare_on_shared_seeds_restricts_both_tests():
    """``shared_seeds=True``: Welch and the paired t both use only the seeds both arms finished
    (the confirmation table's rule), checked against scipy on the restricted lists."""
    from scipy import stats as sps

    from toyq.stats import compare

    per_seed = {"a": {0: 0.50, 1: 0.55, 2: 0.52, 3: 0.90}, "b": {0: 0.40, 1: 0.47, 2: 0.41}}
    (row,) = compare(per_seed, [("a", "b")], higher_is_better=True, shared_seeds=True)
    a, b = [0.50, 0.55, 0.52], [0.40, 0.47, 0.41]
    assert row.n_arm == row.n_base == 3
    assert row.gain == pytest.approx(sum(a) / 3 - sum(b) / 3)
    assert row.welch.p == pytest.approx(sps.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-9)
    assert row.paired.p == pytest.approx(sps.ttest_rel(a, b).pvalue, rel=1e-9)
    (full,) = compare(per_seed, [("a", "b")], higher_is_better=True)
    assert full.n_arm == 4 and full.gain > row.gain        # seed 3 counts without the option
