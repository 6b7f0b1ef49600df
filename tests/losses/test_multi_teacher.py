"""MultiTeacherLoss: weighting modes, mixed tokenizers, counts, the typed report, scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from loss_refs import random_alignment, random_projection, softmax

from xdistill.losses import (MultiTeacherLoss, TeacherLossInput, TeacherSpec, cross_entropy,
                             forward_kl, projected_kl, projection_from_csr, topk_forward_kl)
from xdistill.losses.scores import coverage, teacher_score

VS, VT = 9, 13


def _setup(seed=0):
    rng = np.random.default_rng(seed)
    align, s_len, t_len = random_alignment(rng, 2, n_chunks=8, pad=0)
    B, Ts = align.s_chunk_BTs.shape
    Tt = align.t_chunk_BTt.shape[1]
    g = torch.Generator().manual_seed(seed)
    zs = torch.randn(B, Ts, VS, generator=g)
    ids = torch.randint(0, VS, (B, Ts), generator=g)
    mask = torch.ones(B, Ts, dtype=torch.bool)
    near = zs + 0.1 * torch.randn(B, Ts, VS, generator=g)     # a teacher close to the student
    far = 3 * torch.randn(B, Ts, VS, generator=g)             # a noisy teacher
    zt = torch.randn(B, Tt, VT, generator=g)
    t_ids = torch.randint(0, VT, (B, Tt), generator=g)
    import scipy.sparse as sp
    csr = sp.csr_matrix(random_projection(rng, VS, VT))
    P = projection_from_csr(csr.indptr, csr.indices, csr.data, csr.shape)
    logp = torch.log_softmax(far, -1)
    topv, topi = logp.topk(4, -1)
    teachers = [
        TeacherLossInput("near", logits_BTtV=near),
        TeacherLossInput("far", topk_logp_BTtK=topv, topk_idx_BTtK=topi),
        TeacherLossInput("x", logits_BTtV=zt, input_ids_BTt=t_ids, alignment=align),
    ]
    specs = [TeacherSpec("near", "forward_kl", weight=0.5),
             TeacherSpec("far", "topk_kl", weight=0.25),
             TeacherSpec("x", "pkl", weight=2.0, projection=P)]
    return dict(zs=zs, ids=ids, mask=mask, near=near, topv=topv, topi=topi, zt=zt, align=align,
                P=P, teachers=teachers, specs=specs)


def test_static_weights_mix_same_and_cross_tokenizer_teachers():
    c = _setup()
    labels = c["ids"].clone()
    mtl = MultiTeacherLoss(c["specs"], ce_weight=0.3)
    zs = c["zs"].clone().requires_grad_(True)
    loss, report = mtl(zs, c["ids"], c["mask"], c["teachers"], labels_BTs=labels)
    parts = {"near": forward_kl(c["zs"], c["near"], c["mask"]),
             "far": topk_forward_kl(c["zs"], c["topv"], c["topi"], c["mask"]),
             "x": projected_kl(c["zs"], c["zt"], c["align"], c["P"], s_loss_mask_BTs=c["mask"])}
    ce = cross_entropy(c["zs"], labels)
    expect = 0.5 * parts["near"] + 0.25 * parts["far"] + 2.0 * parts["x"] + 0.3 * ce
    assert float(loss.detach()) == pytest.approx(float(expect.detach()), rel=1e-6)
    assert list(report.teachers) == ["near", "far", "x"]
    for name, val in parts.items():
        assert float(report.teachers[name].loss) == pytest.approx(float(val), rel=1e-6)
    near, x = report.teachers["near"], report.teachers["x"]
    assert near.weight == 0.5 and float(near.coverage) == 1.0 and near.score is None
    assert x.coverage.dtype == torch.float64 and 0.0 < float(x.coverage) < 1.0
    assert float(report.ce) == pytest.approx(float(ce), rel=1e-6)
    assert float(report.total) == float(loss.detach()) and not report.total.requires_grad
    loss.backward()
    assert torch.isfinite(zs.grad).all() and zs.grad.abs().sum() > 0


def test_num_valid_per_teacher_and_counts():
    c = _setup(1)
    mtl = MultiTeacherLoss(c["specs"])
    counts = mtl.count_valid(c["teachers"], c["mask"], labels_BTs=c["ids"])
    assert counts["near"] == counts["far"] == int(c["mask"][:, 1:].sum()) == counts["ce"]
    assert 0 < counts["x"] < counts["near"]
    _, local = mtl(c["zs"], c["ids"], c["mask"], c["teachers"])
    doubled = {k: 2 * v for k, v in counts.items()}
    _, glob = mtl(c["zs"], c["ids"], c["mask"], c["teachers"], num_valid=doubled)
    for name in ("near", "far", "x"):
        assert float(glob.teachers[name].loss) == pytest.approx(
            float(local.teachers[name].loss) / 2, rel=1e-6)


def test_coverage_is_a_float64_tensor_of_the_covered_fraction():
    """Kept on the device (no host sync) until the step's one reduction; 0 without loss tokens."""
    c = _setup(1)
    near, _, x = c["teachers"]
    s_mask = c["mask"].clone()
    s_mask[:, 0] = False
    got = coverage(x, c["mask"])
    assert got.dtype == torch.float64 and got.shape == ()
    n_covered = round(float(got) * int(s_mask.sum()))
    assert float(got) == n_covered / int(s_mask.sum()) and 0 < n_covered < int(s_mask.sum())
    assert float(coverage(near, c["mask"])) == 1.0
    none = torch.zeros_like(c["mask"])
    assert float(coverage(near, none)) == 0.0 and float(coverage(x, none)) == 0.0


