"""Review (s23) of the byte-prefix losses' numerics: ESCD's child term ``-M_g log Q(C(r_g))``.

``xdistill.losses.byteprefix._child_term`` reads every completion mass ``Q(C(r_g))`` as a
difference ``cs[hi] - cs[lo]`` of a float64 cumulative sum of the float32 probabilities ``q`` over
the byte-sorted student tokens, floors it at ``MASS_FLOOR = 1e-30`` and takes its log. These are
the two defect classes just fixed in ``bytecredit.py``:

* cancellation: ``cs[lo]`` is the mass of every student token sorted before the range (often
  O(1)), so the difference has an absolute error of ~1e-16 (measured median 5e-17 over 150k
  random float32 probabilities): a completion mass below ~1e-14 loses its relative precision,
  below ~1e-16 it reads as 0 (then the floor) or as a multiple of an ulp;
* the floor: a correctly summed mass below 1e-30 (log-mass below -69.1) scores ``log 1e-30``
  with a zero gradient, although the value and gradient are well defined;
* (rarer) ``q`` is exponentiated in float32, so a completion log-mass below ~-103.3 underflows
  to 0 whatever the floor.

Each test isolates the child term as ``escd - bpm`` on identical inputs (BPM's root term reads
only the root row; the child term only the row after the sampled token ``a``) and compares it
with a 50-digit mpmath evaluation of the definition. The child-term gradient of ``escd`` w.r.t.
the child row is ``-M (1[j in C] q_j / Q_C - q_j)``.

Suggested fix (``xdistill/losses/byteprefix.py``, ``_child_term``): compute each completion mass
as ``log Q_C`` directly, as a logsumexp of the float32/float64 *log*-probabilities over the range
(a sum of positives only: no cancellation, no exp underflow, no floor; e.g. re-sum directly the
ranges whose cumsum difference is below a threshold, as ``bytecredit._range_masses`` does with
``RESUM_BELOW``, but in log space), with ``LOGP_FLOOR`` kept only for an exactly empty/-inf
range (counted).
"""

from __future__ import annotations

import math

import mpmath
import pytest
import torch
from onpolicy_refs import identity_alignment

from xdistill.losses import BytePrefixTables, bpm, escd
from xdistill.projection.byteprefix import build_byteprefix_map
from xdistill.tokenization.table import ROLE_EOS, ROLE_TEXT, TokenByteTable

mpmath.mp.dps = 50


def _table(pieces):
    return TokenByteTable.from_bytes_list(pieces, [ROLE_TEXT] * (len(pieces) - 1) + [ROLE_EOS])


def _tables(s_pieces, t_pieces):
    return BytePrefixTables.from_map(build_byteprefix_map(_table(s_pieces), _table(t_pieces)))


# (A) the completion set C("x") = {"x"} of a = "ab" (teacher "abx") sorts *after* the heavy
# student tokens "Q", "ab", "w": cs[lo] ~ 1
S_AFTER = [b"Q", b"ab", b"w", b"x", b""]
T_AFTER = [b"Q", b"ab", b"abx", b"w", b"x", b""]
# (B) the completion set C("0") = {"0"} of a = "ab" (teacher "ab0") sorts *first*: cs[lo] = 0,
# the difference is exact and only the floor / float32 exp remain
S_FIRST = [b"0", b"Q", b"ab", b"w", b""]
T_FIRST = [b"0", b"Q", b"ab", b"ab0", b"w", b""]


def _child(s_pieces, t_pieces, member: bytes, child_row, dtype):
    """(child term, its gradient on the child row, ids) of one unit: student 'ab' then the text
    after it; the teacher's root row puts mass M ~ 0.35 on 'ab' + residual (one child group)."""
    tables = _tables(s_pieces, t_pieces)
    a = s_pieces.index(b"ab")
    assert int(tables.a_ptr[a + 1] - tables.a_ptr[a]) == 1
    zs = torch.zeros(1, 2, len(s_pieces), dtype=torch.float64)
    zs[0, 1] = torch.tensor(child_row, dtype=torch.float64)
    zt = torch.zeros(1, 2, len(t_pieces), dtype=torch.float64)
    zt[0, 0, t_pieces.index(b"ab" + member)] = 1.0
    zs, zt = zs.to(dtype).requires_grad_(True), zt.to(dtype)
    ids = torch.tensor([[a, a]])
    align = identity_alignment(1, 2)
    loss_e, stats = escd(zs, zt, align, tables, ids)
    loss_b, _ = bpm(zs, zt, align, tables, ids)
    assert stats.units == 1 and stats.child_groups == 1 and stats.empty_groups == 0
    child = loss_e - loss_b
    (g,) = torch.autograd.grad(child, zs)
    return float(child.detach()), g[0, 1].double(), zs.detach(), zt


def _ref(zs, zt, s_pieces, t_pieces, member: bytes):
    """mpmath (value, gradient on the child row) of ``-M log Q_C`` from the definition."""
    z = [mpmath.mpf(float(v)) for v in zs[0, 1].double()]
    lse = mpmath.log(mpmath.fsum(mpmath.exp(v) for v in z))
    q = [mpmath.exp(v - lse) for v in z]
    zt0 = [mpmath.mpf(float(v)) for v in zt[0, 0].double()]
    M = mpmath.exp(zt0[t_pieces.index(b"ab" + member)]
                   - mpmath.log(mpmath.fsum(mpmath.exp(v) for v in zt0)))
    C = [j for j, p in enumerate(s_pieces) if p and p.startswith(member)]
    QC = mpmath.fsum(q[j] for j in C)
    grad = [-M * ((q[j] / QC if j in C else 0) - q[j]) for j in range(len(z))]
    return float(-M * mpmath.log(QC)), torch.tensor([float(x) for x in grad], dtype=torch.float64)


