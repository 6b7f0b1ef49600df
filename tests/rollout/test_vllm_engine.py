"""The vLLM rollout backend for real (no mocks): behaviour log-probs against the trainer's forward,
weight sync after an optimizer step, and a short on-policy run with ``rollout.backend: vllm``.

Needs vLLM (``make vllm-env``; ``make test-vllm`` runs this file in ``.venv-vllm``); skipped
elsewhere. One engine (a tiny float32 Llama: head size 32, the smallest vLLM's CPU attention
runs) starts once for the module (~40 s on 2 cores); the on-policy run starts its own.

Legend: B prompts, Tr response tokens.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from rollout_helpers import recomputed_logprobs, tiny_llama
from xdistill.errors import ConfigError
from xdistill.rollout import RolloutConfig, RolloutScorer, SamplingParams, build_engine

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vllm is not installed (make vllm-env; make test-vllm runs these)"),
]

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ("The cat sat on", (("user", "Name a colour."),), "One two three four five six")
# 300 tokens: vLLM caches prompt KV in full blocks (128 tokens on CPU), so this prompt's first
# blocks are served from the prefix cache when it comes again
LONG = " ".join(f"line {i}," for i in range(100))
# float32 engine vs the float32 HF forward: different kernels (vLLM's CPU attention, fused
# q/k/v and gate/up matmuls), the same numbers up to float32 rounding
ATOL = 1e-4


def _config(**kw) -> RolloutConfig:
    return RolloutConfig(backend="vllm", vllm_dtype="float32", max_prompt_len=320,
                         max_new_tokens=12, vllm_kv_cache_gb=0.25, **kw)


@pytest.fixture(scope="module")
def setup(get_tokenizer):
    tok = get_tokenizer("gpt2")
    model = tiny_llama(tok.vocab_size, seed=0, logit_scale=30.0, hidden_size=64, heads=2,
                       kv_heads=1)
    engine = build_engine(_config(), model, tok)
    yield tok, model, engine
    engine.close()


def _close(ro, ref):
    m = ro.response_mask_BTr
    return m, (ro.behaviour_logp_BTr[m] - ref[m]).abs().max().item()


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8)])
def test_behaviour_logprobs_equal_trainer_forward(setup, temperature, top_p):
    tok, model, engine = setup
    ro = engine.generate(PROMPTS, SamplingParams(temperature, top_p, 12, seed=5))
    ref = recomputed_logprobs(tok, model, ro, temperature, top_p)
    m, err = _close(ro, ref)
    assert m.sum() > 0 and ro.temperature == temperature and ro.top_p == top_p
    assert err < ATOL, err
    assert torch.all(ro.behaviour_logp_BTr[~m] == 0)
    assert float(ro.behaviour_logp_BTr[m].mean()) < -0.01  # real sampling, not greedy


def test_seeded_and_prompts_sample_independently(setup):
    tok, model, engine = setup
    a = engine.generate(PROMPTS[:1] * 3, SamplingParams(1.0, 1.0, 12, seed=11))
    b = engine.generate(PROMPTS[:1] * 3, SamplingParams(1.0, 1.0, 12, seed=11))
    c = engine.generate(PROMPTS[:1] * 3, SamplingParams(1.0, 1.0, 12, seed=12))
    assert torch.equal(a.response_ids_BTr, b.response_ids_BTr)
    assert not torch.equal(a.response_ids_BTr, c.response_ids_BTr)
    # the same prompt three times in one call: three different samples (own seed each)
    assert len({tuple(r.tolist()) for r in a.response_ids_BTr}) == 3


def _one_step(tok, model, ro) -> None:
    """One AdamW step of next-token CE on the sampled responses (a stand-in trainer step)."""
    batch = RolloutScorer(tok)(ro).batch
    ids, attn = batch.input_ids_BTs, batch.attention_mask_BTs.long()
    labels = ids.masked_fill(attn == 0, -100)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    model(input_ids=ids, attention_mask=attn, labels=labels).loss.backward()
    opt.step()
    opt.zero_grad()


def test_sync_after_an_optimizer_step(setup):
    tok, model, engine = setup
    engine.sync_weights(model)
    sp = SamplingParams(1.0, 1.0, 12, seed=7)
    prompts = PROMPTS + (LONG,)
    assert len(tok.encode(LONG).ids) > 256
    ro = engine.generate(prompts, sp)
    before = recomputed_logprobs(tok, model, ro, 1.0)
    _one_step(tok, model, ro)
    after = recomputed_logprobs(tok, model, ro, 1.0)
    m = ro.response_mask_BTr
    assert (after[m] - before[m]).abs().max() > 0.05  # the step moved the student
    stale = engine.generate(prompts, sp)  # not synced yet: the engine samples the old weights
    assert torch.equal(stale.response_ids_BTr, ro.response_ids_BTr)
    assert _close(stale, before)[1] < ATOL
    engine.sync_weights(model)  # same prompts again: the prefix cache must not serve old KV
    new = engine.generate(prompts, sp)
    m, err = _close(new, recomputed_logprobs(tok, model, new, 1.0))
    assert m.sum() > 0 and err < ATOL, err


def test_a_padded_vocabulary_is_never_sampled(get_tokenizer):
    """A logit width beyond the tokenizer's ids (Qwen2.5: 151,936 rows for 151,665 ids), with the
    extra rows made likely: vLLM samples only tokenizer ids (allowed_token_ids), and the behaviour
    log-probs are the softmax over them, as the trainer scores them."""
    from xdistill.losses.onpolicy import input_token_logprobs

    tok = get_tokenizer("gpt2")
    V, extra = tok.vocab_size, 300
    model = tiny_llama(V + extra, seed=0, logit_scale=30.0, hidden_size=64, heads=2, kv_heads=1)
    with torch.no_grad():
        model.lm_head.weight[V:] = 3.0 * model.lm_head.weight[:extra]
    engine = build_engine(_config(), model, tok)
    try:
        ro = engine.generate(PROMPTS, SamplingParams(1.0, 1.0, 12, seed=5))
    finally:
        engine.close()
    m = ro.response_mask_BTr
    assert m.sum() > 0 and int(ro.response_ids_BTr[m].max()) < V
    batch = RolloutScorer(tok)(ro).batch
    with torch.no_grad():
        z = model(input_ids=batch.input_ids_BTs,
                  attention_mask=batch.attention_mask_BTs.long()).logits[..., :V]
    lp_BTs = input_token_logprobs(z, batch.input_ids_BTs)
    ref = torch.zeros_like(ro.behaviour_logp_BTr)
    for b in range(ro.batch_size):
        p, r = int(ro.prompt_len_B[b]), int(ro.response_len_B[b])
        ref[b, :r] = lp_BTs[b, p:p + r]
    assert (ro.behaviour_logp_BTr[m] - ref[m]).abs().max().item() < ATOL


def test_cpu_head_size_is_a_config_error(get_tokenizer):
    tok = get_tokenizer("gpt2")
    model = tiny_llama(tok.vocab_size)  # head size 8
    with pytest.raises(ConfigError, match="head size is 8"):
        build_engine(_config(), model, tok)


def _tiny_teachers(root: Path) -> tuple[str, str]:
    from xdistill.tiny import save_tiny_lm

    return (str(save_tiny_lm(root / "teacher_qwen2", "qwen2", seed=1)),
            str(save_tiny_lm(root / "teacher_gpt2", "gpt2", seed=2)))


def _recipe(root: Path, out: Path, steps: int):
    """The tiny on-policy recipe with rollout.backend=vllm (dotted overrides, as on the CLI)."""
    from xdistill.config import load_config
    from xdistill.train.onpolicy_config import OnPolicyConfig

    qwen, gpt = _tiny_teachers(root)
    return load_config(OnPolicyConfig, str(ROOT / "configs" / "onpolicy_tiny_cpu.yaml"), [
        f"teachers.0.worker.model={qwen}", f"teachers.1.worker.model={gpt}",
        f"prompts.paths=[{ROOT / 'configs' / 'prompts_tiny.jsonl'}]",
        # head size 64 / 2 = 32: vLLM's CPU attention needs >= 32
        "student.model_config.hidden_size=64", "student.model_config.num_attention_heads=2",
        "student.model_config.num_key_value_heads=1", "student.model_config.intermediate_size=128",
        "rollout.backend=vllm", "rollout.vllm_dtype=float32", "rollout.vllm_kv_cache_gb=0.25",
        f"train.steps={steps}", "train.tensorboard=false", f"train.out_dir={out}",
        "checkpoint.every=0", "checkpoint.export_hf=false"])


def test_onpolicy_tiny_recipe_trains_with_vllm(tmp_path):
    from xdistill.train.onpolicy import run_onpolicy

    out = tmp_path / "run"
    final = run_onpolicy(_recipe(tmp_path, out, steps=3))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "loss" in r]
    assert steps == [1, 2, 3], steps
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows if "loss" in r)
    assert final["response_len"] > 0 and final["time/generation"] > 0


def test_trainer_syncs_the_engine_after_every_step(tmp_path, get_tokenizer):
    """Inside the trainer's own loop (core.train_step: rollouts from vLLM, teachers, AdamW, then
    the mode's after_update sync), the engine samples from the updated student every step."""
    from xdistill.train import core
    from xdistill.train.onpolicy import build_onpolicy_run

    (tmp_path / "run").mkdir()  # core.train would create it (and lock it)
    run = build_onpolicy_run(_recipe(tmp_path, tmp_path / "run", steps=2))
    tok, engine = run.plan.student_tok, run.mode.engine
    try:
        run.mode.start(run)
        for step in (1, 2):
            before = [p.detach().clone() for p in run.model.parameters()]
            metrics = core.train_step(run, step)
            assert bool(torch.isfinite(torch.tensor(metrics["loss"])))
            assert any(not torch.equal(a, p) for a, p in zip(before, run.model.parameters()))
            ro = engine.generate(PROMPTS, SamplingParams(1.0, 1.0, 12, seed=step))
            err = _close(ro, recomputed_logprobs(tok, run.model, ro, 1.0))[1]
            assert err < ATOL, (step, err)
    finally:
        run.mode.close()


