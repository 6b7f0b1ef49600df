"""Byte-level credit per student token against the float64 definition.

Each sub-unit ("the unit's bytes up to and including student token j, then the student's
boundary") must be bracketed by its lower/upper bounds from one forward, and be exact where no
mass is off the path, including prefixes that end *inside* a teacher token; the per-token credits
must sum to the unit's credit (telescoping), give zero for a self-teacher, give the stop token the
teacher's conditional byte-level probability of ending, and drive k1/k3 exactly as the module doc
says (values and gradients). The tiny enumerable model and the reference are those of
tests/losses/test_bytecredit.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_bytecredit import (BOS, LM, SV_DIG, SV_MB, TV_DIG, TV_MB, _bounds, _digit_lms,
                             assert_bracketed, min_extensions, p_end, p_unit)
from test_bytecredit import _case as case

from xdistill.losses.bytecredit import credit_alignment, evaluate_byte_credit
from xdistill.losses.bytecredit_tokens import evaluate_token_credit, token_units
from xdistill.losses.chunks import chunk_sum
from xdistill.losses.onpolicy import (Clamps, OnPolicyLossSpec, count_onpolicy_units,
                                      input_token_logprobs, onpolicy_loss)


def _case(sv, tv, s_lm, t_lm, text: str, stop: bool, s_ids=None, units: str = "token"):
    return case(sv, tv, s_lm, t_lm, text, stop, s_ids, units=units)


def _sub_refs(c, sv, tv, s_lm, t_lm):
    """Per sub-unit (row-major student tokens of the loss units): (teacher reference, student
    reference, the prefix ends inside a teacher token)."""
    merged, s_ids, t_ids = c["merged"], c["s_ids"], c["t_ids"]
    in_BTs, _ = token_units(merged, c["mask"])
    out = []
    for i in torch.nonzero(in_BTs[0]).flatten().tolist():
        k = int(merged.s_chunk_BTs[0, i])
        s_pos = [p for p in range(len(s_ids)) if merged.s_chunk_BTs[0, p] == k]
        t_pos = [p for p in range(len(t_ids)) if merged.t_chunk_BTt[0, p] == k]
        stop = bool(c["stop"][0, i])
        content = [p for p in s_pos if p <= i and not c["stop"][0, p]]
        beta = b"".join(sv.pieces[s_ids[p]] for p in content)
        ext = [] if stop else min_extensions(sv, s_ids[content[-1]])
        t_bytes = [len(tv.pieces[t_ids[p]]) for p in t_pos]
        inside = len(beta) not in [sum(t_bytes[:n]) for n in range(len(t_bytes) + 1)]
        out.append((p_unit(t_lm, beta, tuple(t_ids[:t_pos[0]]), ext, stop),
                    p_unit(s_lm, beta, tuple(s_ids[:s_pos[0]]), ext, stop), inside))
    return out


def _token_r(c):
    """Per student token of the loss units: the credit r (from the effective teacher log-prob)."""
    ids = torch.tensor([c["s_ids"]])
    t_eff, in_BTs, _ = evaluate_token_credit("k1", "teacher", c["credit"], c["align"], c["stop"],
                                             c["zs"], ids, c["mask"], c["zt"],
                                             torch.tensor([c["t_ids"]]))
    s_lp = input_token_logprobs(c["zs"], ids).double()
    return (t_eff - s_lp)[in_BTs].tolist(), in_BTs


CASES = [("abbab", True, 0), ("abbab", False, 1), ("babaab", True, 2), ("aabba", False, 3),
         ("bbaab", True, 4), ("ababab", False, 5)]


@pytest.mark.parametrize("text,stop,seed", CASES)
def test_sub_unit_bounds_bracket_the_definition(text, stop, seed):
    s_lm, t_lm = LM(SV_MB, 10 + seed), LM(TV_MB, 20 + seed)
    c = _case(SV_MB, TV_MB, s_lm, t_lm, text, stop)
    refs = _sub_refs(c, SV_MB, TV_MB, s_lm, t_lm)
    assert c["credit"].teacher.num_units == len(refs) == int(token_units(c["merged"])[0].sum())
    assert_bracketed(c, refs)


def test_prefixes_ending_inside_a_teacher_token_are_exercised_and_exact_when_on_path():
    """The cases above include prefixes that end inside a teacher token; a teacher that puts all
    of its mass on its own path gives them exactly."""
    inside = 0
    for text, stop, seed in CASES:
        onpath = {}

        def bias(prefix, text=text):
            ids = [BOS] + TV_MB.greedy(text)
            k = len(prefix)
            if tuple(ids[:k]) == prefix and k < len(ids):
                return {t: (30.0 if t == ids[k] else -30.0) for t in range(2, TV_MB.V)}
            return onpath
        s_lm, t_lm = LM(SV_MB, 30 + seed), LM(TV_MB, 40 + seed, bias=bias)
        c = _case(SV_MB, TV_MB, s_lm, t_lm, text, False)
        refs = _sub_refs(c, SV_MB, TV_MB, s_lm, t_lm)
        lb, ub = _bounds(c, "t")
        for n, (ref, _, ins) in enumerate(refs):
            inside += ins
            if ins:
                assert lb[n] == pytest.approx(ref, rel=1e-9, abs=1e-300), (text, n)
    assert inside >= 3


@pytest.mark.parametrize("text,stop,seed", CASES)
def test_token_credits_sum_to_the_unit_credit(text, stop, seed):
    s_lm, t_lm = LM(SV_MB, 50 + seed), LM(TV_MB, 60 + seed)
    tok = _case(SV_MB, TV_MB, s_lm, t_lm, text, stop)
    chk = _case(SV_MB, TV_MB, s_lm, t_lm, text, stop, units="chunk")
    ids = torch.tensor([chk["s_ids"]])
    merged, t_chunk, _ = evaluate_byte_credit("k1", "teacher", chk["credit"], chk["align"],
                                              chk["stop"], chk["zs"], ids, chk["mask"],
                                              chk["zt"], torch.tensor([chk["t_ids"]]))
    s_lp = input_token_logprobs(chk["zs"], ids).double()
    r_BC = t_chunk - chunk_sum(s_lp, merged.s_chunk_BTs, merged.num_chunks)
    r_tok, in_BTs = _token_r(tok)
    r_BTs = torch.zeros(in_BTs.shape, dtype=torch.float64)
    r_BTs[in_BTs] = torch.tensor(r_tok, dtype=torch.float64)
    summed = chunk_sum(r_BTs, merged.s_chunk_BTs, merged.num_chunks)
    ok = torch.zeros_like(r_BC, dtype=torch.bool)
    ok[0, merged.s_chunk_BTs[0][in_BTs[0]].unique()] = True
    assert torch.allclose(summed[ok], r_BC[ok], rtol=1e-10, atol=1e-10)
    assert int(in_BTs.sum()) >= int(ok.sum())


def test_stop_token_gets_the_teacher_conditional_probability_of_ending():
    """'23' '.' <stop>: the period's credit compares "'.', then the student's boundary", the
    stop's compares the end of the text after '.' with it (each against the student's same)."""
    s_lm, t_lm = _digit_lms()
    c = _case(SV_DIG, TV_DIG, s_lm, t_lm, "23.", True)
    r, _ = _token_r(c)
    assert len(r) == 3                                   # '23', '.', stop: one each
    t_ctx, s_ctx = tuple(c["t_ids"][:3]), tuple(c["s_ids"][:2])     # BOS 2 3 / BOS 23
    ext = min_extensions(SV_DIG, SV_DIG.id("."))
    t_dot, s_dot = p_unit(t_lm, b".", t_ctx, ext, False), p_unit(s_lm, b".", s_ctx, ext, False)
    t_end, s_end = p_end(t_lm, b".", t_ctx), p_end(s_lm, b".", s_ctx)
    assert r[1] == pytest.approx(math.log(t_dot) - math.log(s_dot), rel=1e-10)
    assert r[2] == pytest.approx(math.log(t_end / t_dot) - math.log(s_end / s_dot), rel=1e-10)


def test_truncated_digit_still_gets_a_nonpositive_advantage():
    s_lm, t_lm = _digit_lms()
    c = _case(SV_DIG, TV_DIG, s_lm, t_lm, "2.", True, s_ids=[SV_DIG.id("2"), SV_DIG.id(".")])
    r, _ = _token_r(c)
    assert r[0] < -2.0


@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_self_teacher_gives_zero_loss_and_gradient(kind):
    lm = LM(SV_MB, 5)
    c = _case(SV_MB, SV_MB, lm, lm, "abbaab", True)
    z = c["zs"].clone().requires_grad_(True)
    out = onpolicy_loss(OnPolicyLossSpec(kind, credit="byte", byte_units="token"), z,
                        torch.tensor([c["s_ids"]]), c["mask"], align=c["align"],
                        teacher_logits_BTtV=c["zt"], teacher_ids_BTt=torch.tensor([c["t_ids"]]),
                        stop_BTs=c["stop"], byte_credit=c["credit"])
    (g,) = torch.autograd.grad(out.loss, z)
    assert abs(float(out.loss.detach())) < 1e-10 and float(g.abs().max()) < 1e-10


@pytest.mark.parametrize("kind,baseline", [("k1", "none"), ("k1", "mean"), ("k3", "none")])
def test_losses_on_token_units_match_the_definition(kind, baseline):
    """k1: loss = -sum_j clamp(r_j - b) log p(a_j) / N over the student tokens of the units
    (b: their mean under ``mean``), gradient -A_j / N on token j alone; k3 gradchecked."""
    s_lm, t_lm = LM(SV_MB, 70, scale=1.0), LM(TV_MB, 71, scale=1.0)
    c = _case(SV_MB, TV_MB, s_lm, t_lm, "babaab", True)
    ids = torch.tensor([c["s_ids"]])
    spec = OnPolicyLossSpec(kind, credit="byte", byte_units="token", baseline=baseline,
                            clamps=Clamps(loss_max=2.0))
    r, in_BTs = _token_r(c)
    N = len(r)
    s_lp = input_token_logprobs(c["zs"], ids)[0]
    pos = torch.nonzero(in_BTs[0]).flatten().tolist()
    b = sum(r) / N if baseline == "mean" else 0.0
    grad = torch.zeros(len(c["s_ids"]), dtype=torch.float64)
    total = 0.0
    for rj, i in zip(r, pos):
        if kind == "k1":
            adv = min(max(rj - b, -2.0), 2.0)
            total += -adv * float(s_lp[i])
            grad[i] = -adv / N
        else:
            total += min(math.expm1(rj) - rj, 2.0)

    def f(z):
        return onpolicy_loss(spec, z, ids, c["mask"], align=c["align"], teacher_logits_BTtV=c["zt"],
                             teacher_ids_BTt=torch.tensor([c["t_ids"]]), stop_BTs=c["stop"],
                             byte_credit=c["credit"])

    out = f(c["zs"])
    assert out.units == N == count_onpolicy_units(spec, c["mask"], c["align"], stop_BTs=c["stop"])
    assert float(out.loss) == pytest.approx(total / N, rel=1e-9)
    assert N > int(credit_alignment("k1", "teacher", c["align"], c["stop"],
                                    c["mask"]).chunk_valid_BC.sum())
    if kind == "k3":
        assert torch.autograd.gradcheck(lambda z: f(z).loss, (c["zs"].clone().requires_grad_(),))
        return
    z = c["zs"].clone().requires_grad_(True)
    (g_z,) = torch.autograd.grad(f(z).loss, z)
    lp = input_token_logprobs(z, ids)[0]
    (want,) = torch.autograd.grad((grad * lp).sum(), z)
    assert torch.allclose(g_z, want, rtol=1e-9, atol=1e-12)


def test_token_unit_errors_are_clear():
    s_lm, t_lm = LM(SV_MB, 80), LM(TV_MB, 81)
    with pytest.raises(ValueError, match="byte_units"):
        OnPolicyLossSpec("k1", credit="byte", byte_units="tokens")
    with pytest.raises(ValueError, match="applies to k1 and k3"):
        OnPolicyLossSpec("dpca", credit="byte", byte_units="token")
    with pytest.raises(ValueError, match="byte-credit units"):
        _case(SV_MB, TV_MB, s_lm, t_lm, "abbab", False, units="tok")
    ids = torch.tensor([_case(SV_MB, TV_MB, s_lm, t_lm, "abbab", False)["s_ids"]])
    for built, wanted, msg in (("chunk", "token", "built for 'chunk' units"),
                               ("token", "chunk", "built for 'token' units")):
        c = _case(SV_MB, TV_MB, s_lm, t_lm, "abbab", False, units=built)
        with pytest.raises(ValueError, match=msg):
            onpolicy_loss(OnPolicyLossSpec("k1", credit="byte", byte_units=wanted), c["zs"], ids,
                          c["mask"], align=c["align"], teacher_logits_BTtV=c["zt"],
                          teacher_ids_BTt=torch.tensor([c["t_ids"]]), stop_BTs=c["stop"],
                          byte_credit=c["credit"])
