"""Rollout engines: the student samples responses to prompts, recording behaviour log-probs.

Legend: B prompts, Tp prompt tokens, Tr response tokens, V student vocabulary.

``engine.generate(prompts, sampling) -> Rollouts``. Prompts are rendered for the student by
:func:`xdistill.rollout.render.render_prompt` (chat prompts with the student's own template and its
generation prompt) and tokenized without added special tokens (a BOS when ``add_bos``, by default when the model adds one).
Prompts longer than ``max_prompt_len`` keep their *last* tokens (the generation prompt must
survive; DeepSpeed's OPSD collator cut it off by right-truncating).

Behaviour log-probs: ``behaviour_logp_BTr[b, t] = log pi(y_t | ...)`` under the distribution the
token was actually sampled from: ``softmax(z / temperature)`` restricted to the top-p nucleus and
renormalised there (with ``top_p = 1``: exactly ``log_softmax(z / T)[y_t]``). They are what an
importance-sampling correction needs; with T = 1 and top_p = 1 (the recommended training setting)
they are the student's own log-probs at sampling time.

Backends: :class:`HFGenerateEngine` (``transformers`` ``generate``: KV cache, batched with left
padding, seeded) and :class:`xdistill.rollout.vllm_engine.VLLMEngine` (optional: vLLM in its own
venv, ``make vllm-env``; weights synced from the trainer's student). :func:`xdistill.rollout.build.build_engine`
picks one from :class:`RolloutConfig`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields, replace
from typing import Literal

import numpy as np
import torch

from xdistill.errors import ConfigError
from xdistill.rollout.render import encode_prompts, stop_token_ids
from xdistill.tokenization.bos import resolve_add_bos
from xdistill.tokenization.tokenizer import padding_id


VLLM_DTYPES = ("bfloat16", "float16", "float32")


@dataclass
class RolloutConfig:
    """The rollout section of an on-policy config."""

    # engine backend: "hf" (transformers generate, in-process) or "vllm" (needs vllm installed)
    backend: Literal["hf", "vllm"] = "hf"
    # sampling temperature (1.0 recommended: the student's own distribution)
    temperature: float = 1.0
    # nucleus sampling mass (1.0 = off, recommended for training rollouts)
    top_p: float = 1.0
    # maximum generated tokens per response
    max_new_tokens: int = 256
    # maximum prompt tokens (longer prompts keep their last tokens)
    max_prompt_len: int = 1024
    # prepend the student's BOS token to every prompt; null = the student model's own default
    # (Gemma's is true, SmolLM2's false); true/false override it
    add_bos: bool | None = None
    # base seed of the sampling RNG (each call adds its step number)
    seed: int = 0
    # vllm only: copy the student's weights into the vLLM engine every this many optimizer steps
    # (and once at the start, after any resume)
    sync_every: int = 1
    # vllm only: path (HF folder) of a checkpoint of the student's architecture the engine starts
    # from; empty = the trainer's student, exported to a temporary folder (the weights are synced
    # in at the start either way)
    vllm_model: str = ""
    # vllm only: fraction of GPU memory vLLM may take (on a GPU host without vllm_kv_cache_gb)
    vllm_gpu_memory_utilization: float = 0.4
    # vllm only: GiB of KV cache (vLLM's kv_cache_memory_bytes); null = 1 GiB on a CPU host,
    # sized by vLLM from vllm_gpu_memory_utilization on a GPU
    vllm_kv_cache_gb: float | None = None
    # vllm only: dtype of the engine's weights: bfloat16, float16 or float32 (float32 makes its
    # behaviour log-probs match the float32 trainer's to ~1e-5)
    vllm_dtype: str = "bfloat16"
    # vllm only: skip torch.compile and CUDA graphs (quicker start; on a GPU slower decoding)
    vllm_enforce_eager: bool = True
    # vllm on a CPU host only: "all" binds the engine worker's threads to every core this process
    # may use (the trainer waits while the engine samples); "vllm" keeps vLLM's own binding, which
    # reserves a core for its scheduler process (on 2 cores the worker then samples on one).
    # VLLM_CPU_OMP_THREADS_BIND set in the environment wins over both
    vllm_cpu_threads: Literal["all", "vllm"] = "all"

    def __post_init__(self):
        if self.temperature <= 0:
            raise ConfigError(f"rollout.temperature must be > 0 (got {self.temperature}); "
                              "greedy decoding has no behaviour distribution")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"rollout.top_p must lie in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1 or self.max_prompt_len < 1 or self.sync_every < 1:
            raise ConfigError("rollout.max_new_tokens, max_prompt_len and sync_every must be >= 1")
        if self.vllm_dtype not in VLLM_DTYPES:
            raise ConfigError(f"rollout.vllm_dtype must be one of {', '.join(VLLM_DTYPES)}, "
                              f"got {self.vllm_dtype!r}")
        if self.vllm_kv_cache_gb is not None and self.vllm_kv_cache_gb <= 0:
            raise ConfigError(f"rollout.vllm_kv_cache_gb must be > 0 or null, got "
                              f"{self.vllm_kv_cache_gb}")


@dataclass(frozen=True)
class SamplingParams:
    """How one batch is sampled."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    # seed of this call's sampling RNG (reproducible rollouts)
    seed: int = 0


