"""The on-policy trainer on one CUDA GPU (skipped without one; run by ``tools/gpu_check.py``).

Tiny models (a student BPE of 320 ids, a cross-tokenizer teacher BPE of 400 ids, a
same-tokenizer teacher), student and teachers on ``cuda``:

* one step on the same hand-written rollouts (segments, so no sampling is involved) gives the
  same loss terms, byte-credit gap and gradients on CUDA as on CPU, for k1 and k3 with byte
  credit and for reverse KL over exact 1:1 chunks (``cross: exact``);
* the ``train onpolicy`` command trains 4 steps on CUDA with byte-credit k1 (sampling with
  HF generate on the GPU): every metric finite, a checkpoint written and resumed.
"""

from __future__ import annotations

import math

import onpolicy_helpers as H  # pytest puts this test's folder on sys.path
import pytest

from xdistill.config import from_dict
from xdistill.train.metrics import Timers
from xdistill.train.onpolicy_config import OnPolicyConfig

pytestmark = [pytest.mark.gpu, pytest.mark.integration]

SEGMENTS = [[(" the king is dead.", True)], [(" and so", True)], [(" of love,", True)],
            [(" 12 men", True)]]


@pytest.fixture(scope="module")
def lms(tiny_assets, tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_onpolicy")
    return {"same": H.save_lm(root / "same", tiny_assets["tok_s"], seed=1, logit_scale=4.0),
            "cross": H.save_lm(root / "cross", tiny_assets["tok_t"], seed=2, logit_scale=4.0),
            "prompts": H.write_prompts(root / "prompts.jsonl")}


def _config(tiny_assets, lms, out, kind: str, device: str) -> dict:
    teachers = [H.teacher("cross", tiny_assets["tok_t"], lms["cross"], kind),
                H.teacher("same", tiny_assets["tok_s"], lms["same"], kind)]
    for t in teachers:
        t["worker"].update(device=device, placement="inprocess")
    if kind == "reverse_kl":                  # exact 1:1 chunks, no projection artifact
        teachers[0]["loss"]["cross"] = "exact"
    d = H.onpolicy_dict(tiny_assets["tok_s"], teachers, lms["prompts"], out)
    d["loss"]["credit"] = "byte" if kind in ("k1", "k3") else "token"
    d["rollout"]["max_new_tokens"] = 6
    d["train"]["device"] = device
    return d


def _one_step(tiny_assets, lms, out, kind: str, device: str):
    from xdistill.rollout import rollouts_from_segments
    from xdistill.train.onpolicy import build_onpolicy_run
    from xdistill.train.onpolicy_step import loss_and_backward

    run = build_onpolicy_run(from_dict(OnPolicyConfig, _config(tiny_assets, lms, out, kind,
                                                               device)))
    run.mode.pool.start()
    try:
        ro = rollouts_from_segments(run.plan.student_tok, H.PROMPTS[:4], SEGMENTS, finished=True)
        scored = run.mode.scorer(ro)
        run.model.zero_grad(set_to_none=True)
        metrics = loss_and_backward(run, scored, Timers())
        grads = {n: p.grad.detach().double().cpu() for n, p in run.model.named_parameters()
                 if p.grad is not None}
    finally:
        run.mode.pool.close()
    assert next(run.model.parameters()).device.type == device
    return metrics, grads


@pytest.mark.parametrize("kind", ["k1", "k3", "reverse_kl"])
def test_onpolicy_step_on_cuda_equals_cpu(tmp_path, tiny_assets, lms, kind):
    cpu_m, cpu_g = _one_step(tiny_assets, lms, tmp_path / "cpu", kind, "cpu")
    gpu_m, gpu_g = _one_step(tiny_assets, lms, tmp_path / "cuda", kind, "cuda")
    keys = [k for k in cpu_m if k.endswith(("/loss", "/credit_gap")) or k.startswith("units/")]
    assert "cross/loss" in keys and "same/loss" in keys
    if kind in ("k1", "k3"):
        assert "cross/credit_gap" in keys
    for k in keys:
        assert gpu_m[k] == pytest.approx(cpu_m[k], rel=1e-4, abs=1e-5), k
    assert cpu_g.keys() == gpu_g.keys() and cpu_g
    for n, g in cpu_g.items():
        scale = float(g.abs().max()) + 1e-6
        assert float((gpu_g[n] - g).abs().max()) <= 1e-3 * scale, n


def test_onpolicy_trainer_on_cuda_trains_and_resumes(tmp_path, tiny_assets, lms):
    from xdistill.metrics import read_metrics
    from xdistill.train.onpolicy import run_onpolicy

    d = _config(tiny_assets, lms, tmp_path, "k1", "cuda")
    d["checkpoint"].update(every=2, keep_last=1)
    run_onpolicy(from_dict(OnPolicyConfig, d))
    steps = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "cross/loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    for r in steps:
        assert "cross/credit_gap" in r
        for k, v in r.items():
            if isinstance(v, float):
                assert math.isfinite(v), (r["step"], k, v)
    d["train"]["steps"] = 6                          # resumed from the step-4 checkpoint
    run_onpolicy(from_dict(OnPolicyConfig, d))
    steps = [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl") if "cross/loss" in r]
    assert steps[-2:] == [5, 6] and steps.count(4) == 1
