"""Review s22 (off-policy losses): each test demonstrates a defect and FAILS on the reviewed code.

Every test states the expected behaviour in its docstring; the references are float64 values
taken straight from the definitions (or from the package's own autograd reference formula).
"""

from __future__ import annotations

import math

import pytest
import torch

from xdistill.losses import (ChunkAlignment, MultiTeacherLoss, TeacherLossInput, TeacherSpec,
                             projected_kl, topk_forward_kl)
from xdistill.losses.divergences import topk_tail_kl_block, topk_tail_kl_rows
from xdistill.losses.scores import teacher_score


# --------------------------------------------------------------------------------------------
# divergences.topk_tail_kl_block (the fused top-k tail-bucket KL, the "topk_kl" loss)
# --------------------------------------------------------------------------------------------

def _peaked_student(gap: float, V: int = 10, K: int = 3, seed: int = 0):
    """A teacher top-k and a student row whose tail logits sit ``gap`` nats below its top-k."""
    g = torch.Generator().manual_seed(seed)
    zt = torch.randn(1, V, generator=g, dtype=torch.float64)
    vals, idx = torch.log_softmax(zt, -1).topk(K, -1)
    z = torch.full((1, V), -gap / 2, dtype=torch.float64)
    z[0, idx[0]] = gap / 2
    return z, vals, idx


@pytest.mark.parametrize("gap", [94.0, 100.0])
def test_fused_topk_gradient_is_finite_when_the_student_tail_mass_is_subnormal(gap):
    """The module promises finite values and gradients everywhere ("never inf/NaN, gradients
    too"). When the student's tail logits are ~93+ nats below its top-k (the tail mass
    ``S_R = sum exp(z - max)`` becomes subnormal in float32) the fused gradient forms
    ``c_R = w_R / S_R``, which overflows to inf, and the tail columns get ``-inf`` gradients
    (NaN on a vocabulary-masked ``-inf`` column, ``0 * inf``). The float32 autograd formula
    (:func:`topk_tail_kl_rows`, which takes the tail's own logsumexp) is finite and agrees with
    float64, so the fused kernel should too."""
    z, vals, idx = _peaked_student(gap)
    zr = z.clone().requires_grad_(True)
    ref = topk_tail_kl_rows(zr, vals, idx).sum()
    (g_ref,) = torch.autograd.grad(ref, zr)
    _, g32 = topk_tail_kl_block(z.float().clone(), vals.float(), idx, need_grad=True)
    assert torch.isfinite(g32).all(), g32
    torch.testing.assert_close(g32.double(), g_ref, rtol=1e-3, atol=1e-5)


def test_topk_forward_kl_gradient_is_not_nan_with_a_masked_column_and_a_far_tail():
    """End to end through :func:`topk_forward_kl` (float32, the trainer's dtype): a student row
    whose tail logits are 96 nats below its top-k, with one vocabulary-masked (-inf) column,
    must give a finite gradient (module doc: -inf logits are allowed, never NaN)."""
    V, K = 10, 3
    g = torch.Generator().manual_seed(0)
    vals, idx = torch.log_softmax(torch.randn(1, 2, V, generator=g), -1).topk(K, -1)
    z = torch.full((1, 2, V), -48.0)
    z[0, 0, idx[0, 0]] = 48.0
    outside = [v for v in range(V) if v not in idx[0, 0].tolist()]
    z[0, 0, outside[0]] = -math.inf
    z.requires_grad_(True)
    loss = topk_forward_kl(z, vals, idx, torch.ones(1, 2, dtype=torch.bool))
    loss.backward()
    assert torch.isfinite(z.grad).all(), z.grad


def test_fused_topk_value_is_accurate_when_the_student_tail_mass_underflows():
    """With the tail 120 nats below the top-k, float32 ``S_R`` underflows to exactly 0 and the
    fused kernel treats ``p_R`` as 0, flooring ``log p_R`` at ``LOGP_FLOOR = -1e4``: the value is
    ~3188 instead of the true ~37.4 (which float32 autograd :func:`topk_tail_kl_rows` computes
    correctly), and the tail gets no gradient at all. The fused value should match the
    definition (``log p_R = logsumexp(z outside K) - logsumexp(z)``, as documented)."""
    z, vals, idx = _peaked_student(120.0)
    ref = float(topk_tail_kl_rows(z, vals, idx).sum())
    value32, _ = topk_tail_kl_block(z.float().clone(), vals.float(), idx, need_grad=False)
    assert float(value32) == pytest.approx(ref, rel=1e-4)


