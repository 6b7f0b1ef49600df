"""Byte-level credit through the on-policy trainer's step (tiny models, CPU).

``loss.credit = byte`` with a cross-tokenizer teacher (a student BPE of 320 ids, a teacher BPE of
400 ids): rollouts -> scoring -> byte-credit terms -> k1/k3/dpca/simple_opd -> backward. The step
counts one unit for a stop and the content it ends (k1/k3/dpca), reports the floor counter and
the measured error of the covering bounds (``<teacher>/credit_gap``),
gives a finite loss with a gradient, keeps tool spans out of the loss, and a same-tokenizer
teacher keeps token credit. The math is tested against its float64 reference in
tests/losses/test_bytecredit.py.
"""

from __future__ import annotations

import math

import onpolicy_helpers as H  # pytest puts this test's folder on sys.path
import pytest

from xdistill.config import from_dict
from xdistill.errors import ConfigError
from xdistill.losses import ChunkAlignment, loss_chunks
from xdistill.train.onpolicy_config import OnPolicyConfig, validate_onpolicy
from xdistill.train.metrics import Timers


@pytest.fixture(scope="module")
def lms(credit_lms):
    return credit_lms


def _run(tiny_assets, lms, tmp_path, kind, credit="byte"):
    from xdistill.train.onpolicy import build_onpolicy_run

    teachers = [H.teacher("cross", tiny_assets["tok_t"], lms["cross"], kind),
                H.teacher("same", tiny_assets["tok_s"], lms["same"], kind)]
    d = H.onpolicy_dict(tiny_assets["tok_s"], teachers, lms["prompts"], tmp_path)
    d["loss"]["credit"] = credit
    d["rollout"]["max_new_tokens"] = 6           # short answers: some of them stop
    run = build_onpolicy_run(from_dict(OnPolicyConfig, d))
    run.mode.pool.start()
    return run


@pytest.mark.parametrize("kind", ["k1", "k3", "dpca", "simple_opd"])
def test_byte_credit_step(tmp_path, tiny_assets, lms, kind):
    from xdistill.rollout import rollouts_from_segments
    from xdistill.train.onpolicy import rollout_batch
    from xdistill.train.onpolicy_step import loss_and_backward

    run = _run(tiny_assets, lms, tmp_path, kind)
    try:
        assert run.plan.specs["cross"].credit == "byte"
        assert run.plan.specs["same"].credit == "token"   # same tokenizer: token credit is exact
        run.mode.iters = [iter(run.mode.loaders[0])]
        _, _, sampled = rollout_batch(run, 1, Timers())
        ro = rollouts_from_segments(run.plan.student_tok, H.PROMPTS[:4],
                                    [[(" the king is dead.", True)], [(" and so", True)],
                                     [(" of love,", True)], [(" 12 men", True)]], finished=True)
        stopped = run.mode.scorer(ro)
        results = []
        for scored in (sampled, stopped):
            run.model.zero_grad(set_to_none=True)
            m = loss_and_backward(run, scored, Timers())
            grads = [p.grad.abs().max() for p in run.model.parameters() if p.grad is not None]
            results.append((scored, m, grads))
    finally:
        run.mode.pool.close()
    for i, (scored, m, grads) in enumerate(results):
        view = scored.batch.teacher("cross")
        al = ChunkAlignment.from_view(view)
        chunks = int(loss_chunks(al, scored.batch.loss_mask_BTs, view.loss_mask_BTt).sum())
        n_stop = int(scored.stop_BTs.any(1).sum())
        units = m["units/cross"] - m["cross/clamp/unpaired"]
        if kind in ("k1", "k3"):     # one unit for a stop and the content it ends
            assert units == chunks - n_stop
        assert math.isfinite(m["cross/loss"]) and "cross/clamp/credit_floor" in m
        assert m["cross/credit_gap"] >= 0.0 and "same/credit_gap" not in m
        assert 0.0 <= m["cross/credit_gap_seg"] <= m["cross/credit_gap"] + 1e-9
        if i == 0 or kind in ("k1", "k3"):  # segment rollouts carry no behaviour log-probs:
            assert grads and float(max(grads)) > 0  # the PPO ratio of dpca/simple_opd clips
    assert int(results[1][0].stop_BTs.any(1).sum()) == 4


def test_byte_credit_needs_full_teacher_logits(tiny_assets, lms, tmp_path):
    teachers = [H.teacher("cross", tiny_assets["tok_t"], lms["cross"], "k1")]
    teachers[0]["worker"].update(output="topk", top_k=8)
    d = H.onpolicy_dict(tiny_assets["tok_s"], teachers, lms["prompts"], tmp_path)
    d["loss"]["credit"] = "byte"
    with pytest.raises(ConfigError, match="credit = 'byte' needs the teacher's full logits"):
        validate_onpolicy(from_dict(OnPolicyConfig, d))
    d["loss"]["credit"] = "token"
    validate_onpolicy(from_dict(OnPolicyConfig, d))