@pytest.mark.parametrize("log_x", [-38.0, -40.0])
def test_escd_child_value_small_completion_mass_lost_to_cumsum_cancellation(log_x):
    """DEFECT (cancellation): ``mass = cs[hi] - cs[lo]`` with ``cs[lo] ~ 1`` (the student's
    probable tokens sort before the completion range) rounds a completion mass of ~3e-17 / 4e-18
    to exactly 0, which the floor turns into 1e-30: the child term reads 24.33 instead of 13.39
    (log_x = -38) / 14.09 (log_x = -40), i.e. ``M * 69.08`` whatever the student's true mass.
    Float64 logits: the expected accuracy is ~1e-12 relative.

    Fix: sum each completion range directly as a logsumexp of the log-probabilities over
    ``sorted_s[lo:hi]`` (at least for ranges whose cumsum difference is small, as
    ``bytecredit._range_masses`` re-sums below ``RESUM_BELOW``), in ``byteprefix._child_term``.
    """
    row = [-5.0, -5.0, 0.0, log_x, -5.0]   # Q, ab, w (heavy, sorted before x), x, EOS
    got, _, zs, zt = _child(S_AFTER, T_AFTER, b"x", row, torch.float64)
    want, _ = _ref(zs, zt, S_AFTER, T_AFTER, b"x")
    assert got == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("log_x", [-36.0, -40.0])
def test_escd_child_gradient_small_completion_mass_lost_to_cumsum_cancellation(log_x):
    """DEFECT (cancellation, gradient): with the completion range sorted after the heavy tokens,
    the gradient of ``-M log Q_C`` on the completion token's logit (true value ``-M (1 - q_x)`` =
    -0.35219) is -0.36061 at log q_x = -36 (the cumsum difference 2.2e-16-granular: 2.4% off,
    the other tokens' gradients likewise: 0.00238 vs 0.00233), and exactly 0 at log q_x = -40
    (mass rounded to 0, then ``clamp_min(MASS_FLOOR)`` kills the gradient): the loss stops
    pushing up a completion the teacher gives M = 0.35. Float64 logits; a 1e-3 relative
    tolerance is far above rounding.

    Fix: as the value test (direct / log-space range sums in ``byteprefix._child_term``).
    """
    row = [-5.0, -5.0, 0.0, log_x, -5.0]
    _, g, zs, zt = _child(S_AFTER, T_AFTER, b"x", row, torch.float64)
    _, want = _ref(zs, zt, S_AFTER, T_AFTER, b"x")
    assert torch.allclose(g, want, rtol=1e-3, atol=1e-12), (g.tolist(), want.tolist())


def test_escd_child_small_completion_mass_floored_at_mass_floor_float32():
    """DEFECT (floor): the completion range sorts first (``cs[lo] = 0``: the difference is exact)
    and the float32 student gives it log-mass -81.39 (4.5e-36, a normal float32): the mass is
    right but ``clamp_min(MASS_FLOOR = 1e-30)`` replaces it, so the child term reads
    ``M * 69.08`` = 24.33 instead of ``M * 81.39`` = 28.66, and its gradient is exactly 0 instead
    of ``-M (1 - q) = -0.352`` on the completion token (+M q_j on the others). The same class as
    bytecredit's removed 1e-30 floor: both a value change and a zero gradient where the true
    value is well defined.

    Fix: no floor on a positive mass; compute ``log Q_C`` in log space
    (``byteprefix._child_term``), keeping ``LOGP_FLOOR`` only for an exactly empty (-inf) range.
    """
    row = [-80.0, 0.0, 0.0, 0.0, 0.0]              # 0 (the completion), Q, ab, w, EOS
    got, g, zs, zt = _child(S_FIRST, T_FIRST, b"0", row, torch.float32)
    want, want_g = _ref(zs, zt, S_FIRST, T_FIRST, b"0")
    assert math.isfinite(got)
    assert got == pytest.approx(want, rel=1e-4)
    assert torch.allclose(g, want_g, rtol=1e-3, atol=1e-6), (g.tolist(), want_g.tolist())


def test_escd_child_float32_completion_mass_below_exp_underflow():
    """DEFECT (float32 exp underflow; rarer: needs a completion log-mass below ~-103.3, e.g.
    logit gaps of 55+ nats at tau = 0.5): ``q = exp(log_softmax(z / tau))`` is formed in float32
    *before* the float64 cumsum, so q = e^-111.4 becomes 0 and the child term reads
    ``M * 69.08`` (the floor) = 24.33 instead of ``M * 111.39`` = 39.23, with a zero gradient.
    Removing the floor alone would turn this into ``log 0 = -inf``, so the fix must stay in log
    space: a logsumexp of the float32 log-probabilities over the range
    (``byteprefix._child_term``).
    """
    row = [-110.0, 0.0, 0.0, 0.0, 0.0]
    got, g, zs, zt = _child(S_FIRST, T_FIRST, b"0", row, torch.float32)
    want, want_g = _ref(zs, zt, S_FIRST, T_FIRST, b"0")
    assert math.isfinite(got)
    assert got == pytest.approx(want, rel=1e-4)
    assert torch.allclose(g, want_g, rtol=1e-3, atol=1e-6), (g.tolist(), want_g.tolist())
