"""Review probes (s22) of the on-policy losses: each test fails on the code it was written
against and documents the behaviour the docstrings promise.

Legend: B batch, T tokens, V vocabulary.
"""

from __future__ import annotations

import math

import pytest
import torch

from xdistill.losses import ChunkAlignment
from xdistill.losses.bytecredit import evaluate_byte_credit
from xdistill.losses.onpolicy import (Clamps, OnPolicyLossSpec, input_token_logprobs,
                                      onpolicy_loss, sampled_loss)
from xdistill.rollout.bytecredit import build_byte_terms
from xdistill.tokenization.table import ROLE_BOS, ROLE_EOS, ROLE_TEXT, TokenByteTable


# ------------------------------------------------------------------ stop_advantage = "zero"
def _stop_case(t_stop_logp: float):
    """One row; token 4 is the student's stop token. Sampled-token log-probs at input positions
    (same tokenizer); only the teacher's log-prob of the stop token varies."""
    s = torch.tensor([[0.0, -1.0, -2.0, -0.5, -0.3]], dtype=torch.float64)
    t = torch.tensor([[0.0, -1.5, -1.0, -0.7, t_stop_logp]], dtype=torch.float64)
    mask = torch.ones(1, 5, dtype=torch.bool)
    stop = torch.zeros(1, 5, dtype=torch.bool)
    stop[0, 4] = True
    return s, t, mask, stop


@pytest.mark.parametrize("baseline", ["mean", "token_mean", "clipped_mean"])
def test_zero_stop_advantage_keeps_the_teachers_stop_view_out_of_the_baseline(baseline):
    """``stop_advantage = "zero"`` (module doc of onpolicy.py): the units holding a stop token
    get zero advantage "so the teacher's view of where to stop cannot drive the length". With a
    k1 advantage baseline the stop unit's log-ratio still enters the baseline mean (the
    zeroing happens *after* :func:`center_advantages`), so the teacher's log-prob of the stop
    token shifts the advantage of every other unit of the micro-batch: a teacher that hates the
    stop (-15 nats) turns every content token's advantage positive. SimpleOPD, which zeroes
    stops by construction, leaves them out of its baseline (``scored_N``); k1 should too. The
    gradient w.r.t. the non-stop tokens must not depend on the teacher's stop log-prob."""
    grads = []
    for t_stop in (-0.3, -15.0):
        s, t, mask, stop = _stop_case(t_stop)
        x = s.clone().requires_grad_(True)
        out = sampled_loss("k1", x, t, mask, clamps=Clamps(None, 10.0, None), num_valid=4,
                           zero_BTs=stop, baseline=baseline)
        (g,) = torch.autograd.grad(out.loss, x)
        assert float(g[0, 4]) == 0.0                      # the stop itself is zeroed
        grads.append(g[0, 1:4])
    assert torch.allclose(grads[0], grads[1], atol=1e-12), grads


def test_zero_stop_advantage_through_onpolicy_loss_from_logits():
    """The same leak end to end (same-tokenizer teacher, logits in, k1 with the "mean"
    baseline): changing only the teacher's logit row that predicts the stop token changes the
    student's gradient at the rows of the other tokens."""
    g0 = torch.Generator().manual_seed(0)
    B, T, V = 1, 6, 9
    zs = torch.randn(B, T, V, generator=g0, dtype=torch.float64)
    zt = torch.randn(B, T, V, generator=g0, dtype=torch.float64)
    ids = torch.randint(0, V, (B, T), generator=g0)
    mask = torch.ones(B, T, dtype=torch.bool)
    stop = torch.zeros(B, T, dtype=torch.bool)
    stop[0, T - 1] = True
    spec = OnPolicyLossSpec("k1", baseline="mean", stop_advantage="zero")
    grads = []
    for bump in (0.0, -12.0):
        zt2 = zt.clone()
        zt2[0, T - 2, ids[0, T - 1]] += bump          # the teacher's view of the stop only
        z = zs.clone().requires_grad_(True)
        out = onpolicy_loss(spec, z, ids, mask, teacher_logits_BTtV=zt2, stop_BTs=stop)
        (g,) = torch.autograd.grad(out.loss, z)
        grads.append(g[0, :T - 2])                    # rows predicting the non-stop tokens
    assert torch.allclose(grads[0], grads[1], atol=1e-12)


# ------------------------------------------------------------- byte credit: PROB_FLOOR
DIGITS = [str(d).encode() for d in range(10)]


def _digit_table():
    pieces = [b"", b""] + DIGITS                     # BOS, EOS, then single-byte digits
    roles = [ROLE_BOS, ROLE_EOS] + [ROLE_TEXT] * 10
    return TokenByteTable.from_bytes_list(pieces, roles)


def _digit_logits(ids, peak: float):
    """[1, T, V] logits: after every position, each digit has logit 0 except the next sampled
    digit, which has ``peak`` (BOS impossible)."""
    T, V = len(ids), 12
    z = torch.zeros(1, T, V, dtype=torch.float64)
    z[..., 0] = -math.inf
    for t in range(T - 1):
        z[0, t, ids[t + 1]] = peak
    return z


def test_byte_credit_keeps_the_logratio_of_a_unit_both_models_find_below_1e_30():
    """Byte credit's lower bounds were floored at ``PROB_FLOOR = 1e-30`` before the log, on the
    teacher *and* the student side (fixed: the bounds are sums of probabilities computed in log
    space, tests/losses/test_bytecredit_precision.py). A unit whose bytes both models give less than 1e-30 (a long
    chunk of a random digit / hex / base64 string, where two tokenizers rarely share a
    boundary: 35 digits at ~ -2.3 nats each) then scores ``r = log(1e-30) - log(1e-30) = 0``:
    exactly the failure the module doc of onpolicy.py gives for turning ``logp_min`` off by
    default ("a unit both models find impossible scores r ~ 0"). With a single-byte vocabulary
    on both sides the byte-level probability *is* the token product (no off-path mass, no
    extensions: ``P_lb == P_ub`` exact), so byte credit must equal token credit here; float64
    represents these probabilities (~1e-31 .. 1e-35) without any floor."""
    tab = _digit_table()
    n = 35
    g = torch.Generator().manual_seed(1)
    ids = [0] + (torch.randint(2, 12, (n,), generator=g)).tolist()
    T = len(ids)
    chunk = torch.tensor([[-1] + [0] * n])             # one unit: the whole digit string
    al = ChunkAlignment(chunk, chunk.clone(), torch.ones(1, 1, dtype=torch.bool),
                        torch.zeros(1, 1, dtype=torch.bool))
    mask = torch.ones(1, T, dtype=torch.bool)
    stop = torch.zeros(1, T, dtype=torch.bool)
    I = torch.tensor([ids])
    credit = build_byte_terms(tab, tab, I, I, al, mask, None, stop, units="chunk")
    zs = _digit_logits(ids, 0.0)                       # student: uniform over 10 digits
    zt = _digit_logits(ids, 0.4)                       # teacher: a little more confident
    s_lp, t_lp = input_token_logprobs(zs, I), input_token_logprobs(zt, I)
    token_r = float(t_lp.sum() - s_lp.sum())
    assert float(s_lp.sum()) < math.log(1e-30) and float(t_lp.sum()) < math.log(1e-30)
    assert token_r > 5.0                               # the teacher prefers the unit
    _, t_chunk, _ = evaluate_byte_credit("k1", "teacher", credit, al, stop, zs, I, mask, zt, I)
    byte_r = float(t_chunk[0, 0] - s_lp.sum())
    assert byte_r == pytest.approx(token_r, abs=1e-6), (byte_r, token_r)