@dataclass(frozen=True)
class Rollouts:
    """A batch of sampled responses (right-padded tensors; CPU)."""

    # the prompts as given: str (plain) or tuple of (role, content) pairs (chat)
    prompts: tuple
    # student prompt ids (rendered, tokenized, truncated), right-padded with the pad id, int64
    prompt_ids_BTp: torch.Tensor
    # number of real prompt tokens, int64 [B]
    prompt_len_B: torch.Tensor
    # sampled response ids, right-padded with the pad id, int64 [B, Tr]
    response_ids_BTr: torch.Tensor
    # number of real response tokens (up to and including the stop token), int64 [B]
    response_len_B: torch.Tensor
    # True on response tokens the policy generated (LLM tokens); False on padding and on
    # tool/environment tokens an agent loop spliced in
    response_mask_BTr: torch.Tensor
    # log-prob of each sampled token under the behaviour distribution (module doc), float32,
    # 0 on padding and on tool tokens
    behaviour_logp_BTr: torch.Tensor
    # sampling temperature and nucleus mass used
    temperature: float
    top_p: float
    # per sample: "stop" (a stop token was generated) or "length" (max_new_tokens reached)
    finish_reasons: tuple
    # optional per-sample task reward (reward-weighted on-policy distillation), float32 [B]
    rewards_B: torch.Tensor | None = None

    def __post_init__(self):
        B = len(self.prompts)
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor) and v.shape[0] != B:
                raise ValueError(f"Rollouts.{f.name} has {v.shape[0]} rows for {B} prompts")
        if len(self.finish_reasons) != B:
            raise ValueError(f"Rollouts.finish_reasons has {len(self.finish_reasons)} entries for {B} prompts")

    @property
    def batch_size(self) -> int:
        return len(self.prompts)

    def with_rewards(self, rewards_B) -> "Rollouts":
        return replace(self, rewards_B=torch.as_tensor(rewards_B, dtype=torch.float32))


class RolloutEngine(ABC):
    """Samples responses from the student policy."""

    @abstractmethod
    def generate(self, prompts, sampling: SamplingParams) -> Rollouts:
        """Sample one response per prompt (str or conversation)."""

    def sync_weights(self, model) -> None:  # noqa: B027 - in-process engines share the weights
        """Bring the engine's weights up to date with the student (no-op in-process)."""

    def close(self) -> None:  # noqa: B027 - in-process engines hold nothing
        """Release the engine's processes and buffers (no-op in-process)."""