def _manual_scores(c, kind):
    """Scores straight from the definition (float64 loops)."""
    out = []
    B, Ts = c["ids"].shape
    near = c["near"].double().numpy()
    rows = [(b, i) for b in range(B) for i in range(1, Ts)]
    q_near = [softmax(near[b, i - 1]) for b, i in rows]
    if kind == "neg_ce":
        out.append(np.mean([np.log(q[c["ids"][b, i]]) for q, (b, i) in zip(q_near, rows)]))
    elif kind == "neg_entropy":
        out.append(np.mean([np.sum(q * np.log(q)) for q in q_near]))
    else:
        out.append(np.mean([q.max() for q in q_near]))
    return out[0]


@pytest.mark.parametrize("kind", ["neg_ce", "neg_entropy", "confidence"])
def test_scores_match_definition(kind):
    c = _setup(2)
    got = teacher_score(c["teachers"][0], kind, c["ids"], c["mask"], chunk_size=3)
    assert float(got) == pytest.approx(_manual_scores(c, kind), rel=1e-5)
    for inp in c["teachers"][1:]:
        assert torch.isfinite(teacher_score(inp, kind, c["ids"], c["mask"]))


@pytest.mark.parametrize("kind", ["neg_ce", "neg_entropy", "confidence"])
def test_dynamic_and_pick_best_weights(kind):
    c = _setup(3)
    scores = torch.stack([teacher_score(t, kind, c["ids"], c["mask"]) for t in c["teachers"]])
    prior = torch.tensor([0.5, 0.25, 2.0])
    dyn = MultiTeacherLoss(c["specs"], weighting="dynamic", score=kind, alpha=2.0)
    loss, m = dyn(c["zs"], c["ids"], c["mask"], c["teachers"])
    w = prior * torch.exp(2.0 * scores)
    w = w / w.sum()
    got_w = torch.tensor([m.teachers[s.name].weight for s in c["specs"]])
    assert torch.allclose(got_w, w, rtol=1e-5) and got_w.sum() == pytest.approx(1.0, rel=1e-6)
    expect = sum(float(w[i]) * float(m.teachers[s.name].loss) for i, s in enumerate(c["specs"]))
    assert float(loss) == pytest.approx(expect, rel=1e-5)
    assert float(m.teachers["near"].score) == pytest.approx(float(scores[0]), rel=1e-6)

    best = MultiTeacherLoss(c["specs"], weighting="pick_best", score=kind)
    loss_b, mb = best(c["zs"], c["ids"], c["mask"], c["teachers"])
    k = int(torch.argmax(scores))
    assert [mb.teachers[s.name].weight for s in c["specs"]] == [float(i == k) for i in range(3)]
    assert float(loss_b) == pytest.approx(float(mb.teachers[c["specs"][k].name].loss), rel=1e-6)


