"""Byte-level credit against a float64 reference computed from the definition.

A tiny language model over a tiny enumerable vocabulary (a distribution for *every* token prefix)
lets the reference sum over every covering token sequence (Byte-Token Representation Lemma,
Phan et al., arXiv 2410.09303): ``P([x])`` = the probability that the text continues with ``x``,
``P(x, end)`` = that it continues with exactly ``x`` and ends, and the unit's event "bytes, then
the student's boundary" = ``P([beta]) - sum_{e in E(a)} P([beta e])``. The implementation sees
only the on-path rows (one forward) and must bracket the reference, be exact where no mass is
off the path, give zero for a self-teacher, and fix the two failures of per-chunk credit: a
truncated answer (student ``2`` vs a digit-splitting teacher whose answer is ``23``) and a stop
whose credit sat on the period.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from xdistill.losses import ChunkAlignment
from xdistill.losses.bytecredit import (byte_logprob, credit_alignment, credit_units,
                                        evaluate_byte_credit, merge_stop_chunks)
from xdistill.losses.onpolicy import (Clamps, OnPolicyLossSpec, count_onpolicy_units,
                                      input_token_logprobs, onpolicy_loss, sampled_loss)
from xdistill.rollout.bytecredit import VocabIndex, build_byte_terms
from xdistill.tokenization.table import ROLE_BOS, ROLE_EOS, ROLE_TEXT, TokenByteTable

from bytecredit_reference import p_cover

BOS, END = 0, 1


class Vocab:
    def __init__(self, pieces):
        self.pieces = [b"", b""] + [p.encode() for p in pieces]
        roles = [ROLE_BOS, ROLE_EOS] + [ROLE_TEXT] * len(pieces)
        self.table = TokenByteTable.from_bytes_list(self.pieces, roles)
        self.V = len(self.pieces)

    def id(self, piece: str) -> int:
        return self.pieces.index(piece.encode())

    def greedy(self, text: str) -> list[int]:
        """Longest-match tokenization (any tokenization works: it defines the on-path rows)."""
        data, out = text.encode(), []
        while data:
            best = max((i for i in range(2, self.V) if data.startswith(self.pieces[i])),
                       key=lambda i: len(self.pieces[i]))
            out.append(best)
            data = data[len(self.pieces[best]):]
        return out


class LM:
    """A distribution for every token prefix: seeded random logits plus ``bias(prefix)``."""

    def __init__(self, vocab: Vocab, seed: int, bias=None, scale: float = 2.0):
        self.vocab, self.seed, self.bias, self.scale = vocab, seed, bias or (lambda p: {}), scale

    def logp(self, prefix: tuple) -> np.ndarray:
        rng = np.random.default_rng([self.seed, len(prefix), *prefix])
        z = rng.normal(size=self.vocab.V) * self.scale
        z[BOS] = -np.inf
        for tid, val in self.bias(prefix).items():
            z[tid] = val
        m = z[np.isfinite(z)].max()
        return z - (m + np.log(np.exp(z - m).sum()))

    def p(self, prefix):
        return np.exp(self.logp(prefix))

    def logits(self, ids: list[int]) -> torch.Tensor:
        """[1, T, V]: row t = log-probs after ids[:t + 1] (the distribution of token t + 1)."""
        return torch.tensor(np.stack([self.logp(tuple(ids[:t + 1])) for t in range(len(ids))]),
                            dtype=torch.float64)[None]


# ----------------------------------------------------------------------- reference (definition)
def p_end(lm: LM, x: bytes, prefix: tuple) -> float:
    q = lm.p(prefix)
    if not x:
        return float(q[END])
    return sum(q[t] * p_end(lm, x[len(lm.vocab.pieces[t]):], prefix + (t,))
               for t in range(2, lm.vocab.V) if x.startswith(lm.vocab.pieces[t]))


def min_extensions(vocab: Vocab, a: int) -> list[bytes]:
    """E(a) from the definition: suffixes making a a longer token, minus those extending another."""
    ab = vocab.pieces[a]
    suf = {p[len(ab):] for p in vocab.pieces[2:] if p.startswith(ab) and len(p) > len(ab)}
    return [s for s in suf if not any(o != s and s.startswith(o) for o in suf)]


def p_unit(lm, beta: bytes, prefix: tuple, ext, stop: bool) -> float:
    if stop:
        return p_end(lm, beta, prefix)
    return p_cover(lm, beta, prefix) - sum(p_cover(lm, beta + e, prefix) for e in ext)


# ----------------------------------------------------------------------------------- the cases
def _chunks(sv: Vocab, tv: Vocab, s_ids, t_ids, stop: bool) -> ChunkAlignment:
    """Minimal byte chunks of the responses (token 0 is BOS on both sides); the final stop
    tokens form their own chunk."""
    s_chunk, t_chunk = [-1] * len(s_ids), [-1] * len(t_ids)
    i = j = 1
    si = tj = 0
    c = 0
    s_end, t_end = len(s_ids) - stop, len(t_ids) - stop
    while i < s_end or j < t_end:
        if si <= tj and i < s_end:
            si += len(sv.pieces[s_ids[i]])
            s_chunk[i] = c
            i += 1
        else:
            tj += len(tv.pieces[t_ids[j]])
            t_chunk[j] = c
            j += 1
        if si == tj:
            c += 1
    if stop:
        s_chunk[-1] = t_chunk[-1] = c
        c += 1
    exact = []
    for k in range(c):
        si_ = [s_ids[i] for i in range(len(s_ids)) if s_chunk[i] == k]
        tj_ = [t_ids[j] for j in range(len(t_ids)) if t_chunk[j] == k]
        exact.append(len(si_) == len(tj_) == 1 and sv.pieces[si_[0]] == tv.pieces[tj_[0]]
                     and sv.pieces[si_[0]] != b"")
    return ChunkAlignment(torch.tensor([s_chunk]), torch.tensor([t_chunk]),
                          torch.ones(1, c, dtype=torch.bool), torch.tensor([exact]))


def _case(sv, tv, s_lm, t_lm, text: str, stop: bool, s_ids=None, kind: str = "k1",
          units: str = "chunk"):
    s_ids = [BOS] + (s_ids or sv.greedy(text)) + ([END] if stop else [])
    t_ids = [BOS] + tv.greedy(text) + ([END] if stop else [])
    align = _chunks(sv, tv, s_ids, t_ids, stop)
    stop_BTs = torch.zeros(1, len(s_ids), dtype=torch.bool)
    stop_BTs[0, -1] = stop
    mask = torch.ones(1, len(s_ids), dtype=torch.bool)
    merged = credit_alignment(kind, "teacher", align, stop_BTs, mask)
    credit = build_byte_terms(sv.table, tv.table, torch.tensor([s_ids]), torch.tensor([t_ids]),
                              merged, mask, None, stop_BTs, units=units)
    zs, zt = s_lm.logits(s_ids), t_lm.logits(t_ids)
    return dict(s_ids=s_ids, t_ids=t_ids, align=align, merged=merged, stop=stop_BTs, mask=mask,
                credit=credit, zs=zs, zt=zt)


def _refs(c, sv, tv, s_lm, t_lm):
    """Per unit: (teacher reference, student reference) from the definition."""
    out = []
    b_N, c_N = credit_units(c["merged"], c["mask"])
    for k in c_N.tolist():
        s_pos = [i for i in range(len(c["s_ids"])) if c["merged"].s_chunk_BTs[0, i] == k]
        t_pos = [j for j in range(len(c["t_ids"])) if c["merged"].t_chunk_BTt[0, j] == k]
        stop = bool(c["stop"][0, s_pos[-1]])
        content = s_pos[:-1] if stop else s_pos
        beta = b"".join(sv.pieces[c["s_ids"][i]] for i in content)
        ext = [] if stop else min_extensions(sv, c["s_ids"][content[-1]])
        out.append((p_unit(t_lm, beta, tuple(c["t_ids"][:t_pos[0]]), ext, stop),
                    p_unit(s_lm, beta, tuple(c["s_ids"][:s_pos[0]]), ext, stop)))
    return out


def _bounds(c, side: str):
    z, ids, terms = (c["zt"], c["t_ids"], c["credit"].teacher) if side == "t" else \
        (c["zs"], c["s_ids"], c["credit"].student)
    lp = input_token_logprobs(z, torch.tensor([ids]))
    lb, ub = byte_logprob(z, lp, terms)
    return lb.exp().tolist(), ub.exp().tolist()


SV_MB = Vocab(["a", "b", "ab", "ba", "aab", "bb"])
TV_MB = Vocab(["a", "b", "aa", "ab", "bab", "abb"])


@pytest.mark.parametrize("text,stop,seed", [("abbab", True, 0), ("abbab", False, 1),
                                            ("babaab", True, 2), ("aabba", False, 3),
                                            ("bbaab", True, 4)])
def test_bounds_bracket_the_exact_covering_probability(text, stop, seed):
    s_lm, t_lm = LM(SV_MB, 10 + seed), LM(TV_MB, 20 + seed)
    c = _case(SV_MB, TV_MB, s_lm, t_lm, text, stop)
    assert_bracketed(c, _refs(c, SV_MB, TV_MB, s_lm, t_lm))


def assert_bracketed(c, refs) -> None:
    """Each side's bounds bracket its reference (``refs``: per unit, (teacher, student, ...)),
    and equal it where the two bounds meet."""
    for side, col in (("t", 0), ("s", 1)):
        lb, ub = _bounds(c, side)
        for n, ref in enumerate(r[col] for r in refs):
            assert lb[n] <= ref * (1 + 1e-12) + 1e-300, (side, n, lb[n], ref)
            assert ref <= ub[n] * (1 + 1e-12), (side, n, ref, ub[n])
            if ub[n] == pytest.approx(lb[n], rel=1e-14):
                assert lb[n] == pytest.approx(ref, rel=1e-10)


def test_some_units_are_exact_and_some_have_a_measured_gap():
    s_lm, t_lm = LM(SV_MB, 30), LM(TV_MB, 31)
    gaps = []
    for text in ("abbab", "babaab", "aabba", "bbaab"):
        c = _case(SV_MB, TV_MB, s_lm, t_lm, text, False)
        lb, ub = _bounds(c, "t")
        gaps += [math.log(u) - math.log(v) for v, u in zip(lb, ub)]
    assert min(gaps) == 0.0 and max(gaps) > 1e-3


# ------------------------------------------------------------ the two failures of chunk credit
SV_DIG = Vocab(["2", "3", "23", ".", "5"])
TV_DIG = Vocab(["2", "3", ".", "5"])          # splits digits


def _digit_lms():
    i2s, i23s, idot_s, i3s = SV_DIG.id("2"), SV_DIG.id("23"), SV_DIG.id("."), SV_DIG.id("3")
    i2t, i3t, idot_t = TV_DIG.id("2"), TV_DIG.id("3"), TV_DIG.id(".")

    def t_bias(prefix):                 # the teacher's answer is 23: every number starts with 2
        if prefix == (BOS,):
            return {i2t: 8.0}
        if prefix == (BOS, i2t):
            return {i3t: 8.0, idot_t: 3.0}
        if prefix[-1] == idot_t:
            return {END: 12.0}
        return {}

    def s_bias(prefix):                 # a cold student: "2" or "23", then mostly "."
        if prefix == (BOS,):
            return {i2s: 5.0, i23s: 5.0}
        if prefix == (BOS, i2s):
            return {idot_s: 5.0, i3s: 2.0}
        if prefix[-1] == idot_s:
            return {END: 4.0}
        return {}
    return LM(SV_DIG, 1, s_bias, 0.5), LM(TV_DIG, 2, t_bias, 0.5)


def _unit_logratios(c, spec_kind="k1", credit="byte"):
    spec = OnPolicyLossSpec(spec_kind, credit=credit)
    if credit == "token":
        s_lp = input_token_logprobs(c["zs"], torch.tensor([c["s_ids"]]))
        t_lp = input_token_logprobs(c["zt"], torch.tensor([c["t_ids"]]))
        from xdistill.losses.chunks import chunk_sum
        a = c["align"]
        return (chunk_sum(t_lp, a.t_chunk_BTt, a.num_chunks)
                - chunk_sum(s_lp, a.s_chunk_BTs, a.num_chunks))[0].tolist()
    merged, t_chunk, _ = evaluate_byte_credit(
        spec.kind, spec.stop_advantage, c["credit"], c["align"], c["stop"], c["zs"],
        torch.tensor([c["s_ids"]]), c["mask"], c["zt"], torch.tensor([c["t_ids"]]))
    s_lp = input_token_logprobs(c["zs"], torch.tensor([c["s_ids"]]))
    from xdistill.losses.chunks import chunk_sum
    s_unit = chunk_sum(s_lp, merged.s_chunk_BTs, merged.num_chunks)
    b_N, c_N = credit_units(merged, c["mask"])
    return (t_chunk - s_unit)[b_N, c_N].tolist()


def test_truncated_digit_gets_a_nonpositive_advantage_when_the_teacher_answer_is_longer():
    """Student writes 2 then '.' (it has the token 23); the teacher's answer is 23. Per-chunk
    credit rewards the truncation (teacher '2' = every number starting with 2); byte credit
    compares "2 and no further digit 3" on both sides and punishes it."""
    s_lm, t_lm = _digit_lms()
    c = _case(SV_DIG, TV_DIG, s_lm, t_lm, "2.", True, s_ids=[SV_DIG.id("2"), SV_DIG.id(".")])
    token = _unit_logratios(c, credit="token")
    byte = _unit_logratios(c)
    assert token[0] > 0.5                      # the old credit: a reward for truncating
    assert byte[0] <= 0.0 and byte[0] < -2.0   # byte credit: the truncation is punished
    # the teacher's value is exact here (single-byte extension, digit-splitting teacher)
    refs = _refs(c, SV_DIG, TV_DIG, s_lm, t_lm)
    lb, ub = _bounds(c, "t")
    assert lb[0] == pytest.approx(refs[0][0], rel=1e-12) and ub[0] == pytest.approx(lb[0])
    assert byte[0] == pytest.approx(math.log(refs[0][0]) - math.log(refs[0][1]), rel=1e-10)


def test_correct_two_digit_answer_is_not_punished():
    s_lm, t_lm = _digit_lms()
    c = _case(SV_DIG, TV_DIG, s_lm, t_lm, "23.", True)
    assert c["s_ids"][1] == SV_DIG.id("23")
    token, byte = _unit_logratios(c, credit="token"), _unit_logratios(c)
    assert byte[0] > 0.0 and byte[0] > _unit_logratios(
        _case(SV_DIG, TV_DIG, s_lm, t_lm, "2.", True, s_ids=[SV_DIG.id("2"), SV_DIG.id(".")]))[0]
    assert token[0] == pytest.approx(byte[0], abs=0.05)   # nothing extends 23: the same credit


def test_stop_unit_credit_is_the_teacher_probability_of_ending_there():
    """The stop is scored with the content it ends: the merged unit's teacher value is the
    teacher's byte-level probability of '.' followed by the end of the text, and the period
    and the stop token get one advantage."""
    s_lm, t_lm = _digit_lms()
    c = _case(SV_DIG, TV_DIG, s_lm, t_lm, "23.", True)
    assert c["merged"].num_chunks == c["align"].num_chunks
    assert int(c["merged"].chunk_valid_BC.sum()) == int(c["align"].chunk_valid_BC.sum()) - 1
    refs = _refs(c, SV_DIG, TV_DIG, s_lm, t_lm)
    t_prefix = tuple(c["t_ids"][:3])               # BOS 2 3
    assert refs[-1][0] == pytest.approx(p_end(t_lm, b".", t_prefix), rel=1e-14)
    lb, _ = _bounds(c, "t")
    assert lb[-1] == pytest.approx(refs[-1][0], rel=1e-12)
    r = _unit_logratios(c)
    assert r[-1] == pytest.approx(math.log(refs[-1][0]) - math.log(refs[-1][1]), rel=1e-10)
    # through k1: d loss / d log p(.) == d loss / d log p(stop) == -A / units
    spec = OnPolicyLossSpec("k1", credit="byte", clamps=Clamps(loss_max=None))
    s_lp = input_token_logprobs(c["zs"], torch.tensor([c["s_ids"]])).detach().requires_grad_()
    t_chunk = evaluate_byte_credit("k1", "teacher", c["credit"], c["align"], c["stop"], c["zs"],
                                   torch.tensor([c["s_ids"]]), c["mask"], c["zt"],
                                   torch.tensor([c["t_ids"]]))[1]
    out = sampled_loss("k1", s_lp, torch.zeros(1, len(c["t_ids"])), c["mask"],
                       align=c["merged"], clamps=spec.clamps, t_chunk_logp_BC=t_chunk)
    (g,) = torch.autograd.grad(out.loss, s_lp)
    n = out.units
    assert g[0, -1].item() == pytest.approx(-r[-1] / n) and g[0, -2].item() == pytest.approx(
        -r[-1] / n)


# ----------------------------------------------------------- invariances, gradients, plumbing
@pytest.mark.parametrize("kind", ["k1", "k3", "dpca", "simple_opd"])
def test_self_teacher_gives_zero_loss_and_gradient(kind):
    lm = LM(SV_MB, 5)
    c = _case(SV_MB, SV_MB, lm, lm, "abbaab", True, kind=kind)
    z = c["zs"].clone().requires_grad_(True)
    ids = torch.tensor([c["s_ids"]])
    cur = input_token_logprobs(c["zs"], ids).detach()
    out = onpolicy_loss(OnPolicyLossSpec(kind, credit="byte"), z, ids, c["mask"],
                        align=c["align"], teacher_logits_BTtV=c["zt"],
                        teacher_ids_BTt=torch.tensor([c["t_ids"]]), stop_BTs=c["stop"],
                        byte_credit=c["credit"], behaviour_logp_BTs=cur, ref_logp_BTs=cur,
                        teacher_token_logp_BTt=input_token_logprobs(c["zt"],
                                                                    torch.tensor([c["t_ids"]])))
    (g,) = torch.autograd.grad(out.loss, z)
    assert abs(float(out.loss.detach())) < 1e-10 and float(g.abs().max()) < 1e-10
    assert out.counters["credit_floor"] == 0


@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_sampled_losses_with_byte_credit_match_the_definition(kind):
    """k1: loss = -sum_u clamp(r_u) log p(u) / N, gradient -A_u / N on every token of u (the
    advantage is a constant); k3: sum_u clamp(e^r - 1 - r) / N, gradchecked (the credit is a
    constant of the student logits: it is computed once, as in training)."""
    s_lm, t_lm = LM(SV_MB, 40, scale=1.0), LM(TV_MB, 41, scale=1.0)
    c = _case(SV_MB, TV_MB, s_lm, t_lm, "babaab", True)
    ids = torch.tensor([c["s_ids"]])
    merged, t_chunk, _ = evaluate_byte_credit(kind, "teacher", c["credit"], c["align"], c["stop"],
                                              c["zs"], ids, c["mask"], c["zt"],
                                              torch.tensor([c["t_ids"]]))
    spec = OnPolicyLossSpec(kind, credit="byte")

    def f(z):
        return sampled_loss(kind, input_token_logprobs(z, ids), torch.zeros(1, len(c["t_ids"])),
                            c["mask"], align=merged, clamps=spec.clamps,
                            t_chunk_logp_BC=t_chunk).loss

    lb_t, _ = _bounds(c, "t")
    lb_s, _ = _bounds(c, "s")
    s_lp = input_token_logprobs(c["zs"], ids)[0]
    b_N, c_N = credit_units(merged, c["mask"])
    N = int(c_N.numel())
    total, grad_lp = 0.0, torch.zeros(len(c["s_ids"]), dtype=torch.float64)
    for n, k in enumerate(c_N.tolist()):
        toks = [i for i in range(len(c["s_ids"])) if merged.s_chunk_BTs[0, i] == k]
        lp = float(sum(s_lp[i] for i in toks))
        r = math.log(lb_t[n]) - math.log(lb_s[n])
        if kind == "k1":
            adv = min(max(r, -10), 10)
            total += -adv * lp
            grad_lp[toks] = -adv / N
        else:
            total += min(math.expm1(r) - r, 10.0)
    assert float(f(c["zs"])) == pytest.approx(total / N, rel=1e-9)
    if kind == "k3":
        assert torch.autograd.gradcheck(f, (c["zs"].clone().requires_grad_(True),))
    else:
        lp_var = s_lp.detach().clone()[None].requires_grad_(True)
        out = sampled_loss(kind, lp_var, torch.zeros(1, len(c["t_ids"])), c["mask"], align=merged,
                           clamps=spec.clamps, t_chunk_logp_BC=t_chunk)
        (g,) = torch.autograd.grad(out.loss, lp_var)
        assert torch.allclose(g[0], grad_lp, rtol=1e-10, atol=1e-12)
    full = onpolicy_loss(spec, c["zs"], ids, c["mask"], align=c["align"],
                         teacher_logits_BTtV=c["zt"], teacher_ids_BTt=torch.tensor([c["t_ids"]]),
                         stop_BTs=c["stop"], byte_credit=c["credit"])
    assert float(full.loss) == pytest.approx(total / N, rel=1e-9)
    assert full.units == N == count_onpolicy_units(spec, c["mask"], c["align"],
                                                   stop_BTs=c["stop"])


def test_merge_needs_a_content_loss_chunk_before_the_stop():
    s_lm, t_lm = LM(SV_MB, 50), LM(TV_MB, 51)
    c = _case(SV_MB, TV_MB, s_lm, t_lm, "abbab", True)
    mask = c["mask"].clone()
    last = int(c["align"].s_chunk_BTs[0, -1])
    mask[0, c["align"].s_chunk_BTs[0] == last - 1] = False      # the content before: no loss
    kept = merge_stop_chunks(c["align"], c["stop"], mask)
    assert torch.equal(kept.s_chunk_BTs, c["align"].s_chunk_BTs)


def test_byte_credit_errors_are_clear():
    s_lm, t_lm = LM(SV_MB, 60), LM(TV_MB, 61)
    c = _case(SV_MB, TV_MB, s_lm, t_lm, "abbab", False)
    ids = torch.tensor([c["s_ids"]])
    with pytest.raises(ValueError, match="credit"):
        OnPolicyLossSpec("k1", credit="bytes")
    with pytest.raises(ValueError, match="byte-credit terms"):
        onpolicy_loss(OnPolicyLossSpec("k1", credit="byte"), c["zs"], ids, c["mask"],
                      align=c["align"], teacher_logits_BTtV=c["zt"],
                      teacher_ids_BTt=torch.tensor([c["t_ids"]]))
    with pytest.raises(ValueError, match="full logits"):
        onpolicy_loss(OnPolicyLossSpec("k1", credit="byte"), c["zs"], ids, c["mask"],
                      align=c["align"], byte_credit=c["credit"],
                      teacher_token_logp_BTt=torch.zeros(1, len(c["t_ids"])))


def test_extensions_are_minimal_and_prefix_free():
    v = Vocab(["2", "23", "234", "25", "2x", "3"])
    E, R = VocabIndex(v.table).extensions(v.id("2"))
    assert sorted(E) == [b"3", b"5", b"x"] and R == ()
    assert sorted(E) == sorted(min_extensions(v, v.id("2")))
    v2 = Vocab(["a", "abc", "abd"])
    E2, R2 = VocabIndex(v2.table).extensions(v2.id("a"))
    assert sorted(E2) == [b"bc", b"bd"] and R2 == (b"b",)


TV_DUP = Vocab(["a", "b", "aa", "ab", "bab", "abb", "a", "b"])   # ids 8, 9 re-spell "a", "b"


@pytest.mark.parametrize("text,stop,seed", [("bba", False, 5), ("babaab", True, 6)])
def test_respelling_terms_are_reported_apart(text, stop, seed):
    """A second id with the bytes of a path token (a byte-fallback id) stays in the upper bound,
    which still brackets the definition's covering probability; ``byte_bounds``' third value
    leaves exactly those terms out: it lies between the bounds and equals ``P_ub`` when the
    re-spelling ids get no mass."""
    from xdistill.losses.bytecredit import byte_bounds
    dup = [TV_DUP.V - 2, TV_DUP.V - 1]
    for bias, loose in ((None, True), (lambda p: {d: -np.inf for d in dup}, False)):
        s_lm, t_lm = LM(SV_MB, 30 + seed), LM(TV_DUP, 40 + seed, bias=bias)
        c = _case(SV_MB, TV_DUP, s_lm, t_lm, text, stop)
        assert bool(c["credit"].teacher.respell_K.any())
        refs = [r[0] for r in _refs(c, SV_MB, TV_DUP, s_lm, t_lm)]
        lp = input_token_logprobs(c["zt"], torch.tensor([c["t_ids"]]))
        lb, ub, seg = (x.exp() for x in byte_bounds(c["zt"], lp, c["credit"].teacher)[:3])
        for n, ref in enumerate(refs):
            assert float(lb[n]) <= ref * (1 + 1e-12) and ref <= float(ub[n]) * (1 + 1e-12)
        assert bool((lb <= seg * (1 + 1e-12)).all()) and bool((seg <= ub * (1 + 1e-12)).all())
        assert bool((seg < ub * (1 - 1e-9)).any()) == loose