def _right_pad(rows: list[np.ndarray], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    T = max((r.size for r in rows), default=0)
    out = np.full((len(rows), max(T, 1)), pad, dtype=np.int64)
    for b, r in enumerate(rows):
        out[b, :r.size] = r
    return torch.from_numpy(out), torch.tensor([r.size for r in rows], dtype=torch.int64)


def nucleus_logprobs(logits_BV: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """log of the behaviour distribution: ``softmax(z / T)`` on the top-p nucleus, renormalised.

    The nucleus is the smallest set of highest-probability tokens whose mass reaches ``top_p``
    (``transformers``' ``TopPLogitsWarper`` convention: tokens are removed while the cumulative
    mass of the *lower* tail stays <= 1 - top_p). Tokens outside get ``-inf``.
    """
    z = logits_BV.float() / temperature
    if top_p < 1.0:
        sorted_z, order = torch.sort(z, dim=-1, descending=False)
        cum = torch.softmax(sorted_z, dim=-1).cumsum(-1)
        drop_sorted = cum <= (1 - top_p)
        drop_sorted[..., -1:] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        z = z.masked_fill(drop, float("-inf"))
    return torch.log_softmax(z, dim=-1)


class HFGenerateEngine(RolloutEngine):
    """``transformers`` ``generate`` on the (in-process) student model.

    Batched with left padding and the KV cache; sampling uses ``do_sample=True`` with the given
    temperature/top-p and ``top_k=0`` (no hidden top-k), under a forked RNG seeded with
    ``sampling.seed`` (the global RNG is left untouched, so rollouts are reproducible and do not
    shift the trainer's RNG). Behaviour log-probs come from ``output_scores`` (the processed
    logits the sampler drew from): ``log_softmax(scores)[y_t]``. Only these settings apply: the
    model folder's own ``generation_config`` (a repetition penalty, min-p, ...) is set aside while
    sampling, so the behaviour log-probs are the student's. A logit width beyond the tokenizer's
    ids (a padded vocabulary, e.g. Qwen2.5's 151,936 rows for 151,665 ids) is never sampled: those
    columns are suppressed before temperature and top-p (the trainer drops them too).
    """

    def __init__(self, model, tokenizer, *, max_prompt_len: int = 1024, add_bos: bool | None = None,
                 stop_ids=None):
        self.model, self.tok = model, tokenizer
        self.max_prompt_len = int(max_prompt_len)
        self.add_bos = resolve_add_bos(add_bos, tokenizer, "rollout.add_bos")
        self.stop_ids = tuple(stop_ids) if stop_ids is not None else stop_token_ids(tokenizer)
        if not self.stop_ids:
            raise ConfigError(f"student tokenizer {tokenizer.name!r} has no EOS / end-of-turn token "
                              "to stop generation")
        self.pad_id = padding_id(tokenizer)

    def _left_padded(self, rows: list[np.ndarray], device) -> tuple[torch.Tensor, torch.Tensor]:
        T = max(r.size for r in rows)
        ids = np.full((len(rows), T), self.pad_id, dtype=np.int64)
        attn = np.zeros((len(rows), T), dtype=np.int64)
        for b, r in enumerate(rows):
            ids[b, T - r.size:], attn[b, T - r.size:] = r, 1
        return torch.from_numpy(ids).to(device), torch.from_numpy(attn).to(device)

    @torch.no_grad()
    def _sample(self, ids, attn, sampling: SamplingParams):
        # deferred: transformers' generation module (heavy) only when sampling with HF
        from transformers import GenerationConfig

        was_training, own_config = self.model.training, self.model.generation_config
        width = int(self.model.get_output_embeddings().weight.shape[0])
        padded = list(range(self.tok.vocab_size, width)) or None
        self.model.eval()
        self.model.generation_config = GenerationConfig()   # library defaults + what is passed
        devices = [ids.device] if ids.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(int(sampling.seed))
                out = self.model.generate(
                    input_ids=ids, attention_mask=attn, do_sample=True,
                    temperature=float(sampling.temperature), top_p=float(sampling.top_p), top_k=0,
                    max_new_tokens=int(sampling.max_new_tokens), output_scores=True,
                    return_dict_in_generate=True, pad_token_id=self.pad_id,
                    eos_token_id=list(self.stop_ids), suppress_tokens=padded)
        finally:
            self.model.generation_config = own_config
            self.model.train(was_training)
        return out

    def generate(self, prompts, sampling: SamplingParams) -> Rollouts:
        prompts = tuple(prompts)
        if not prompts:
            raise ValueError("generate() needs at least one prompt")
        rows = encode_prompts(self.tok, prompts, self.max_prompt_len, add_bos=self.add_bos)
        device = next(self.model.parameters()).device
        ids, attn = self._left_padded(rows, device)
        out = self._sample(ids, attn, sampling)
        resp_BTr = out.sequences[:, ids.shape[1]:].cpu()
        B, Tr = resp_BTr.shape
        logp_BTr = torch.zeros((B, Tr), dtype=torch.float32)
        for t, scores_BV in enumerate(out.scores):
            lp = torch.log_softmax(scores_BV.float(), dim=-1).cpu()
            logp_BTr[:, t] = lp.gather(1, resp_BTr[:, t:t + 1]).squeeze(1)
        is_stop = torch.isin(resp_BTr, torch.tensor(self.stop_ids))
        has_stop = is_stop.any(1)
        first = torch.where(has_stop, is_stop.int().argmax(1), torch.full((B,), Tr))
        length_B = torch.where(has_stop, first + 1, torch.full((B,), Tr))
        mask_BTr = torch.arange(Tr)[None, :] < length_B[:, None]
        resp_BTr = torch.where(mask_BTr, resp_BTr, torch.full_like(resp_BTr, self.pad_id))
        prompt_BTp, prompt_len_B = _right_pad(rows, self.pad_id)
        reasons = tuple("stop" if bool(s) else "length" for s in has_stop)
        return Rollouts(prompts, prompt_BTp, prompt_len_B, resp_BTr, length_B.long(), mask_BTr,
                        torch.where(mask_BTr, logp_BTr, torch.zeros_like(logp_BTr)),
                        float(sampling.temperature), float(sampling.top_p), reasons)


def sampling_for_step(config: RolloutConfig, step: int, rank: int = 0,
                      micro: int | None = None) -> SamplingParams:
    """The sampling parameters of optimizer step ``step`` on data-parallel rank ``rank`` (and
    gradient-accumulation micro-batch ``micro`` when a step has several).

    The seed is derived from ``(config.seed, step, rank[, micro])`` (numpy ``SeedSequence``), so
    every rank and micro-batch samples differently and a resumed run samples exactly like the
    uninterrupted one.
    """
    key = [int(config.seed), int(step), int(rank)] + ([] if micro is None else [int(micro)])
    seed = int(np.random.SeedSequence(key).generate_state(1)[0])
    return SamplingParams(config.temperature, config.top_p, config.max_new_tokens, seed)