@pytest.mark.parametrize("kind", ["neg_ce", "neg_entropy"])
def test_a_teacher_with_nothing_to_score_gets_no_weight(kind):
    """A cross-tokenizer teacher with no loss chunks in a micro-batch scores NaN, not 0 (which
    would beat every real, negative score): weight 0 in both score-based modes."""
    c = _setup(0)
    near, _, x = c["teachers"]
    x_empty = TeacherLossInput("x", logits_BTtV=x.logits_BTtV, input_ids_BTt=x.input_ids_BTt,
                               alignment=x.alignment,
                               loss_mask_BTt=torch.zeros_like(x.input_ids_BTt, dtype=torch.bool))
    assert torch.isnan(teacher_score(x_empty, kind, c["ids"], c["mask"]))
    specs = [TeacherSpec("near", "forward_kl"), TeacherSpec("x", "pkl", projection=c["P"])]
    for weighting in ("pick_best", "dynamic"):
        loss_fn = MultiTeacherLoss(specs, weighting=weighting, score=kind, alpha=5.0)
        loss, rep = loss_fn(c["zs"], c["ids"], c["mask"], [near, x_empty])
        assert (rep.teachers["near"].weight, rep.teachers["x"].weight) == (1.0, 0.0), weighting
        assert float(loss) == pytest.approx(float(rep.teachers["near"].loss), rel=1e-6)
    # nobody to weight: every weight 0 (not NaN), the loss is the CE term alone
    for weighting in ("pick_best", "dynamic"):
        loss_fn = MultiTeacherLoss(specs[1:], weighting=weighting, score=kind, ce_weight=1.0)
        loss, rep = loss_fn(c["zs"], c["ids"], c["mask"], [x_empty], labels_BTs=c["ids"])
        assert rep.teachers["x"].weight == 0.0 and float(loss) == pytest.approx(float(rep.ce))


def test_dynamic_weighting_with_every_prior_weight_zero_is_not_nan():
    c = _setup(3)
    specs = [TeacherSpec(s.name, s.loss, weight=0.0, projection=s.projection) for s in c["specs"]]
    loss_fn = MultiTeacherLoss(specs, weighting="dynamic", ce_weight=1.0)
    loss, rep = loss_fn(c["zs"], c["ids"], c["mask"], c["teachers"], labels_BTs=c["ids"])
    assert [r.weight for r in rep.teachers.values()] == [0.0, 0.0, 0.0]
    assert float(loss) == pytest.approx(float(rep.ce))


def test_pick_best_prefers_the_teacher_that_knows_the_text():
    c = _setup(4)
    sharp = torch.full_like(c["near"], -5.0)
    sharp[:, :-1].scatter_(2, c["ids"][:, 1:].unsqueeze(2), 5.0)   # predicts the actual text
    teachers = [TeacherLossInput("near", logits_BTtV=c["near"]),
                TeacherLossInput("oracle", logits_BTtV=sharp)]
    specs = [TeacherSpec("near", "forward_kl"), TeacherSpec("oracle", "reverse_kl")]
    _, m = MultiTeacherLoss(specs, weighting="pick_best")(c["zs"], c["ids"], c["mask"], teachers)
    assert m.teachers["oracle"].weight == 1.0 and m.teachers["near"].weight == 0.0


def test_bad_configurations_raise():
    c = _setup(5)
    with pytest.raises(ValueError, match="unknown loss"):
        TeacherSpec("a", "kl")
    with pytest.raises(ValueError, match="needs a projection"):
        TeacherSpec("a", "pkl")
    with pytest.raises(ValueError, match="no teacher outputs"):
        MultiTeacherLoss([TeacherSpec("zzz", "forward_kl")])(c["zs"], c["ids"], c["mask"],
                                                             c["teachers"])
    with pytest.raises(ValueError, match="needs alignment"):
        MultiTeacherLoss([TeacherSpec("near", "uld")])(c["zs"], c["ids"], c["mask"],
                                                       c["teachers"])
    hot = [TeacherLossInput("far", topk_logp_BTtK=c["topv"], topk_idx_BTtK=c["topi"])]
    with pytest.raises(ValueError, match="re-tempered"):
        MultiTeacherLoss([TeacherSpec("far", "topk_kl", temperature=2.0)])(
            c["zs"], c["ids"], c["mask"], hot)


