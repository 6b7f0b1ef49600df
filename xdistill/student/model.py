"""Build or load the student causal LM, and export it in Hugging Face format.

* :func:`load_student` -- from a :class:`StudentConfig`: a model spec (see below) or a fresh
  random-init model from a model type and config fields (``AutoConfig.for_model`` +
  ``AutoModelForCausalLM.from_config``). Fresh initialisation is seeded and does not touch the
  global RNG.
* :func:`load_causal_lm` -- the loader students and teachers share. A model spec is a local
  transformers folder (``AutoModelForCausalLM.from_pretrained``, never the hub), a ``.gguf`` file
  (transformers' ``gguf_file`` support: dequantised, with the GGUF quantizer detached so the
  model trains and saves as a plain model) or the name of a fetched pretrained model asset
  (``smollm2-135m``, ``gemma3-270m``: :func:`xdistill.assets.paths.model_dir`).
* :func:`export_hf` -- write ``config.json`` + safetensors weights (+ the tokenizer) so that
  ``AutoModelForCausalLM.from_pretrained`` and vLLM load the folder directly. Works on a plain
  model and on an FSDP2-sharded one (every rank must call it; the full state dict is gathered to
  rank 0 on CPU, and only rank 0 writes). The folder appears atomically: it is written as
  ``<out>.tmp`` and renamed. With a tokenizer, its bos/eos/pad ids go into ``config.json`` and
  ``generation_config.json`` (a fresh model carries its architecture's defaults, e.g. Llama's
  1/2, so plain ``generate()`` would never stop at GPT-2's ``<|endoftext|>``), and its
  ``model_max_length`` becomes the model's ``max_position_embeddings``.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from xdistill import distributed as xdist
from xdistill.assets.paths import MODEL_NAMES, model_dir
from xdistill.errors import ConfigError, XDistillError
from xdistill.student.attention import FLOAT32_SDPA, register_float32_sdpa
from xdistill.student.config import StudentConfig, resolve_dtype


def load_student(cfg: StudentConfig) -> nn.Module:
    """The student described by ``cfg`` (on CPU, in ``cfg.dtype``, train mode)."""
    cfg.validate()
    if cfg.path:
        model = load_causal_lm(cfg.path, dtype=cfg.torch_dtype, attn_implementation=cfg.attn_implementation)
    else:
        model = build_causal_lm(cfg.model_type, cfg.model_config, seed=cfg.init_seed,
                                dtype=cfg.torch_dtype, attn_implementation=cfg.attn_implementation)
    model.train()
    return model


def make_config(model_type: str, config_kwargs: dict[str, Any]):
    """``AutoConfig.for_model(model_type, **config_kwargs)`` with strict key checking.

    transformers silently stores unknown keyword arguments as attributes, so a typo
    (``hiden_size``) would be ignored; here any key that is not a field of the model type's default
    config is a :class:`ConfigError` naming it.
    """
    # deferred: transformers (slow import; only building or loading a model needs it)
    from transformers import AutoConfig

    try:
        default = AutoConfig.for_model(model_type)
    except (ValueError, KeyError):
        raise ConfigError(f"student.model_type: unknown transformers model type {model_type!r}") from None
    # the default's fields, the class's aliases (GPT-2's hidden_size -> n_embd) and its keyword
    # arguments (rope_theta, folded into rope_parameters by transformers 5)
    allowed = (set(default.to_dict()) | set(getattr(type(default), "attribute_map", {}))
               | set(inspect.signature(type(default).__init__).parameters) - {"self", "kwargs"})
    if "rope_parameters" in allowed:   # the legacy keys transformers 5 folds into it
        allowed |= {"rope_theta", "rope_scaling"}
    unknown = sorted(k for k in config_kwargs if k not in allowed)
    if unknown:
        raise ConfigError(f"student.model_config: unknown key(s) {', '.join(map(repr, unknown))} for "
                          f"model type {model_type!r} ({type(default).__name__})")
    return AutoConfig.for_model(model_type, **config_kwargs)


def build_causal_lm(model_type: str, config_kwargs: dict[str, Any], *, seed: int = 0,
                    dtype: torch.dtype = torch.float32, attn_implementation: str = "") -> nn.Module:
    """A fresh random-init causal LM; identical weights for identical (config, seed).

    Weights are initialised in float32 under a forked RNG seeded with ``seed`` (so the caller's
    global RNG stream is unchanged) and then cast to ``dtype``: the parameters only. Buffers keep
    their dtype (a 16-bit rotary ``inv_freq`` put every position off by up to 0.5 rad at 3,000
    tokens, and the export, which recomputes it in float32 on load, computed differently).
    """
    # deferred: transformers (slow import; only building or loading a model needs it)
    from transformers import AutoModelForCausalLM

    config = make_config(model_type, config_kwargs)
    kwargs = _attention_kwargs(attn_implementation)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = AutoModelForCausalLM.from_config(config, **kwargs)
        except ValueError as exc:
            raise ConfigError(f"student: cannot build a causal LM of type {model_type!r}: {exc}") from None
    with torch.no_grad():
        for param in model.parameters():
            param.data = param.data.to(dtype)
    return model


def _attention_kwargs(attn_implementation: str) -> dict[str, Any]:
    """transformers' ``attn_implementation`` keyword ("" = its default); ``sdpa_float32``
    (:mod:`xdistill.student.attention`) is registered first."""
    if attn_implementation == FLOAT32_SDPA:
        register_float32_sdpa()
    return {"attn_implementation": attn_implementation} if attn_implementation else {}


def resolve_model_path(spec: str | os.PathLike) -> Path:
    """A model spec as a local path: a pretrained model asset name (``smollm2-135m``) maps to
    its converted folder, anything else is taken as a path (folder or ``.gguf`` file)."""
    text = os.fspath(spec)
    if text in MODEL_NAMES:
        folder = model_dir(text)
        if not (folder / "config.json").is_file():
            raise XDistillError(f"model asset {text!r} not found at {str(folder)!r}; run "
                                "`python tools/fetch_assets.py` (or set XDISTILL_ASSETS)")
        return folder
    return Path(text).expanduser()


def stock_dtype(spec: str | os.PathLike) -> str:
    """The dtype a model folder's ``config.json`` declares (``dtype`` or ``torch_dtype``:
    ``"float32"``, ``"bfloat16"`` or ``"float16"``); ``""`` when it declares none (a ``.gguf``
    file, a config without one)."""
    path = resolve_model_path(spec) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    for key in ("dtype", "torch_dtype"):
        value = config.get(key) if isinstance(config, dict) else None
        if isinstance(value, str) and value.removeprefix("torch.") in ("float32", "bfloat16",
                                                                       "float16"):
            return value.removeprefix("torch.")
    return ""


def export_dtype(setting: str, student_path: str) -> str:
    """``checkpoint.export_dtype`` resolved: "auto" is the student model's own dtype
    (:func:`stock_dtype`; ``""``, the training dtype, for a fresh student)."""
    if setting != "auto":
        return setting
    return stock_dtype(student_path) if student_path else ""


def load_causal_lm(path: str | os.PathLike, *, dtype: torch.dtype | str = torch.float32,
                   attn_implementation: str = "", trust_remote_code: bool = False) -> nn.Module:
    """A causal LM from a local folder, a ``.gguf`` file or a model asset name (never the hub).

    ``dtype`` is a torch dtype or ``"auto"`` (the checkpoint's). A ``.gguf`` file is dequantised
    into ``dtype`` and its quantizer detached (:func:`detach_quantizer`).
    """
    # deferred: transformers (slow import; only building or loading a model needs it)
    from transformers import AutoModelForCausalLM
    # deferred: safetensors (comes with transformers; only loading a model needs it)
    from safetensors import SafetensorError

    folder = resolve_model_path(path)
    kwargs = _attention_kwargs(attn_implementation)
    if trust_remote_code:
        kwargs["trust_remote_code"] = True
    if folder.suffix.lower() == ".gguf":
        if not folder.is_file():
            raise XDistillError(f"model file {str(folder)!r} does not exist")
        try:
            with _quiet_transformers():
                model = AutoModelForCausalLM.from_pretrained(
                    str(folder.parent), gguf_file=folder.name, dtype=dtype, local_files_only=True,
                    **kwargs)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise XDistillError(f"cannot load a causal LM from {str(folder)!r}: "
                                f"{type(exc).__name__}: {exc}") from None
        return detach_quantizer(model)
    if not folder.is_dir():
        raise XDistillError(f"model folder {str(folder)!r} does not exist")
    if not (folder / "config.json").is_file():
        raise XDistillError(f"model folder {str(folder)!r} has no config.json "
                            "(expected a Hugging Face save_pretrained folder or a .gguf file)")
    try:
        return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True, **kwargs)
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as exc:
        # SafetensorError: a cut-short or damaged model.safetensors (an interrupted copy)
        raise XDistillError(f"cannot load a causal LM from {str(folder)!r}: "
                            f"{type(exc).__name__}: {exc}") from None


def detach_quantizer(model: nn.Module) -> nn.Module:
    """Make a GGUF-loaded (already dequantised) model a plain one: drop the GGUF quantizer and
    its ``quantization_config``, so ``save_pretrained`` writes ordinary safetensors and nothing
    downstream (training, export, FSDP2) treats it as quantized."""
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "quantization_config", None) is not None:
        del config.quantization_config
    return model


def is_sharded(model: nn.Module) -> bool:
    """True when any parameter is a DTensor (the model went through ``fully_shard``)."""
    # deferred: torch.distributed.tensor (~0.5 s import; only FSDP-sharded models)
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded CPU state dict of ``model``. Collective for a sharded model (every rank must
    call it); rank 0 gets the tensors, other ranks an empty dict."""
    # deferred: torch.distributed.checkpoint (~1 s import; only FSDP-sharded models)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if is_sharded(model):
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return _share_tied(model, get_model_state_dict(model, options=opts))
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def _cast_state(state: dict[str, torch.Tensor], cast: torch.dtype) -> dict[str, torch.Tensor]:
    """Floating tensors of ``state`` cast to ``cast``, once per tensor object (the caller re-ties
    the entries of a tied parameter: :func:`_share_tied`)."""
    done: dict[int, torch.Tensor] = {}
    out = {}
    for key, value in state.items():
        if value.is_floating_point():
            if id(value) not in done:
                done[id(value)] = value.to(cast)
            value = done[id(value)]
        out[key] = value
    return out


def _share_tied(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Make the entries of one shared (tied) parameter the same tensor again.

    The gathered full state dict of a sharded model holds a separate copy per name of a tied
    parameter (``lm_head.weight`` and ``model.embed_tokens.weight``), so ``save_pretrained``
    could not see that they are tied and would write both. A plain model's state dict shares the
    storage, and ``save_pretrained`` keeps one name; sharing it here makes both exports identical.
    """
    names_by_param: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names_by_param.setdefault(id(param), []).append(name)
    for names in names_by_param.values():
        present = [n for n in names if n in state]
        for name in present[1:]:
            state[name] = state[present[0]]
    return state


def _base_model_class(model: nn.Module) -> type:
    """The transformers class under FSDP2's dynamic ``FSDP<Name>`` subclass."""
    # deferred: torch.distributed.fsdp (~0.7 s import; only FSDP-sharded models)
    from torch.distributed.fsdp import FSDPModule

    cls = type(model)
    if issubclass(cls, FSDPModule):
        for base in cls.__mro__[1:]:
            if not issubclass(base, FSDPModule) and issubclass(base, nn.Module):
                return base
    return cls


def _save_tokenizer(tokenizer: Any, folder: Path) -> None:
    hf_tok = getattr(tokenizer, "hf", tokenizer)  # xdistill Tokenizer wrapper or a transformers one
    if not hasattr(hf_tok, "save_pretrained"):
        raise XDistillError(f"cannot export the tokenizer: {type(tokenizer).__name__} has no "
                            "save_pretrained (pass a transformers tokenizer or an xdistill Tokenizer)")
    hf_tok.save_pretrained(str(folder))


def export_hf(model: nn.Module, out_dir: str | os.PathLike, tokenizer: Any = None, *,
              dtype: str = "", overwrite: bool = False) -> Path | None:
    """Write ``model`` (+ ``tokenizer``) to ``out_dir`` in Hugging Face format.

    ``dtype``: "" keeps the training dtype; "bfloat16" etc. casts floating tensors (and records it
    in config.json). Every rank must call this for a sharded model; rank 0 writes and returns the
    folder, other ranks return None (or raise when rank 0's write failed). ``config.json``'s
    ``architectures`` names the transformers class (never FSDP's wrapper), so vLLM resolves it.
    """
    out = Path(out_dir)
    problem = None
    under = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if xdist.is_main_process() and under is not None:
        problem = f"export folder {str(out)!r} lies under {str(under)!r}, which is a file"
    elif xdist.is_main_process() and out.exists() and not out.is_dir():
        problem = f"export folder {str(out)!r} is a file, not a folder"
    elif xdist.is_main_process() and out.exists() and any(out.iterdir()) and not overwrite:
        problem = f"export folder {str(out)!r} exists and is not empty (pass overwrite=True)"
    problem = xdist.broadcast_object(problem)  # every rank raises, none waits in a collective
    if problem:
        raise XDistillError(problem)
    cast = resolve_dtype(dtype, "export dtype")
    state = full_state_dict(model)  # collective when sharded
    if not xdist.is_main_process():
        failed = xdist.broadcast_object(None)  # rank 0's outcome: no rank waits on a dead peer
        if failed:
            raise XDistillError(f"export to {str(out)!r} failed on rank 0: {failed}")
        return None
    try:
        _write_export(model, out, state, cast, tokenizer)
    except BaseException as exc:
        xdist.broadcast_object(f"{type(exc).__name__}: {exc}")
        raise
    xdist.broadcast_object(None)
    return out


def _write_export(model: nn.Module, out: Path, state: dict, cast, tokenizer: Any) -> None:
    """Rank 0's part of :func:`export_hf`: write to ``out.tmp``, then replace ``out``."""
    if cast is not None:
        state = _share_tied(model, _cast_state(state, cast))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cls = _base_model_class(model)
    with _quiet_transformers():
        model.save_pretrained(str(tmp), state_dict=state, is_main_process=True)
    _fix_config(tmp / "config.json", cls.__name__, cast)
    if tokenizer is not None:
        _save_tokenizer(tokenizer, tmp)
        _write_token_ids(tmp, tokenizer, _max_positions(model))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)


def _max_positions(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    value = getattr(text, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def _write_token_ids(folder: Path, tokenizer: Any, max_positions: int | None) -> None:
    """The tokenizer's bos/eos/pad ids into ``config.json`` and ``generation_config.json``, and
    ``model_max_length = max_positions`` into ``tokenizer_config.json`` (see the module doc)."""
    hf_tok = getattr(tokenizer, "hf", tokenizer)
    ids = {f"{k}_token_id": getattr(hf_tok, f"{k}_token_id", None) for k in ("bos", "eos", "pad")}
    for name in ("config.json", "generation_config.json"):
        path = folder / name
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        data.update(_keep_extra_stops(data.get("eos_token_id"), ids))
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tok_cfg = folder / "tokenizer_config.json"
    if max_positions is not None and tok_cfg.is_file():
        data = json.loads(tok_cfg.read_text(encoding="utf-8"))
        data["model_max_length"] = max_positions
        tok_cfg.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _keep_extra_stops(have: Any, ids: dict) -> dict:
    """``ids`` with the model's list of stop ids kept when it holds the tokenizer's EOS (first):
    an instruct model's end-of-turn (Gemma-3 ``[1, 106]``) otherwise stopped no generation."""
    eos = ids.get("eos_token_id")
    if isinstance(have, list) and eos in have and len(have) > 1:
        return {**ids, "eos_token_id": [eos] + [i for i in have if i != eos]}
    return ids


@contextlib.contextmanager
def _quiet_transformers():
    """No tqdm bars from transformers while exporting (trainers print no progress bars)."""
    # deferred: transformers (slow import; only building or loading a model needs it)
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _fix_config(path: Path, arch: str, cast: torch.dtype | None) -> None:
    """Point ``architectures`` at the transformers class; record an export dtype."""
    config = json.loads(path.read_text(encoding="utf-8"))
    config["architectures"] = [arch]
    if cast is not None:
        name = str(cast).removeprefix("torch.")
        config["dtype"] = name
        if "torch_dtype" in config:
            config["torch_dtype"] = name
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def max_positions(model) -> int | None:
    """The model's position limit (``max_position_embeddings``, GPT-2's ``n_positions``) or
    None when the config has none (e.g. relative positions without a limit)."""
    conf = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(conf, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
