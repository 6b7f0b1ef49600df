"""Review s25 (losses): each test demonstrates a defect and FAILS on the reviewed code.

Every test states the expected behaviour in its docstring; the references are float64 values
taken straight from the definitions (or the same call with the package's own default settings).
"""

from __future__ import annotations

import math

import torch

from xdistill.losses import ChunkAlignment, MultiTeacherLoss, TeacherLossInput, TeacherSpec
from xdistill.losses.continuation import ContinuationTrie, continuation_kl
from xdistill.losses.onpolicy import OnPolicyLossSpec, onpolicy_loss
from xdistill.losses.onpolicy_sampled import Clamps, sampled_unit_losses


# --------------------------------------------------------------------------------------------
# continuation.continuation_kl (the "pkl" + continuation term)
# --------------------------------------------------------------------------------------------

# teacher vocabulary 4; student token s -> its teacher pieces. Node (0,) has the classes {1, 2}
# (student tokens 2 and 3) and no END member (no student token is exactly piece 0).
_PIECES = [[1], [2], [0, 1], [0, 2], [3]]
_VS, _VT = len(_PIECES), 4


def _continuation_batch(dtype=torch.float32, seed: int = 0):
    """One row, three chunks: (student [4], teacher [3]), ([2], [0, 1]), ([0], [1]).

    Chunk 0 starts at token 0 and is dropped; chunk 1's student token 2 is spelled by the
    teacher's pieces 0, 1, so it has one continuation row (depth 1, teacher row 1)."""
    s_ids = torch.tensor([[4, 2, 0]])
    t_ids = torch.tensor([[3, 0, 1, 1]])
    align = ChunkAlignment(torch.tensor([[0, 1, 2]]), torch.tensor([[0, 1, 1, 2]]),
                           torch.ones(1, 3, dtype=torch.bool), torch.zeros(1, 3, dtype=torch.bool))
    g = torch.Generator().manual_seed(seed)
    zs = torch.randn(1, 3, _VS, generator=g, dtype=torch.float64).to(dtype)
    zt = torch.randn(1, 4, _VT, generator=g, dtype=torch.float64).to(dtype)
    W = torch.zeros(_VS, _VT)
    for s, p in enumerate(_PIECES):
        W[s, p[0]] = 1.0
    return zs, zt, s_ids, t_ids, align, W.to_sparse_csr()


def test_multi_teacher_continuation_accepts_chunk_size_none():
    """``MultiTeacherLoss(chunk_size=None)`` is documented (``int | None``) and every loss of the
    package treats ``None`` as "one block, the unchunked reference" (``row_block_sum``,
    ``token_logprobs``, ``teacher_score``, ALM's ``_same_width_rows``). A ``pkl`` teacher with a
    ``continuation`` trie passes that ``chunk_size`` on to :func:`continuation_kl`, which does
    ``int(chunk_size)`` and raises ``TypeError``. Expected: the same loss as with the default
    chunk size."""
    zs, zt, s_ids, t_ids, align, W = _continuation_batch(torch.float64)
    trie = ContinuationTrie.from_pieces(_PIECES, _VT)
    spec = TeacherSpec("t", "pkl", projection=W, continuation=trie)
    inp = TeacherLossInput("t", logits_BTtV=zt, input_ids_BTt=t_ids, alignment=align)
    mask = torch.ones(1, 3, dtype=torch.bool)
    chunked, _ = MultiTeacherLoss([spec])(zs, s_ids, mask, [inp])
    whole, _ = MultiTeacherLoss([spec], chunk_size=None)(zs, s_ids, mask, [inp])
    torch.testing.assert_close(whole, chunked)