def test_byte_credit_with_student_token_units_step(tmp_path, tiny_assets, lms):
    """``loss.byte_units = token``: one unit per student token of the loss chunks (the stop and
    the content it ends no longer share one), a finite loss and a gradient; the same-tokenizer
    teacher keeps token credit."""
    from xdistill.losses.bytecredit import credit_alignment
    from xdistill.losses.bytecredit_tokens import count_token_units
    from xdistill.rollout import rollouts_from_segments
    from xdistill.train.onpolicy import build_onpolicy_run
    from xdistill.train.onpolicy_step import loss_and_backward

    teachers = [H.teacher("cross", tiny_assets["tok_t"], lms["cross"], "k1"),
                H.teacher("same", tiny_assets["tok_s"], lms["same"], "k1")]
    d = H.onpolicy_dict(tiny_assets["tok_s"], teachers, lms["prompts"], tmp_path)
    d["loss"].update(credit="byte", byte_units="token", advantage_baseline="mean",
                     loss_max=2.0)
    run = build_onpolicy_run(from_dict(OnPolicyConfig, d))
    run.mode.pool.start()
    try:
        assert run.plan.specs["cross"].byte_units == "token"
        assert run.plan.specs["same"].byte_units == "chunk"
        ro = rollouts_from_segments(run.plan.student_tok, H.PROMPTS[:4],
                                    [[(" the king is dead.", True)], [(" and so", True)],
                                     [(" of love,", True)], [(" 12 men", True)]], finished=True)
        scored = run.mode.scorer(ro)
        m = loss_and_backward(run, scored, Timers())
        grads = [p.grad.abs().max() for p in run.model.parameters() if p.grad is not None]
    finally:
        run.mode.pool.close()
    view = scored.batch.teacher("cross")
    al = ChunkAlignment.from_view(view)
    merged = credit_alignment("k1", "teacher", al, scored.stop_BTs, scored.batch.loss_mask_BTs,
                              view.loss_mask_BTt)
    tokens = count_token_units(merged, scored.batch.loss_mask_BTs, view.loss_mask_BTt)
    chunks = int(loss_chunks(merged, scored.batch.loss_mask_BTs, view.loss_mask_BTt).sum())
    assert m["units/cross"] - m["cross/clamp/unpaired"] == tokens > chunks
    assert math.isfinite(m["cross/loss"]) and m["cross/credit_gap"] >= 0.0
    assert grads and float(max(grads)) > 0


def test_student_token_units_need_byte_credit_and_k1_k3(tiny_assets, lms, tmp_path):
    teachers = [H.teacher("cross", tiny_assets["tok_t"], lms["cross"], "dpca")]
    d = H.onpolicy_dict(tiny_assets["tok_s"], teachers, lms["prompts"], tmp_path)
    d["loss"].update(credit="byte", byte_units="token")
    with pytest.raises(ConfigError, match="byte_units = 'token' needs"):
        validate_onpolicy(from_dict(OnPolicyConfig, d))
    teachers[0]["loss"]["kind"] = "k1"
    d["loss"]["credit"] = "token"
    with pytest.raises(ConfigError, match="byte_units = 'token' needs"):
        validate_onpolicy(from_dict(OnPolicyConfig, d))
    d["loss"]["credit"] = "byte"
    validate_onpolicy(from_dict(OnPolicyConfig, d))


def test_student_token_units_leave_other_kinds_alone(tiny_assets, lms, tmp_path):
    """A cross-tokenizer full-distribution teacher next to a k1 teacher plans with chunk units
    (byte credit is not its credit) where the k1 teacher takes token units."""
    from xdistill.train.onpolicy import build_onpolicy_run

    rkl = H.teacher("rkl", tiny_assets["tok_t"], lms["cross"], "reverse_kl")
    rkl["loss"]["cross"] = "exact"
    teachers = [H.teacher("cross", tiny_assets["tok_t"], lms["cross"], "k1"), rkl]
    d = H.onpolicy_dict(tiny_assets["tok_s"], teachers, lms["prompts"], tmp_path)
    d["loss"].update(credit="byte", byte_units="token")
    run = build_onpolicy_run(from_dict(OnPolicyConfig, d))
    assert run.plan.specs["cross"].byte_units == "token"
    assert run.plan.specs["rkl"].byte_units == "chunk"
