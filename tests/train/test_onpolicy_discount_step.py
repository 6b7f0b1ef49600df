"""``loss.discount`` through the on-policy trainer's step (tiny models, CPU): the plan carries it
to every k1 teacher, a step with byte credit gives a finite loss and a gradient that differs from
the undiscounted one, and a discount outside [0, 1] or with a teacher that is not k1 is one
ConfigError naming the key. The math is tested in tests/losses/test_onpolicy_discount.py."""

from __future__ import annotations

import math

import onpolicy_helpers as H  # pytest puts this test's folder on sys.path
import pytest
import torch

from xdistill.config import from_dict
from xdistill.errors import ConfigError
from xdistill.train.metrics import Timers
from xdistill.train.onpolicy_config import OnPolicyConfig, validate_onpolicy


@pytest.fixture(scope="module")
def lms(credit_lms):
    return credit_lms


def _config(tiny_assets, lms, tmp_path, kinds=("k1", "k1"), **loss):
    teachers = [H.teacher("cross", tiny_assets["tok_t"], lms["cross"], kinds[0]),
                H.teacher("same", tiny_assets["tok_s"], lms["same"], kinds[1])]
    d = H.onpolicy_dict(tiny_assets["tok_s"], teachers, lms["prompts"], tmp_path)
    d["loss"].update(credit="byte", advantage_baseline="mean", loss_max=2.0, **loss)
    return d


def _grads(tiny_assets, lms, tmp_path, discount):
    from xdistill.rollout import rollouts_from_segments
    from xdistill.train.onpolicy import build_onpolicy_run
    from xdistill.train.onpolicy_step import loss_and_backward

    run = build_onpolicy_run(from_dict(OnPolicyConfig, _config(tiny_assets, lms, tmp_path,
                                                               discount=discount)))
    run.mode.pool.start()
    try:
        assert {s.discount for s in run.plan.specs.values()} == {discount}
        ro = rollouts_from_segments(run.plan.student_tok, H.PROMPTS[:4],
                                    [[(" the king is dead.", True)], [(" and so", True)],
                                     [(" of love,", True)], [(" 12 men", True)]], finished=True)
        run.model.zero_grad(set_to_none=True)
        m = loss_and_backward(run, run.mode.scorer(ro), Timers())
        grads = torch.cat([p.grad.flatten() for p in run.model.parameters()
                           if p.grad is not None])
    finally:
        run.mode.pool.close()
    return m, grads


def test_discounted_k1_step(tiny_assets, lms, tmp_path):
    m1, g1 = _grads(tiny_assets, lms, tmp_path / "g1", 1.0)
    m0, g0 = _grads(tiny_assets, lms, tmp_path / "g0", 0.0)
    for m in (m0, m1):
        assert math.isfinite(m["cross/loss"]) and math.isfinite(m["same/loss"])
    assert m1["units/cross"] == m0["units/cross"]    # the units are the same, their credit not
    assert bool(torch.isfinite(g1).all()) and float(g1.abs().max()) > 0
    assert not torch.allclose(g1, g0)


@pytest.mark.parametrize("value", [-0.5, 1.5, float("nan")])
def test_discount_out_of_range_is_a_config_error(tiny_assets, lms, tmp_path, value):
    d = _config(tiny_assets, lms, tmp_path, discount=value)
    with pytest.raises(ConfigError, match=r"loss.discount must lie in \[0, 1\]"):
        validate_onpolicy(from_dict(OnPolicyConfig, d))


def test_discount_needs_k1_teachers(tiny_assets, lms, tmp_path):
    d = _config(tiny_assets, lms, tmp_path, kinds=("k1", "k3"), discount=1.0)
    with pytest.raises(ConfigError, match=r"teachers.1.loss.kind: loss.discount = 1.0 applies "
                                          r"to k1 teachers only; teacher 'same' is 'k3'"):
        validate_onpolicy(from_dict(OnPolicyConfig, d))
    d = _config(tiny_assets, lms, tmp_path, kinds=("k1", "k3"), discount=0.0)
    validate_onpolicy(from_dict(OnPolicyConfig, d))
