"""The student's attention in float32 when it computes in bfloat16 on a CPU.

On CPUs, PyTorch's scaled-dot-product attention is slower in bfloat16 than in float32 once its
backward runs: measured forward+backward at SmolLM2-135M's shapes (4 x 9 heads x 128-256 tokens x
64), 2-3x slower on an AVX512-BF16 Xeon, and 72 vs 15 ms per step on an AMX Xeon (the real-pair
step's profile, ``benchmarks/real/profile_step.py``). The matrix products around it (projections,
MLP, head) are where bfloat16 pays. So a student that computes in bfloat16 on a CPU gets the
attention implementation ``sdpa_float32``: queries, keys and values are cast to float32, attention
runs as transformers' own ``sdpa`` would run it, and its output is cast back to the compute dtype.
It is more accurate than bfloat16 attention, not less.

It is chosen only where ``student.attn_implementation`` is left at ``""`` (transformers' default),
the model resolved to ``sdpa``, the compute dtype is 16-bit and the device is a CPU; the choice is
logged once. An explicit ``student.attn_implementation`` always wins (``sdpa_float32`` may also be
named there, on any device). Teachers keep their attention: their forward-only bfloat16 attention
is as fast as float32 here.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

log = logging.getLogger(__name__)

FLOAT32_SDPA = "sdpa_float32"
_LOW_PRECISION = (torch.bfloat16, torch.float16)


def float32_sdpa_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                         value: torch.Tensor, attention_mask: torch.Tensor | None,
                         **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa`` attention on float32 copies of ``query``/``key``/``value`` (and of a
    floating-point mask); the output comes back in ``query``'s dtype."""
    # deferred: transformers (slow import; only a model's forward reaches this)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    dtype = query.dtype
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()
    out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(),
                                          attention_mask, **kwargs)
    return out.to(dtype), weights


def register_float32_sdpa() -> str:
    """Make ``sdpa_float32`` a transformers attention implementation (attention and mask: the
    ``sdpa`` mask); idempotent. Returns the name."""
    # deferred: transformers (slow import; only building or loading a model needs it)
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(FLOAT32_SDPA, float32_sdpa_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(FLOAT32_SDPA, sdpa_mask)
    return FLOAT32_SDPA


def wants_float32_attention(setting: str, current: str | None, compute_dtype: torch.dtype,
                            device: torch.device | str) -> bool:
    """Whether a student whose ``attn_implementation`` setting is ``setting``, loaded with
    ``current`` (``model.config._attn_implementation``), computing in ``compute_dtype`` on
    ``device``, switches to :data:`FLOAT32_SDPA` (see module doc)."""
    return (setting == "" and current == "sdpa" and compute_dtype in _LOW_PRECISION
            and torch.device(device).type == "cpu")


def use_float32_attention(model: nn.Module, setting: str, compute_dtype: torch.dtype,
                          device: torch.device | str) -> bool:
    """Switch ``model`` to :data:`FLOAT32_SDPA` when :func:`wants_float32_attention` says so;
    returns whether it did (logged once)."""
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if not wants_float32_attention(setting, current, compute_dtype, device):
        return False
    register_float32_sdpa()
    model.set_attn_implementation(FLOAT32_SDPA)
    if model.config._attn_implementation != FLOAT32_SDPA:   # a model without the interface
        return False
    log.info("student attention: %s (bfloat16 attention backward is slower than float32 on "
             "CPUs; set student.attn_implementation to override)", FLOAT32_SDPA)
    return True