def test_teacher_temperature_is_not_applied_twice():
    c = _setup(6)
    tempered = [TeacherLossInput("near", logits_BTtV=c["near"] / 2.0, temperature=2.0)]
    spec = [TeacherSpec("near", "forward_kl", temperature=2.0)]
    loss, _ = MultiTeacherLoss(spec)(c["zs"], c["ids"], c["mask"], tempered)
    ref = forward_kl(c["zs"], c["near"], c["mask"], temperature=2.0)
    assert float(loss) == pytest.approx(float(ref), rel=1e-6)


def test_pkl_with_continuation_adds_the_continuation_term():
    from xdistill.losses import ContinuationTrie, continuation_kl

    c = _setup(2)
    rng = np.random.default_rng(2)
    pieces = [[int(t) for t in rng.integers(0, VT, size=int(rng.integers(1, 4)))]
              for _ in range(VS)]
    trie = ContinuationTrie.from_pieces(pieces, VT)
    x = c["teachers"][2]
    plain = MultiTeacherLoss([TeacherSpec("x", "pkl", projection=c["P"])])
    cont = MultiTeacherLoss([TeacherSpec("x", "pkl", projection=c["P"], continuation=trie)])
    _, m0 = plain(c["zs"], c["ids"], c["mask"], [x])
    _, m1 = cont(c["zs"], c["ids"], c["mask"], [x])
    extra = continuation_kl(c["zs"], c["zt"], c["align"], trie, c["ids"], x.input_ids_BTt,
                            s_loss_mask_BTs=c["mask"])
    assert float(m1.teachers["x"].loss) == pytest.approx(
        float(m0.teachers["x"].loss) + float(extra), rel=1e-6)
    with pytest.raises(ValueError, match="continuation KL extends loss 'pkl'"):
        TeacherSpec("x", "alm", continuation=trie)
    with pytest.raises(ValueError, match="direction 'forward'"):
        TeacherSpec("x", "pkl", projection=c["P"], direction="reverse", continuation=trie)


def test_alm_re_tempers_token_logprobs_taken_at_another_temperature():
    """Outputs carry the worker's token log-probs at the worker's temperature: at another loss
    temperature ALM recomputes them from the logits (same loss as logits alone), and without
    logits it says they cannot be re-tempered instead of using them at the wrong temperature."""
    from xdistill.teacher.outputs import next_token_logprobs

    c = _setup(0)
    x = c["teachers"][2]
    token_logp = next_token_logprobs(x.logits_BTtV, x.input_ids_BTt, 1.0)
    common = dict(input_ids_BTt=x.input_ids_BTt, alignment=x.alignment, temperature=1.0)
    with_tok = TeacherLossInput("x", logits_BTtV=x.logits_BTtV, token_logp_BTt=token_logp, **common)
    logits_only = TeacherLossInput("x", logits_BTtV=x.logits_BTtV, **common)
    tok_only = TeacherLossInput("x", token_logp_BTt=token_logp, **common)
    losses = {}
    for tau in (1.0, 2.0):
        loss_fn = MultiTeacherLoss([TeacherSpec("x", "alm", temperature=tau)])
        a, b = (float(loss_fn(c["zs"], c["ids"], c["mask"], [t])[0]) for t in (with_tok, logits_only))
        assert a == pytest.approx(b, rel=1e-5), tau
        losses[tau] = b
    assert losses[1.0] != pytest.approx(losses[2.0], rel=1e-3)   # the temperature matters here
    at_worker_tau = MultiTeacherLoss([TeacherSpec("x", "alm")])(c["zs"], c["ids"], c["mask"],
                                                                 [tok_only])[0]
    assert float(at_worker_tau) == pytest.approx(losses[1.0], rel=1e-5)
    with pytest.raises(ValueError, match="cannot be re-tempered"):
        MultiTeacherLoss([TeacherSpec("x", "alm", temperature=2.0)])(
            c["zs"], c["ids"], c["mask"], [tok_only])
