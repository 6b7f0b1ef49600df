"""HF generate backend: behaviour log-probs, reproducibility, stop handling; config and vLLM gate."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from rollout_helpers import recomputed_logprobs, tiny_llama
from xdistill.config import from_dict
from xdistill.errors import ConfigError
from xdistill.rollout import (HFGenerateEngine, RolloutConfig, SamplingParams, build_engine,
                              sampling_for_step)

PROMPTS = ("The cat sat on", (("user", "Name a colour."),), "One two three four five six")


@pytest.fixture(scope="module")
def setup(get_tokenizer):
    tok = get_tokenizer("gpt2")
    return tok, tiny_llama(tok.vocab_size, seed=0, logit_scale=30.0)


@pytest.mark.parametrize("temperature,top_p", [(0.7, 1.0), (1.0, 1.0), (1.3, 0.8)])
def test_behaviour_logprobs_equal_recomputed_forward(setup, temperature, top_p):
    tok, model = setup
    eng = HFGenerateEngine(model, tok, max_prompt_len=64)
    ro = eng.generate(PROMPTS, SamplingParams(temperature, top_p, 10, seed=5))
    ref = recomputed_logprobs(tok, model, ro, temperature, top_p)
    m = ro.response_mask_BTr
    assert m.sum() > 0 and ro.temperature == temperature and ro.top_p == top_p
    assert torch.allclose(ro.behaviour_logp_BTr[m], ref[m], atol=2e-4), \
        (ro.behaviour_logp_BTr[m] - ref[m]).abs().max()
    assert torch.all(ro.behaviour_logp_BTr[~m] == 0)
    assert bool(torch.isfinite(ro.behaviour_logp_BTr).all())


def _sliced_logprobs(tok, model, ro):
    """Recomputed behaviour log-probs at T = 1 over the tokenizer's ids only [B, Tr]."""
    from xdistill.losses.onpolicy import input_token_logprobs
    from xdistill.rollout import RolloutScorer

    batch = RolloutScorer(tok)(ro).batch
    with torch.no_grad():
        z = model(input_ids=batch.input_ids_BTs,
                  attention_mask=batch.attention_mask_BTs.long()).logits[..., :tok.vocab_size]
    lp_BTs = input_token_logprobs(z, batch.input_ids_BTs)
    out = torch.zeros_like(ro.behaviour_logp_BTr)
    for b in range(ro.batch_size):
        p, r = int(ro.prompt_len_B[b]), int(ro.response_len_B[b])
        out[b, :r] = lp_BTs[b, p:p + r]
    return out


def test_a_padded_vocabulary_is_never_sampled(get_tokenizer):
    """A logit width beyond the tokenizer's ids (Qwen2.5: 151,936 rows for 151,665 ids), with the
    extra rows made likely: only tokenizer ids are sampled, and the behaviour log-probs are the
    softmax over those ids."""
    tok = get_tokenizer("gpt2")
    V, extra = tok.vocab_size, 300
    model = tiny_llama(V + extra, seed=0, logit_scale=30.0)
    with torch.no_grad():
        model.lm_head.weight[V:] = 3.0 * model.lm_head.weight[:extra]
    ro = HFGenerateEngine(model, tok, max_prompt_len=64).generate(
        PROMPTS, SamplingParams(1.0, 1.0, 10, seed=5))
    m = ro.response_mask_BTr
    assert m.sum() > 0 and int(ro.response_ids_BTr[m].max()) < V
    ref = _sliced_logprobs(tok, model, ro)
    assert torch.allclose(ro.behaviour_logp_BTr[m], ref[m], atol=2e-4)


def test_the_model_folder_generation_config_is_set_aside(setup):
    """A model folder's generation_config.json (Qwen2.5-Instruct ships repetition_penalty 1.05)
    does not reshape the sampling distribution: behaviour log-probs stay the student's own, and
    the model's config is back in place afterwards."""
    tok, model = setup
    own = model.generation_config
    own.repetition_penalty, own.no_repeat_ngram_size = 1.5, 2
    try:
        ro = HFGenerateEngine(model, tok, max_prompt_len=64).generate(
            PROMPTS, SamplingParams(1.0, 1.0, 10, seed=5))
        assert model.generation_config is own and own.repetition_penalty == 1.5
    finally:
        own.repetition_penalty, own.no_repeat_ngram_size = 1.0, 0
    m = ro.response_mask_BTr
    ref = _sliced_logprobs(tok, model, ro)
    assert torch.allclose(ro.behaviour_logp_BTr[m], ref[m], atol=2e-4), \
        (ro.behaviour_logp_BTr[m] - ref[m]).abs().max()


