"""The rollout engine a :class:`xdistill.rollout.engine.RolloutConfig` names (``rollout.backend``).

Its own module so that the engine modules do not import each other: :mod:`.engine` (the config,
the HF backend) and :mod:`.vllm_engine` (which builds on it).
"""

from __future__ import annotations

from xdistill.errors import ConfigError
from xdistill.rollout.engine import HFGenerateEngine, RolloutConfig, RolloutEngine
from xdistill.rollout.vllm_engine import VLLMEngine  # imports vllm only when one is built


def build_engine(config: RolloutConfig, model, tokenizer) -> RolloutEngine:
    """The engine ``config.backend`` names. ``model``: the in-process student ("hf" generates
    with it; "vllm" starts from its weights when ``rollout.vllm_model`` is empty)."""
    if config.backend == "hf":
        return HFGenerateEngine(model, tokenizer, max_prompt_len=config.max_prompt_len,
                                add_bos=config.add_bos)
    if config.backend == "vllm":
        return VLLMEngine(config, tokenizer, model)
    raise ConfigError(f"unknown rollout.backend {config.backend!r}; allowed: hf, vllm")
