"""OnPolicyConfig: documented fields, the shipped recipes load strictly, validation errors name
the key, and the off-policy mixing schedule."""

from __future__ import annotations

from pathlib import Path

import pytest

from xdistill.config import from_dict, load_config, undocumented_fields
from xdistill.errors import ConfigError
from xdistill.train.onpolicy import is_offpolicy_step
from xdistill.train.onpolicy_config import OnPolicyConfig, validate_onpolicy

REPO = Path(__file__).resolve().parents[2]


def test_every_field_documented():
    assert undocumented_fields(OnPolicyConfig) == []


@pytest.mark.parametrize("name", ["onpolicy_tiny_cpu.yaml", "onpolicy_gpu_qwen3_to_llama1b.yaml"])
def test_recipes_load(name):
    cfg = load_config(OnPolicyConfig, REPO / "configs" / name, ["train.steps=3"])
    assert cfg.train.steps == 3 and len(cfg.teachers) == 2
    assert cfg.rollout.temperature == 1.0


def _cfg(tmp_path, **loss):
    model = tmp_path / "m"
    model.mkdir(exist_ok=True)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    t = {"name": "t", "worker": {"model": str(model)}, "loss": loss}
    return from_dict(OnPolicyConfig, {"student_tokenizer": "gpt2", "teachers": [t],
                                      "prompts": {"paths": [str(prompts)]}})


def test_validation_names_the_key(tmp_path):
    validate_onpolicy(_cfg(tmp_path, kind="k3"))
    bad = _cfg(tmp_path, kind="reverse_kl")
    bad.teachers[0].worker.output = "topk"
    with pytest.raises(ConfigError, match="teachers.0.*worker.output"):
        validate_onpolicy(bad)
    bad = _cfg(tmp_path, kind="k3")
    bad.teachers[0].worker.cache_mb = 64
    with pytest.raises(ConfigError, match="teachers.0.worker.cache_mb: on-policy rollouts"):
        validate_onpolicy(bad)
    bad = _cfg(tmp_path, kind="k3")
    bad.teachers[0].worker.output = "support"
    with pytest.raises(ConfigError, match="teachers.0.worker.output: 'support' outputs .* are not "
                                          "used on-policy"):
        validate_onpolicy(bad)
    bad = _cfg(tmp_path, kind="topk_kl")
    with pytest.raises(ConfigError, match="topk_kl"):
        validate_onpolicy(bad)
    bad = _cfg(tmp_path)
    bad.loss.offpolicy_lambda = 0.5
    with pytest.raises(ConfigError, match="offpolicy.data.paths"):
        validate_onpolicy(bad)
    with pytest.raises(ConfigError, match="kind"):
        from_dict(OnPolicyConfig, {"teachers": [{"loss": {"kind": "forward_kl"}}]})


@pytest.mark.parametrize("chunk_size", [-1, 0])
def test_loss_chunk_size_below_one_is_refused(tmp_path, chunk_size):
    """-1 once trained silently on nothing in a k1/k3 step (the student's log-probs over no row:
    loss 0, gradient 0); other losses failed inside the first step with a ValueError traceback.
    null (one block) and >= 1 stay valid."""
    for ok in (None, 1, 256):
        cfg = _cfg(tmp_path, kind="k3")
        cfg.loss.chunk_size = ok
        validate_onpolicy(cfg)
    cfg = _cfg(tmp_path, kind="k3")
    cfg.loss.chunk_size = chunk_size
    with pytest.raises(ConfigError, match=rf"^loss.chunk_size must be >= 1 or null .*got "
                                          rf"{chunk_size}$"):
        validate_onpolicy(cfg)


def test_offpolicy_schedule(tmp_path):
    cfg = _cfg(tmp_path)
    cfg.loss.offpolicy_lambda = 0.25
    picked = [s for s in range(1, 13) if is_offpolicy_step(cfg, s)]
    assert picked == [4, 8, 12]
    cfg.loss.offpolicy_mode = "probability"
    a = [is_offpolicy_step(cfg, s) for s in range(1, 401)]
    assert a == [is_offpolicy_step(cfg, s) for s in range(1, 401)]  # a function of the step
    assert 0.15 < sum(a) / 400 < 0.35
    cfg.loss.offpolicy_lambda = 0.0
    assert not any(is_offpolicy_step(cfg, s) for s in range(1, 20))


def test_rollout_beyond_the_students_positions_fails_before_generation(tmp_path):
    import onpolicy_helpers as H

    from xdistill.train.onpolicy import run_onpolicy

    gpt = H.save_lm(tmp_path / "gpt", "gpt2", seed=2, hidden_size=16, intermediate_size=32)
    d = H.onpolicy_dict("gpt2", [H.teacher("gpt", "gpt2", gpt)],
                        H.write_prompts(tmp_path / "p.jsonl"), tmp_path / "run", steps=1)
    d["rollout"]["max_new_tokens"] = 10_000
    with pytest.raises(ConfigError, match=r"rollout.max_prompt_len \+ rollout.max_new_tokens: "
                                          r"10032 student tokens .* exceed the model's \d+ positions"):
        run_onpolicy(from_dict(OnPolicyConfig, d))


def test_a_same_tokenizer_teacher_must_hold_the_longest_row(tmp_path):
    """Its rows are the student's, not cut (a cut would move its positions off the student's)."""
    from xdistill.train.onpolicy_step import build_onpolicy_plan

    cfg = _cfg(tmp_path, kind="k1")
    cfg.teachers[0].tokenizer = "gpt2"   # the student's
    longest = cfg.rollout.max_prompt_len + cfg.rollout.max_new_tokens
    cfg.teachers[0].max_len = longest
    build_onpolicy_plan(cfg)
    cfg.teachers[0].max_len = longest - 1
    with pytest.raises(ConfigError, match=rf"^teachers\.0\.max_len = {longest - 1}: teacher 't' "
                                          rf"uses the student's tokenizer .* = {longest} tokens"):
        build_onpolicy_plan(cfg)
    cfg.teachers[0].tokenizer = "qwen2"  # another tokenizer: its prompt is cut instead
    build_onpolicy_plan(cfg)


@pytest.mark.parametrize("seq_len", [700, 64])
def test_mixed_in_windows_beyond_the_students_positions_fail_before_training(
        tmp_path, tiny_assets, seq_len):
    """loss.offpolicy_lambda > 0: offpolicy.data.seq_len (+ BOS) is checked against the student's
    positions like data.seq_len off-policy (once it went unchecked: Llama extrapolated its rotary
    positions silently); a length that fits builds."""
    import onpolicy_helpers as H

    from xdistill.train.onpolicy import build_onpolicy_run

    teacher = H.save_lm(tmp_path / "t", tiny_assets["tok_s"], seed=1)
    d = H.onpolicy_dict(tiny_assets["tok_s"], [H.teacher("same", tiny_assets["tok_s"], teacher)],
                        H.write_prompts(tmp_path / "p.jsonl"), tmp_path / "run", steps=1)
    d["loss"]["offpolicy_lambda"] = 1.0
    d["offpolicy"] = {"data": {"paths": [tiny_assets["train"]], "seq_len": seq_len,
                               "batch_size": 2, "num_workers": 0}}
    if seq_len > H.TINY["max_position_embeddings"]:
        with pytest.raises(ConfigError, match=r"^offpolicy.data.seq_len: 70[01] student tokens per "
                                              r"sequence exceed the model's 512 positions$"):
            build_onpolicy_run(from_dict(OnPolicyConfig, d))
        return
    run = build_onpolicy_run(from_dict(OnPolicyConfig, d))
    run.mode.close()
