"""Student configuration: which causal LM, in what dtype, and how FSDP2 shards it.

Loaded strictly from YAML through :func:`xdistill.config.load_config` like every other config;
each field is documented by the comment above it. :meth:`StudentConfig.validate` checks the
cross-field rules and raises :class:`~xdistill.errors.ConfigError` naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from xdistill.errors import ConfigError
from xdistill.precision import resolve_compute_dtype

DTypeName = Literal["float32", "bfloat16", "float16"]
OptDTypeName = Literal["", "float32", "bfloat16", "float16"]
ComputeDTypeName = Literal["auto", "", "float32", "bfloat16", "float16"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, key: str = "dtype") -> torch.dtype | None:
    """``"float32"``/``"bfloat16"``/``"float16"`` -> torch dtype; ``""`` -> None (= unset)."""
    if name == "":
        return None
    try:
        return _DTYPES[name]
    except KeyError:
        raise ConfigError(f"{key}: unknown dtype {name!r}; allowed: {', '.join(_DTYPES)}") from None


@dataclass
class StudentConfig:
    """The student model and its data-parallel sharding (FSDP2)."""

    # local folder of a Hugging Face causal LM (config.json + weights); "" = build a fresh
    # random-init model from model_type + model_config
    path: str = ""
    # transformers model type of a fresh model ("llama", "qwen2", "gpt2", ...); used when path is ""
    model_type: str = "llama"
    # config fields of a fresh model (vocab_size, hidden_size, num_hidden_layers, ...); each key
    # must be a field of that model type's config
    model_config: dict[str, Any] = field(default_factory=dict)
    # seed of the random initialisation of a fresh model (the global RNG is left untouched)
    init_seed: int = 0
    # dtype of the master weights (and of the optimizer state); float32 is the safe choice
    dtype: DTypeName = "float32"
    # attention implementation passed to transformers ("sdpa", "eager", "sdpa_float32": sdpa on
    # float32 copies, ...); "" = its default, except that a student computing in a 16-bit dtype
    # on a CPU gets "sdpa_float32" (bf16 attention backward is slower there; logged once;
    # xdistill.student.attention)
    attn_implementation: str = ""
    # compute dtype of the parameters in forward/backward, cast from the master weights (FSDP2's
    # MixedPrecisionPolicy on several processes, a per-module cast on one: xdistill.student.mixed);
    # gradients come back to the master dtype and accumulate there, losses stay float32.
    # "auto" = bfloat16 where the device has fast bf16 matrix units (CUDA; CPUs whose torch
    # reports AMX), else the master dtype; the choice and its reason are logged once (see
    # xdistill.precision). "" = the master dtype (no casting); an explicit dtype always wins
    param_dtype: ComputeDTypeName = "auto"
    # dtype of the cross-rank gradient reduce-scatter ("" = same as an explicit param_dtype;
    # with param_dtype "auto" it is the master dtype, so gradients are summed in float32)
    reduce_dtype: OptDTypeName = ""
    # how gradients combine over data-parallel ranks: "sum" (use with a loss normalised by the
    # global valid-token count, see xdistill.distributed) or "mean" (FSDP's default average)
    grad_reduce: Literal["sum", "mean"] = "sum"
    # recompute each decoder layer's activations in backward (saves memory, costs ~1 forward)
    activation_checkpointing: bool = False
    # keep sharded parameters, gradients and optimizer state in CPU memory (FSDP2 CPUOffloadPolicy)
    cpu_offload: bool = False
    # free gathered layer parameters after forward (re-gathered in backward); false keeps them
    # (faster, more memory). The last layer is never resharded: backward needs it right away
    reshard_after_forward: bool = True
    # HSDP replication degree: 1 = plain FSDP over all ranks; n > 1 = shard within groups of
    # world/n ranks and replicate across the n groups (usually n = number of nodes)
    dp_replicate: int = 1

    def validate(self) -> StudentConfig:
        """Check cross-field rules; returns self. Raises ConfigError naming the key."""
        if self.path == "" and self.model_type == "":
            raise ConfigError("student: set either student.path (a local model folder) or "
                              "student.model_type (a fresh model)")
        resolve_dtype(self.dtype, "student.dtype")
        if self.param_dtype != "auto":
            resolve_dtype(self.param_dtype, "student.param_dtype")
        resolve_dtype(self.reduce_dtype, "student.reduce_dtype")
        if self.grad_reduce not in ("sum", "mean"):
            raise ConfigError(f"student.grad_reduce: expected 'sum' or 'mean', got {self.grad_reduce!r}")
        if self.dp_replicate < 1:
            raise ConfigError(f"student.dp_replicate: must be >= 1, got {self.dp_replicate}")
        return self

    def compute_dtypes(self, device: torch.device | str) -> tuple[torch.dtype, torch.dtype]:
        """(compute dtype, gradient-reduction dtype) on ``device``, ``param_dtype: auto`` and
        ``""`` resolved (see the field comments)."""
        master = self.torch_dtype
        if self.param_dtype == "auto":
            compute = resolve_compute_dtype("auto", device, "student compute")
            compute = master if compute == torch.float32 else compute
            return compute, resolve_dtype(self.reduce_dtype, "student.reduce_dtype") or master
        compute = resolve_dtype(self.param_dtype, "student.param_dtype") or master
        return compute, resolve_dtype(self.reduce_dtype, "student.reduce_dtype") or compute

    @property
    def torch_dtype(self) -> torch.dtype:
        """Master-weight dtype as a torch dtype."""
        return resolve_dtype(self.dtype, "student.dtype")  # type: ignore[return-value]