# --------------------------------------------------------------------------------------------
# scores.teacher_score from top-k outputs
# --------------------------------------------------------------------------------------------

def test_confidence_score_from_topk_is_the_top1_probability_not_the_tail_bucket():
    """``"confidence"`` is ``mean max_v q_j(v)`` over tokens ``v``. From top-k outputs the top-1
    probability is known exactly (the first top-k entry), but ``_row_stats`` takes the max over
    the K top-k entries *and the tail bucket*, which is not a token: for a flat teacher (tail
    mass 0.86 > top-1 0.04) the score is 0.86 instead of 0.04, so dynamic / pick_best weighting
    by confidence favours the flattest teacher."""
    g = torch.Generator().manual_seed(0)
    B, T, V, K = 1, 4, 50, 4
    logp = torch.log_softmax(0.3 * torch.randn(B, T, V, generator=g), -1)
    tv, ti = logp.topk(K, -1)
    inp = TeacherLossInput("t", topk_logp_BTtK=tv, topk_idx_BTtK=ti)
    ids = torch.randint(0, V, (B, T), generator=g)
    got = teacher_score(inp, "confidence", ids, torch.ones(B, T, dtype=torch.bool))
    expect = logp[0, :-1].double().exp().max(-1).values.mean()
    assert float(got) == pytest.approx(float(expect), rel=1e-5)


def test_neg_ce_score_from_topk_uses_the_given_tail_log_mass():
    """The multi-teacher doc: "From top-k outputs the CE uses the tail log-mass for tokens
    outside the top-k". ``_topk_logq`` ignores ``TeacherLossInput.tail_logmass_BTt`` and
    recomputes ``log(1 - sum exp(top-k))``, which is ``log 0 = -inf`` whenever the float32 top-k
    mass rounds to 1 (a confident teacher): one text token outside the top-k at such a position
    makes the teacher's score -inf (dynamic weighting then drops it; with ``alpha = 0`` the
    weights become NaN). Expected: the given tail log-mass (-26.9 here), a finite score."""
    V, K = 50, 4
    z = torch.zeros(1, 3, V)
    z[:, :, :2] = 30.0                                  # top-2 hold all but ~1e-12 of the mass
    logp = torch.log_softmax(z, -1)
    tv, ti = logp.topk(K, -1)
    tail = torch.logsumexp(logp.scatter(-1, ti, -math.inf), -1)
    ids = torch.tensor([[0, 10, 0]])                    # token 10 (position 1) is outside top-k
    inp = TeacherLossInput("t", topk_logp_BTtK=tv, topk_idx_BTtK=ti, tail_logmass_BTt=tail)
    got = teacher_score(inp, "neg_ce", ids, torch.ones(1, 3, dtype=torch.bool))
    expect = (float(tail[0, 0]) + float(logp[0, 1, 0])) / 2
    assert math.isfinite(float(got))
    assert float(got) == pytest.approx(expect, rel=1e-4)


# --------------------------------------------------------------------------------------------
# multi_teacher.MultiTeacherLoss
# --------------------------------------------------------------------------------------------

def _exact_kl_without_exact_chunks():
    g = torch.Generator().manual_seed(0)
    B, T, V = 1, 5, 6
    zs = torch.randn(B, T, V, generator=g)
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    near = zs + 0.1 * torch.randn(B, T, V, generator=g)
    chunks = torch.arange(T)[None]
    align = ChunkAlignment(chunks, chunks.clone(), torch.ones(B, T, dtype=torch.bool),
                           torch.zeros(B, T, dtype=torch.bool))     # valid 1:1 chunks, none exact
    zt = 0.01 * torch.randn(B, T, V, generator=g)
    specs = [TeacherSpec("a", "forward_kl"),
             TeacherSpec("x", "exact_kl", shared_s_idx_N=torch.arange(V),
                         shared_t_idx_N=torch.arange(V))]
    teachers = [TeacherLossInput("a", logits_BTtV=near),
                TeacherLossInput("x", logits_BTtV=zt, input_ids_BTt=ids, alignment=align)]
    return zs, ids, mask, specs, teachers


