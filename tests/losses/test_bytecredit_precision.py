"""Byte-level credit keeps its relative precision where float64 ``1 - x`` cannot.

The bounds are sums of ``pi * mass`` terms. Two things used to cost them their value below
~1e-16: a set difference written as a subtraction (``1 - P(tokens starting with an
extension)`` for the student's boundary, ``range(rho) - exact(rho)`` at each level), and a
floor at 1e-30 (plus ``exp`` underflow below ~1e-308) before the log. The reference here is the
definition of tests/losses/test_bytecredit.py evaluated with 60-digit ``mpmath`` probabilities
(the softmax of the same logits), so its subtractions are exact.
"""

from __future__ import annotations

import math

import mpmath
import pytest
import torch
from test_bytecredit import BOS, LM, Vocab, _case, _refs

from xdistill.losses.bytecredit import (LOG_PROB_MIN, MASS_OTHER, byte_bounds, credit_units,
                                        evaluate_byte_credit)
from xdistill.losses.onpolicy import input_token_logprobs

mpmath.mp.dps = 60


class ExactLM(LM):
    """The same model as :class:`LM`, its probabilities as 60-digit softmaxes of its logits."""

    def p(self, prefix):
        z = [mpmath.mpf(float(v)) for v in self.logp(prefix)]
        e = [mpmath.exp(v) if math.isfinite(float(v)) else mpmath.mpf(0) for v in z]
        total = mpmath.fsum(e)
        return [v / total for v in e]


def _log_bounds(c, side: str):
    z, ids, terms = (c["zt"], c["t_ids"], c["credit"].teacher) if side == "t" else \
        (c["zs"], c["s_ids"], c["credit"].student)
    lp = input_token_logprobs(z, torch.tensor([ids]))
    lb, ub, _, zero = byte_bounds(z, lp, terms)
    return lb.tolist(), ub.tolist(), zero.tolist()


def _assert_log_bracketed(c, refs, exact_units=()):
    """log lb <= log ref <= log ub per side (relative 1e-9), equal on ``exact_units``."""
    for side, col in (("t", 0), ("s", 1)):
        lb, ub, zero = _log_bounds(c, side)
        for n, ref in enumerate(r[col] for r in refs):
            log_ref = float(mpmath.log(ref))
            assert not zero[n]
            assert lb[n] <= log_ref + 1e-9 and log_ref <= ub[n] + 1e-9, (side, n, lb[n],
                                                                         log_ref, ub[n])
            if n in exact_units:
                assert lb[n] == pytest.approx(log_ref, abs=1e-9), (side, n)


SV = Vocab(["1", "2", "3", "12", "31"])
TV = Vocab(["1", "2", "3", "23", "13"])


def _continue_with_2(vocab: Vocab, peak: float, always: bool = False):
    """Bias: after any token ending in '1' (``always``: after any prefix), the tokens starting
    with '2' get logit ``peak``."""
    ids = [i for i in range(2, vocab.V) if vocab.pieces[i].startswith(b"2")]

    def bias(prefix):
        if always or (prefix and vocab.pieces[prefix[-1]].endswith(b"1")):
            return {i: peak for i in ids}
        return {}
    return bias


