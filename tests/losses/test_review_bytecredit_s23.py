"""Review of 69a27fd (byte credit in log space, nonnegative terms): defects found.

The references are the from-definition covering probabilities of tests/losses/test_bytecredit.py
(``_refs``: a sum over every covering token sequence of a tiny enumerable LM).

Checked and found correct (no test here): the new term set against the old signed one on 300
random small vocabularies (role, empty-byte and duplicate-byte tokens, multi-byte extensions
with strict prefixes R, stops, chunk and token units, padded model vocabularies) agrees to 1e-9
in log space wherever the old lower bound was not cancellation noise; ``VocabIndex.without``
(overlapping, nested and out-of-window holes, brute force), ``exact_span`` == ``exact`` (same ids,
contiguous), ``_resum`` chunking with the chunk size set to 1..7, ``block=1`` == ``block=64``,
bfloat16/float32 logits (== their float64 copy), -inf padding columns.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_bytecredit import BOS, LM, SV_MB, TV_MB, Vocab, _case, _refs

from xdistill.losses.bytecredit import byte_bounds
from xdistill.losses.bytecredit_tokens import evaluate_token_credit
from xdistill.losses.onpolicy import input_token_logprobs


class TemperedLM(LM):
    """``base`` at temperature ``tau``: log_softmax(logp / tau) for every prefix."""

    def __init__(self, base: LM, tau: float):
        self.base, self.tau, self.vocab = base, tau, base.vocab

    def logp(self, prefix):
        z = self.base.logp(prefix) / self.tau
        m = z[np.isfinite(z)].max()
        return z - (m + np.log(np.exp(z - m).sum()))


def _side(c, side):
    return (c["zt"], c["t_ids"], c["credit"].teacher) if side == "t" else \
        (c["zs"], c["s_ids"], c["credit"].student)


@pytest.mark.parametrize("text,seed,side,unit", [("bbaab", 4, "t", 0), ("aabba", 3, "t", 1)])
def test_float64_logits_with_a_temperature_are_not_scaled_twice(text, seed, side, unit):
    """Defect: with float64 logits and ``temperature != 1`` every range mass (MASS_RANGE: the
    boundary complement, ``range(rho)`` minus its holes) is computed from ``z / tau**2``.

    ``_log_masses`` does ``z_nV = _scaled(raw_nV, tau)``; ``_scaled`` calls ``raw.double()``,
    which for a float64 tensor is the tensor itself, and then ``div_(tau)`` in place, so
    ``raw_nV`` is now ``z / tau``; ``_range_log_masses(raw_nV, tau, ...)`` then scales the rows
    again (while ``lse_n`` is that of ``z / tau``): the range probabilities are neither the
    model's nor normalized. float32/bfloat16 logits are copied by ``.double()`` and are right,
    so the same logits give different credit by dtype. Here (unit exact: lb == ub) the bounds
    sit ~6 nats below the definition, and in other units the upper bound falls below it.

    Fix: make ``_scaled`` out of place (``return z_nV / tau``) or pass the range code the
    original logits (e.g. ``z_nV = _scaled(raw_nV.clone(), tau)`` / keep ``raw_nV`` untouched).
    """
    tau = 0.5
    s_lm, t_lm = LM(SV_MB, 10 + seed), LM(TV_MB, 20 + seed)
    c = _case(SV_MB, TV_MB, s_lm, t_lm, text, False)
    col = 0 if side == "t" else 1
    ref = math.log(_refs(c, SV_MB, TV_MB, TemperedLM(s_lm, tau), TemperedLM(t_lm, tau))[unit][col])
    z, ids, terms = _side(c, side)
    assert z.dtype == torch.float64
    lp = input_token_logprobs(z, torch.tensor([ids]), temperature=tau)
    lb64, ub64 = (x[unit].item() for x in byte_bounds(z, lp, terms, temperature=tau)[:2])
    lb32, ub32 = (x[unit].item() for x in byte_bounds(z.float(), lp, terms,
                                                       temperature=tau)[:2])
    # float32 logits: the definition (this unit is exact: no mass off the path)
    assert lb32 == pytest.approx(ref, abs=1e-5) and ub32 == pytest.approx(ref, abs=1e-5)
    # float64 logits must agree (got e.g. -15.452 for a reference of -9.646)
    assert lb64 <= ref + 1e-9 <= ub64 + 2e-9, (lb64, ref, ub64)
    assert lb64 == pytest.approx(lb32, abs=1e-5) and ub64 == pytest.approx(ub32, abs=1e-5)


# student: the unit "abc" is written "ab" | "c" although "abc" is a student token (E(ab) = {c});
# teacher: "a" | "bc", with a second id spelling "a" (a byte-fallback duplicate). The token
# sub-unit "ab, then not c": the teacher's own path "a" "bc" violates the boundary, nothing else
# in the teacher's vocabulary sticks out, so its lower bound is exactly 0 (the upper bound stands
# in); its gap holds the duplicate "a" (a re-spelling) and, when the teacher has it, "a" "b".
SV_ABC = Vocab(["a", "b", "c", "ab", "abc"])


@pytest.mark.parametrize("teacher_pieces", [["a", "b", "c", "bc", "a"], ["a", "c", "bc", "a"]])
def test_gap_without_respelling_is_not_below_a_lower_bound_that_took_the_upper_bound(
        teacher_pieces):
    """Defect (introduced): ``byte_bounds`` replaces a lower bound of exactly 0 by the upper
    bound, but leaves its third value ``P_ub'`` (the upper bound without the re-spelling terms)
    at ``0 + gap_without_respelling``, so ``P_ub' < P_lb`` whenever that unit's gap has a
    re-spelling term (a byte-fallback id with the bytes of a path token). Before the change
    ``P_ub' = P_lb + gap >= P_lb`` always; the docstring and
    test_respelling_terms_are_reported_apart state ``lb <= P_ub' <= ub``.
    ``CreditStats.teacher_gap_seg`` = mean(log P_ub' - log P_lb) (the
    logged "gap left by the other segmentations", summed by onpolicy._byte_credit) then gets a
    negative contribution: -0.36 nats here, and ~-1e4 (LOG_PROB_MIN) when the gap is only
    re-spellings (second case: P_ub' = 0 -> clamped to -1e4, the metric's mean ~ -5000).

    Fix: treat ``P_ub'`` like ``P_ub`` on those units, e.g. ``seg_N = torch.where(zero, ub_N,
    seg_N)`` before the clamp (the gap is 0 once the upper bound stands in), or at least
    ``torch.maximum(seg_N, lb_N)``.
    """
    tv = Vocab(teacher_pieces)
    s_lm, t_lm = LM(SV_ABC, 1), LM(tv, 2)
    c = _case(SV_ABC, tv, s_lm, t_lm, "abc", False, s_ids=[SV_ABC.id("ab"), SV_ABC.id("c")],
              units="token")
    assert c["t_ids"][1:] == [tv.id("a"), tv.id("bc")]
    lp = input_token_logprobs(c["zt"], torch.tensor([c["t_ids"]]))
    lb, ub, seg, zero = byte_bounds(c["zt"], lp, c["credit"].teacher)
    assert bool(zero[0]) and bool(c["credit"].teacher.respell_K.any())
    *_, stats = evaluate_token_credit("k1", "teacher", c["credit"], c["align"], c["stop"],
                                      c["zs"], torch.tensor([c["s_ids"]]), c["mask"], c["zt"],
                                      torch.tensor([c["t_ids"]]))
    # the definition brackets still hold for lb/ub (lb == ub here) ...
    ref = _refs_token(c, tv, t_lm)[0]
    assert ref == 0.0 or math.log(ref) <= ub[0].item() + 1e-9
    # ... but P_ub' must lie between the bounds (got lb=-2.417, P_ub'=-2.779 / -1e4)
    assert lb[0].item() <= seg[0].item() + 1e-12 <= ub[0].item() + 2e-12, (lb[0], seg[0], ub[0])
    assert 0.0 <= stats.teacher_gap_seg <= stats.teacher_gap + 1e-12, stats


def _refs_token(c, tv, t_lm):
    """Teacher reference of each token sub-unit (tests/losses/test_bytecredit_tokens.py)."""
    from test_bytecredit_tokens import _sub_refs
    return [r[0] for r in _sub_refs(c, SV_ABC, tv, LM(SV_ABC, 1), t_lm)]


def test_a_minus_inf_path_logprob_does_not_poison_the_later_units():
    """Defect (left by the change, present before it): ``byte_bounds`` forms each term's path
    log-probability as a difference of one cumulative sum over *all* path tokens of the batch,
    ``cum[start + len] - cum[start]``. A single path token with log-prob -inf (a teacher logit of
    -inf at a token of its own tokenization: a masked/banned id, processed logits from a server)
    makes ``cum`` -inf from there on, and every later term -- every later unit of this and the
    following sequences -- gets ``-inf - (-inf) = NaN``: NaN bounds, NaN credit, a NaN loss
    (not counted by credit_floor). The commit handles -inf logits in the masses ("a bound of
    exactly 0 ... had a logit of -inf") but not on the path.

    Here the teacher writes "ab" | "ab" with logit -inf for "ab" at the start: unit 0 is
    legitimately off-path, unit 1 (conditioned on the real prefix) has a finite reference
    (-2.4913) but gets NaN.

    Fix: sum each term's path log-probs per segment (e.g. a segment/index_add sum, or count the
    -inf entries with a separate integer cumsum and set log_pi = -inf where a segment holds one,
    taking the finite cumsum difference elsewhere).
    """
    ab = TV_MB.id("ab")
    s_lm = LM(SV_MB, 1)
    t_lm = LM(TV_MB, 2, bias=lambda p: {ab: -np.inf} if p == (BOS,) else {})
    c = _case(SV_MB, TV_MB, s_lm, t_lm, "abab", False)
    assert c["t_ids"][1:] == [ab, ab] and c["align"].num_chunks == 2
    lp = input_token_logprobs(c["zt"], torch.tensor([c["t_ids"]]))
    assert math.isinf(lp[0, 1].item())
    lb, ub, _, _ = byte_bounds(c["zt"], lp, c["credit"].teacher)
    refs = [math.log(r[0]) for r in _refs(c, SV_MB, TV_MB, s_lm, t_lm)]
    for n, ref in enumerate(refs):
        assert math.isfinite(lb[n].item()) and math.isfinite(ub[n].item()), (n, lb, ub)
        assert lb[n].item() <= ref + 1e-9 <= ub[n].item() + 2e-9, (n, lb[n], ref, ub[n])