def test_pick_best_never_picks_an_exact_kl_teacher_with_no_loss_units():
    """An ``exact_kl`` teacher's loss units are its *exact* loss chunks (``count_valid`` and
    ``coverage`` use ``exact_only``). With none in the batch it has nothing to contribute and,
    per the module doc, should get weight 0 and not compete. ``scored_positions`` ignores
    ``exact_only``, so the teacher gets a finite score over its non-exact chunks; here
    pick_best (neg_ce) picks it and the whole distillation loss is exactly 0 (no signal), while
    the other teacher, which has 4 loss tokens, is dropped."""
    zs, ids, mask, specs, teachers = _exact_kl_without_exact_chunks()
    mtl = MultiTeacherLoss(specs, weighting="pick_best", score="neg_ce")
    assert mtl.count_valid(teachers, mask)["x"] == 0
    loss, report = mtl(zs, ids, mask, teachers)
    assert report.teachers["x"].weight == 0.0
    assert float(loss) > 0.0


def test_dynamic_weights_give_no_weight_to_an_exact_kl_teacher_with_no_loss_units():
    """Same setting, dynamic weighting: the unit-less ``exact_kl`` teacher takes ~half the
    weight (its term is 0), silently halving the real teacher's signal. Expected weights:
    1 for the teacher with units, 0 for the one without."""
    zs, ids, mask, specs, teachers = _exact_kl_without_exact_chunks()
    mtl = MultiTeacherLoss(specs, weighting="dynamic", score="neg_entropy")
    _, report = mtl(zs, ids, mask, teachers)
    assert report.teachers["x"].weight == 0.0
    assert report.teachers["a"].weight == pytest.approx(1.0)


def test_total_is_not_nan_when_no_teacher_is_weighted_and_padding_holds_minus_inf():
    """When no teacher gets weight (dynamic weighting, nothing scored in this micro-batch) and
    there is no CE, the total is ``student_logits.sum() * 0.0``, which reads every row: a
    ``-inf`` anywhere in the logits (a padding row, which "may hold anything, -inf included",
    or a vocabulary-masked column) makes the total NaN, and the trainer then skips the whole
    optimizer step as non-finite. Expected: a total of exactly 0 (with a zero gradient)."""
    B, T, V = 1, 5, 6
    g = torch.Generator().manual_seed(0)
    zs = torch.randn(B, T, V, generator=g)
    zs[0, -1] = -math.inf                               # last output row: never used
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    chunks = torch.arange(T)[None]
    no_chunks = ChunkAlignment(chunks, chunks.clone(), torch.zeros(B, T, dtype=torch.bool),
                               torch.zeros(B, T, dtype=torch.bool))
    specs = [TeacherSpec("x", "pkl", projection=torch.eye(V))]
    teachers = [TeacherLossInput("x", logits_BTtV=torch.randn(B, T, V, generator=g),
                                 input_ids_BTt=ids, alignment=no_chunks)]
    z = zs.clone().requires_grad_(True)
    loss, report = MultiTeacherLoss(specs, weighting="dynamic")(z, ids, mask, teachers)
    assert float(loss.detach()) == 0.0
    loss.backward()
    assert torch.isfinite(z.grad).all()


# --------------------------------------------------------------------------------------------
# cross.projected_kl
# --------------------------------------------------------------------------------------------

def test_projected_kl_with_an_empty_support_and_minus_inf_logits_is_zero_not_nan():
    """With a projection that reaches no teacher token (empty support) ``_support_chunk_loss``
    returns ``rows.sum() * 0.0``; a vocabulary-masked ``-inf`` student logit (allowed) turns it
    into NaN. Both restrictions are empty, so the loss is documented/intended to be 0."""
    B, T, Vs, Vt = 1, 4, 5, 7
    g = torch.Generator().manual_seed(0)
    zs = torch.randn(B, T, Vs, generator=g)
    zs[..., 0] = -math.inf
    chunks = torch.arange(T)[None]
    align = ChunkAlignment(chunks, chunks.clone(), torch.ones(B, T, dtype=torch.bool),
                           torch.ones(B, T, dtype=torch.bool))
    proj = torch.zeros(Vs, Vt)
    loss = projected_kl(zs, torch.randn(B, T, Vt, generator=g), align, proj)
    assert float(loss) == 0.0