def test_continuation_kl_float32_renormalises_classes_whose_teacher_mass_underflows():
    """Module doc: when no student token ends at the node, ``Q_j`` is renormalised over the
    classes. ``_teacher_slots`` does this as ``lq_K - log(sum exp(lq_K))`` with the sum taken in
    *linear* space: in float32 (the trainer's dtype) a teacher that gives the node's classes
    ~105 nats in total has ``cls_mass = 0``, ``norm = +inf``, every ``log Q`` becomes ``+inf`` and
    the row's term is silently dropped (value 0, no gradient), although the renormalised
    ``Q_j = softmax(lq_K)`` is a perfectly ordinary distribution (0.73 / 0.27 here) and float64
    gives the right value. Expected: the float32 value matches the float64 definition
    (a log-space renormalisation, ``lq_K - logsumexp(lq_K)``)."""
    zs, zt, s_ids, t_ids, align, _ = _continuation_batch(torch.float32)
    zt[0, 1] = torch.tensor([5.0, -105.0, -106.0, 5.0])   # after piece 0: classes 1, 2 far down
    trie = ContinuationTrie.from_pieces(_PIECES, _VT)
    got = continuation_kl(zs, zt, align, trie, s_ids, t_ids)
    # definition, float64: student row 0 (before chunk 1) grouped by the next piece after 0
    p = torch.softmax(zs[0, 0].double(), -1)
    P = torch.stack([p[2], p[3]]) / (p[2] + p[3])
    Q = torch.softmax(zt[0, 1, [1, 2]].double(), -1)
    expect = float((Q * (Q.log() - P.log())).sum()) / 2       # two loss chunks (chunk 0 dropped)
    assert expect > 0.01
    assert abs(float(got) - expect) <= 1e-4 * expect, (float(got), expect)


# --------------------------------------------------------------------------------------------
# onpolicy_full.full_loss (reverse_kl / jsd / topk_kl with per-sample reward weights)
# --------------------------------------------------------------------------------------------