def _losses(out: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def test_resume_with_vllm_rollouts_repeats_the_uninterrupted_run(tmp_path):
    """Run to step 2 (checkpoint), then resumed to 4 by a second run in the same folder: its
    steps 3-4 equal those of an uninterrupted 4-step run (the same 4-step schedule): the engine
    starts from the resumed weights and samples with the step's seed, so rollouts after a resume
    are the ones the run would have drawn."""
    from xdistill.train.onpolicy import run_onpolicy

    whole = tmp_path / "whole"
    run_onpolicy(_recipe(tmp_path, whole, steps=4))
    part = tmp_path / "part"
    for steps in (2, 4):
        cfg = _recipe(tmp_path, part, steps=steps)
        cfg.checkpoint.every, cfg.scheduler.total_steps = 2, 4
        run_onpolicy(cfg)
    a, b = _losses(whole), _losses(part)
    assert sorted(b) == [1, 2, 3, 4], b
    for step in (3, 4):
        assert b[step] == pytest.approx(a[step], rel=1e-5, abs=1e-6), (step, a, b)


def test_real_pair_onpolicy_trains_with_vllm_rollouts(tmp_path):
    """SmolLM2-135M samples with vLLM (float32), Gemma-3-270M scores (k1, byte credit), two
    optimizer steps with the engine synced after each; losses finite, the student changed."""
    from xdistill.assets.paths import model_dir
    from xdistill.config import from_dict
    from xdistill.train.onpolicy import run_onpolicy
    from xdistill.train.onpolicy_config import OnPolicyConfig

    student, teacher = model_dir("smollm2-135m"), model_dir("gemma3-270m")
    if not (student / "config.json").is_file() or not (teacher / "config.json").is_file():
        pytest.skip("the real model assets are not fetched (tools/fetch_assets.py)")
    out = tmp_path / "run"
    cfg = from_dict(OnPolicyConfig, {
        "student": {"path": str(student), "param_dtype": "float32"},
        "student_tokenizer": "smollm2-135m",
        "teachers": [{"name": "gemma", "tokenizer": "gemma3-270m", "add_bos": True,
                      "worker": {"model": str(teacher), "output": "logits", "dtype": "float32"},
                      "loss": {"kind": "k1"}}],
        "prompts": {"paths": [str(ROOT / "configs" / "prompts_tiny.jsonl")], "batch_size": 2},
        "rollout": {"backend": "vllm", "vllm_dtype": "float32", "vllm_kv_cache_gb": 1,
                    "max_new_tokens": 12, "max_prompt_len": 32, "seed": 0},
        "loss": {"chunk_size": 64, "credit": "byte"},
        "optim": {"lr": 1e-5}, "scheduler": {"kind": "constant"},
        "train": {"steps": 2, "out_dir": str(out), "tensorboard": False, "num_threads": 2},
        "checkpoint": {"export_hf": False, "every": 0}})
    final = run_onpolicy(cfg)
    losses = _losses(out)
    assert sorted(losses) == [1, 2] and all(torch.isfinite(torch.tensor(v)) for v in
                                             losses.values())
    assert final["response_len"] > 0 and final["time/generation"] > 0