@pytest.mark.parametrize("peak", [20.0, 45.0, 80.0])
def test_a_boundary_both_models_almost_surely_cross_keeps_its_probability(peak):
    """The student writes "31" + "1" and stops the unit there, although both models almost
    surely continue with a "2" (the student then has the longer token "12"): the unit's
    probability is ``pi * P(the next token does not start with 2)`` ~ e^-peak. Written as ``1 -
    P(starts with 2)`` it is lost to rounding for peak >= ~37 (and floored at 1e-30 beyond 69);
    as the sum of the other tokens' probabilities it keeps full relative precision."""
    s_lm, t_lm = ExactLM(SV, 3, _continue_with_2(SV, peak)), ExactLM(TV, 4, _continue_with_2(TV, peak))
    c = _case(SV, TV, s_lm, t_lm, "311", False, s_ids=[SV.id("31"), SV.id("1")])
    refs = _refs(c, SV, TV, s_lm, t_lm)
    assert float(mpmath.log(refs[-1][1])) < -peak + 10          # the student's unit: ~e^-peak
    _assert_log_bracketed(c, refs, exact_units=(len(refs) - 1,))
    # and the credit is that of the definition: log ref_T - log ref_S
    _, t_chunk, stats = evaluate_byte_credit(
        "k1", "teacher", c["credit"], c["align"], c["stop"], c["zs"],
        torch.tensor([c["s_ids"]]), c["mask"], c["zt"], torch.tensor([c["t_ids"]]))
    b_N, c_N = credit_units(c["align"], c["mask"])
    s_lp = input_token_logprobs(c["zs"], torch.tensor([c["s_ids"]]))
    s_unit = float(s_lp[0, 2])                                  # the last unit is student "1"
    r = float(t_chunk[b_N[-1], c_N[-1]]) - s_unit
    want = float(mpmath.log(refs[-1][0]) - mpmath.log(refs[-1][1]))
    assert r == pytest.approx(want, abs=1e-8)
    assert stats.teacher_floor == 0 and stats.student_floor == 0


def test_the_boundary_mass_counts_the_end_and_role_tokens():
    """The complement of the extension ranges includes the tokens outside the byte-sorted
    vocabulary (here the end token): a model that after the unit puts its mass on ending or
    on '2' gets exactly its probability of ending (plus the text tokens not starting with 2)."""
    sv_ids = [i for i in range(2, SV.V) if SV.pieces[i].startswith(b"2")]

    def s_bias(prefix):
        if prefix and SV.pieces[prefix[-1]].endswith(b"1"):
            return {1: 5.0, **{i: 50.0 for i in sv_ids}}
        return {}
    s_lm, t_lm = ExactLM(SV, 5, s_bias), ExactLM(TV, 6)
    c = _case(SV, TV, s_lm, t_lm, "311", False, s_ids=[SV.id("31"), SV.id("1")])
    assert any(int(k) == MASS_OTHER for k in c["credit"].student.kind_K.tolist())
    _assert_log_bracketed(c, _refs(c, SV, TV, s_lm, t_lm), exact_units=(1,))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_long_units_far_below_1e_30_match_the_exact_definition(seed):
    """One 12-byte unit (the student writes 1|31|31|.., the teacher 13|13|..: no shared
    boundary) from random models that expect a '2' everywhere (every covering costs > 69
    nats): both sides' bounds bracket the 60-digit reference in log space, with no floor."""
    s_lm = ExactLM(SV, 40 + seed, _continue_with_2(SV, 12.0, always=True))
    t_lm = ExactLM(TV, 50 + seed, _continue_with_2(TV, 12.0, always=True))
    c = _case(SV, TV, s_lm, t_lm, "131313131313", False)
    refs = _refs(c, SV, TV, s_lm, t_lm)
    assert len(refs) == 1
    assert max(float(mpmath.log(x)) for x in refs[0]) < math.log(1e-30)
    _assert_log_bracketed(c, refs)


def test_a_unit_below_float64_range_keeps_its_log_probability():
    """A 400-digit unit at ~-2.3 nats a digit (total ~ -920 nats, below float64's ~-745): with
    single-byte vocabularies the bound is the token product, computed in log space."""
    digits = Vocab([str(d) for d in range(10)])
    g = torch.Generator().manual_seed(3)
    text = "".join(str(int(d)) for d in torch.randint(0, 10, (400,), generator=g))
    flat = lambda seed: LM(digits, seed, scale=0.3)            # noqa: E731
    c = _case(digits, digits, flat(7), flat(8), text, False)
    for side in ("s", "t"):
        ids = c["s_ids"] if side == "s" else c["t_ids"]
        z = c["zs"] if side == "s" else c["zt"]
        lp = input_token_logprobs(z, torch.tensor([ids]))
        lb, ub, zero = _log_bounds(c, side)
        assert float(lp.sum()) < -800
        # one unit: the whole string (no shared boundary is needed: identical tokenizations
        # give one chunk per digit, so sum them)
        assert sum(lb) == pytest.approx(float(lp.sum()), abs=1e-6)
        assert not any(zero) and min(lb) > LOG_PROB_MIN