def test_full_onpolicy_loss_with_all_sample_weights_zero_is_zero_not_nan():
    """With every per-sample weight 0 no row carries loss, so the loss is 0 (and its gradient 0).
    ``onpolicy_full.full_loss`` returns ``(s_logits.sum() * 0.0)``: with a vocabulary-masked
    (``-inf``) student column, which the package allows everywhere ("-inf logits are allowed"),
    that is ``-inf * 0 = NaN``. (The same pattern was fixed in ``MultiTeacherLoss`` by
    ``logits[..., :0].sum()``.)"""
    g = torch.Generator().manual_seed(0)
    B, T, V = 2, 5, 7
    zs = torch.randn(B, T, V, generator=g)
    zs[..., -1] = -math.inf                    # vocabulary padding
    zt = torch.randn(B, T, V, generator=g)
    ids = torch.randint(0, V - 1, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    zs.requires_grad_(True)
    out = onpolicy_loss(OnPolicyLossSpec("reverse_kl"), zs, ids, mask, teacher_logits_BTtV=zt,
                        sample_weight_B=torch.zeros(B))
    assert float(out.loss.detach()) == 0.0, out.loss
    out.loss.backward()
    assert torch.isfinite(zs.grad).all() and float(zs.grad.abs().max()) == 0.0


# --------------------------------------------------------------------------------------------
# onpolicy_sampled.sampled_unit_losses (k3)
# --------------------------------------------------------------------------------------------

def test_k3_loss_clamp_blocks_the_gradient_instead_of_making_it_nan_without_exp_clip():
    """``Clamps`` documents every clamp as optional ("None disables one") and "a clamp that fires
    blocks the gradient through that value". With ``exp_clip=None`` and the default
    ``loss_max=10``, a float32 unit with ``r = 99`` (student chunk log-prob -100, teacher -1) has
    ``expm1(r) = inf``; the loss clamp fires (value 10, correct) but the backward multiplies the
    clamp's zero gradient by ``exp(r) = inf`` inside ``expm1``'s backward: the student gradient
    is NaN, which poisons the whole step. Expected: a zero gradient for the clamped unit."""
    s = torch.tensor([-100.0, -2.0], requires_grad=True)
    t = torch.tensor([-1.0, -1.5])
    loss, _, counts = sampled_unit_losses("k3", s, t, Clamps(logp_min=None, loss_max=10.0,
                                                             exp_clip=None))
    assert counts["loss_clamp"] == 1 and float(loss[0].detach()) == 10.0
    loss.sum().backward()
    assert torch.isfinite(s.grad).all(), s.grad
    assert float(s.grad[0]) == 0.0
    assert abs(float(s.grad[1]) - (1.0 - math.exp(0.5))) < 1e-5  # d k3 / d log p = 1 - e^r


# --------------------------------------------------------------------------------------------
# multi_teacher.MultiTeacherLoss dynamic weights
# --------------------------------------------------------------------------------------------

def test_dynamic_weights_with_alpha_zero_are_the_normalised_priors_not_nan():
    """Module doc: dynamic weights are ``softmax(alpha * score + log(spec.weight))`` and "the
    weights sum to 1"; with ``alpha = 0`` they are the normalised prior weights whatever the
    scores. A top-k teacher sent without its tail log-mass whose top-k mass rounds to 1 in
    float32 scores ``neg_ce = -inf`` when a text token lies outside its top-k; ``alpha * s`` is
    then ``0 * -inf = NaN``, which ``weights`` does not treat (only NaN *scores* are "absent"):
    both weights are NaN and so is the total loss. Expected: weights (0.5, 0.5), a finite
    total."""
    B, T, V, K = 1, 3, 50, 4
    z = torch.zeros(B, T, V)
    z[:, :, :2] = 30.0                                  # confident: top-2 hold all but ~1e-12
    logp = torch.log_softmax(z, -1)
    tv, ti = logp.topk(K, -1)
    ids = torch.tensor([[0, 10, 0]])                    # token 10 (position 1) is outside top-k
    g = torch.Generator().manual_seed(0)
    zs = torch.randn(B, T, V, generator=g)
    other = torch.randn(B, T, V, generator=g)
    specs = [TeacherSpec("topk", "topk_kl"), TeacherSpec("full", "forward_kl")]
    teachers = [TeacherLossInput("topk", topk_logp_BTtK=tv, topk_idx_BTtK=ti),
                TeacherLossInput("full", logits_BTtV=other)]
    loss_fn = MultiTeacherLoss(specs, weighting="dynamic", score="neg_ce", alpha=0.0)
    total, report = loss_fn(zs, ids, torch.ones(B, T, dtype=torch.bool), teachers)
    weights = [report.teachers[n].weight for n in ("topk", "full")]
    assert all(math.isfinite(w) for w in weights), weights
    assert abs(sum(weights) - 1.0) < 1e-6 and abs(weights[0] - 0.5) < 1e-6, weights
    assert math.isfinite(float(total)), total


def test_dynamic_weights_of_tail_less_confident_top_k_teachers_still_sum_to_one():
    """Two top-k teachers sent without their tail log-mass, both so confident that their top-k
    mass rounds to 1, score a text token outside their top-k. Their ``neg_ce`` must stay finite
    (the tail floored like every other log-probability in the losses), so with ``alpha > 0`` the
    dynamic weights still sum to 1 (both teachers have positions); a -inf score for both gave
    weights (0, 0)."""
    B, T, V, K = 1, 3, 50, 4
    teachers, specs = [], []
    for name, hot in (("a", 30.0), ("b", 32.0)):
        z = torch.zeros(B, T, V)
        z[:, :, :2] = hot
        tv, ti = torch.log_softmax(z, -1).topk(K, -1)
        teachers.append(TeacherLossInput(name, topk_logp_BTtK=tv, topk_idx_BTtK=ti))
        specs.append(TeacherSpec(name, "topk_kl"))
    ids = torch.tensor([[0, 10, 0]])
    zs = torch.randn(B, T, V, generator=torch.Generator().manual_seed(0))
    loss_fn = MultiTeacherLoss(specs, weighting="dynamic", score="neg_ce", alpha=1.0)
    total, report = loss_fn(zs, ids, torch.ones(B, T, dtype=torch.bool), teachers)
    weights = [report.teachers[n].weight for n in ("a", "b")]
    assert all(math.isfinite(w) for w in weights) and abs(sum(weights) - 1.0) < 1e-6, weights
    assert math.isfinite(float(total))