def test_seeded_reproducible_and_global_rng_untouched(setup):
    tok, model = setup
    eng = HFGenerateEngine(model, tok, max_prompt_len=64)
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = eng.generate(PROMPTS, SamplingParams(1.0, 1.0, 8, seed=9))
    assert torch.equal(torch.random.get_rng_state(), before)
    b = eng.generate(PROMPTS, SamplingParams(1.0, 1.0, 8, seed=9))
    c = eng.generate(PROMPTS, SamplingParams(1.0, 1.0, 8, seed=10))
    assert torch.equal(a.response_ids_BTr, b.response_ids_BTr)
    assert not torch.equal(a.response_ids_BTr, c.response_ids_BTr)
    cfg = RolloutConfig(seed=3)
    assert sampling_for_step(cfg, 4).seed == sampling_for_step(cfg, 4).seed
    assert len({sampling_for_step(cfg, s, r).seed for s in range(3) for r in range(3)}) == 9


def test_stop_tokens_end_responses(setup):
    tok, model = setup
    stops = tuple(range(0, tok.vocab_size, 2))            # half the vocabulary stops
    eng = HFGenerateEngine(model, tok, max_prompt_len=64, stop_ids=stops)
    ro = eng.generate(PROMPTS * 2, SamplingParams(1.0, 1.0, 12, seed=1))
    for b in range(ro.batch_size):
        r = int(ro.response_len_B[b])
        ids = ro.response_ids_BTr[b]
        if ro.finish_reasons[b] == "stop":
            assert int(ids[r - 1]) in stops and not any(int(i) in stops for i in ids[:r - 1])
        else:
            assert r == 12
        assert ro.response_mask_BTr[b, :r].all() and not ro.response_mask_BTr[b, r:].any()
    assert "stop" in ro.finish_reasons


def test_prompt_truncation_keeps_generation_prompt(setup):
    tok, model = setup
    eng = HFGenerateEngine(model, tok, max_prompt_len=5)
    ro = eng.generate(("a b c d e f g h i j k",), SamplingParams(1.0, 1.0, 2, seed=1))
    assert int(ro.prompt_len_B[0]) == 5
    assert tok.decode(ro.prompt_ids_BTp[0, :5].numpy()).endswith("k")


def test_config_validation_and_vllm_gate(setup):
    tok, model = setup
    with pytest.raises(ConfigError, match="temperature"):
        RolloutConfig(temperature=0.0)
    with pytest.raises(ConfigError, match="top_p"):
        RolloutConfig(top_p=1.5)
    with pytest.raises(ConfigError, match="vllm_dtype"):
        RolloutConfig(vllm_dtype="auto")
    with pytest.raises(ConfigError, match="vllm_kv_cache_gb"):
        RolloutConfig(vllm_kv_cache_gb=0.0)
    assert isinstance(build_engine(RolloutConfig(), model, tok), HFGenerateEngine)
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ConfigError, match="vllm cannot be imported.*make vllm-env"):
            build_engine(RolloutConfig(backend="vllm"), model, tok)


def test_vllm_worker_threads_bound_to_every_usable_core_on_cpu(monkeypatch):
    """``rollout.vllm_cpu_threads: all`` binds vLLM's worker to every core this process may use
    (vLLM's own binding reserves one for its scheduler); the environment variable, the ``vllm``
    setting and a GPU host leave vLLM's choice alone. No engine starts here (vLLM itself is not
    needed: the CPU check is patched); ``make test-vllm`` starts real engines with the binding."""
    from xdistill.rollout import vllm_engine

    var = "VLLM_CPU_OMP_THREADS_BIND"
    monkeypatch.setenv(var, "unset")   # restored after the test
    monkeypatch.delenv(var)
    monkeypatch.setattr(vllm_engine, "_on_cpu", lambda: True)
    assert vllm_engine.bind_cpu_threads(RolloutConfig(vllm_cpu_threads="vllm")) is None
    assert var not in os.environ
    cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    assert vllm_engine.bind_cpu_threads(RolloutConfig()) == cores
    assert os.environ[var] == cores
    monkeypatch.setenv(var, "0")       # the user's own binding wins
    assert vllm_engine.bind_cpu_threads(RolloutConfig()) is None and os.environ[var] == "0"
    monkeypatch.delenv(var)
    monkeypatch.setattr(vllm_engine, "_on_cpu", lambda: False)
    assert vllm_engine.bind_cpu_threads(RolloutConfig()) is None and var not in os.environ
    with pytest.raises(ConfigError, match="vllm_cpu_threads"):
        from_dict(RolloutConfig, {"vllm_cpu_threads": "half"})
