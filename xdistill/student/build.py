"""The training student: its device, the model (sharded or in mixed precision) and its checks.

Mode-neutral: both trainers (``train offpolicy``, ``train onpolicy``) build their student here,
through :func:`xdistill.train.core.build_student_stack`. The checks fail before any step runs:
the student's logits must cover every id of the student tokenizer (:func:`check_vocab`), and the
longest sequence a run feeds the model must fit its positions (:func:`check_positions`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from xdistill.errors import ConfigError
from xdistill.student.attention import use_float32_attention
from xdistill.student.config import StudentConfig
from xdistill.student.model import load_student, max_positions
from xdistill.student.parallelize import parallelize_student

if TYPE_CHECKING:
    from xdistill.distributed import DistEnv
    from xdistill.tokenization.tokenizer import Tokenizer


def resolve_device(name: str, env: DistEnv) -> torch.device:
    """``train.device``: ``auto`` is the process's own device (``env.device``)."""
    if name == "auto":
        return env.device
    if name == "cuda" and torch.cuda.is_available():
        return torch.device("cuda", env.local_rank)
    return torch.device(name)


def build_student(cfg: StudentConfig, env: DistEnv, device: torch.device) -> nn.Module:
    """Load the student (``student`` section), shard it (FSDP2) or give it the one-process
    mixed precision (``student.param_dtype``); a 16-bit compute dtype on a CPU gets float32
    attention (:mod:`xdistill.student.attention`)."""
    model = load_student(cfg)
    use_float32_attention(model, cfg.attn_implementation, cfg.compute_dtypes(device)[0], device)
    model = parallelize_student(model, None, cfg, device=device)
    if not env.distributed:
        model.to(device)
    return model


def check_vocab(model: nn.Module, student_tok: Tokenizer) -> None:
    """The student's logit width must cover every student token id."""
    vocab = int(model.get_output_embeddings().weight.shape[0])
    if vocab < student_tok.vocab_size:
        raise ConfigError(f"student model has {vocab} output logits but tokenizer "
                          f"{student_tok.name!r} has {student_tok.vocab_size} ids "
                          "(student.model_config.vocab_size too small)")


def check_positions(model: nn.Module, length: int, key: str, what: str = "student") -> None:
    """ConfigError naming ``key`` when ``length`` tokens exceed the model's positions (Llama
    silently extrapolates its rotary positions; GPT-2 fails inside the forward)."""
    limit = max_positions(model)
    if limit is not None and length > limit:
        raise ConfigError(f"{key}: {length} {what} tokens per sequence exceed the model's "
                          f"{limit} positions")
