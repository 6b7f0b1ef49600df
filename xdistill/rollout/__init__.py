"""On-policy rollouts: prompts -> student samples -> teacher-scored DistillBatches.

``prompts`` (:func:`open_prompts`, :class:`PromptDataset`: sharded, resumable) ->
``engine`` (:class:`RolloutEngine`: :class:`HFGenerateEngine`, optional :class:`VLLMEngine` (vLLM),
picked by :class:`RolloutConfig` through :func:`build_engine`) -> :class:`Rollouts` ->
``scoring`` (:class:`RolloutScorer`: each teacher re-renders the prompt with its own template,
re-tokenizes the response bytes and is aligned to the student's sampled tokens; tool spans are
carried by byte spans) -> :class:`ScoredBatch` (a ``DistillBatch`` plus behaviour log-probs).
The losses live in :mod:`xdistill.losses.onpolicy`.
"""

from xdistill.rollout.build import build_engine
from xdistill.rollout.engine import (HFGenerateEngine, RolloutConfig, RolloutEngine, Rollouts,
                                     SamplingParams, nucleus_logprobs, sampling_for_step)
from xdistill.rollout.prompts import JsonlPrompts, PromptDataset, collate_prompts, open_prompts
from xdistill.rollout.render import encode_prompts, end_of_turn_id, render_prompt, stop_token_ids
from xdistill.rollout.scoring import (RolloutScorer, ScoredBatch, ScoringStats, response_text,
                                      rollouts_from_segments)
from xdistill.rollout.vllm_engine import VLLMEngine

__all__ = ["HFGenerateEngine", "JsonlPrompts", "PromptDataset", "RolloutConfig", "RolloutEngine",
           "RolloutScorer", "Rollouts", "SamplingParams", "ScoredBatch", "ScoringStats",
           "VLLMEngine", "build_engine", "collate_prompts", "encode_prompts", "end_of_turn_id",
           "nucleus_logprobs", "open_prompts", "render_prompt", "response_text",
           "rollouts_from_segments", "sampling_for_step", "stop_token_ids"]
