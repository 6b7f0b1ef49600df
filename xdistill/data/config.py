"""DataConfig: where the corpus is and how it is packed, sharded, batched and collated."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from xdistill.errors import ConfigError


@dataclass
class DataConfig:
    """The data section of a training config (every field documented for ``xdistill config show``)."""

    # dataset paths: `xdistill data prepare` output directories, arrow/feather/parquet files or
    # directories of them
    paths: list[str] = field(default_factory=list)
    # column (or JSON key) holding a text document
    text_column: str = "text"
    # column holding chat documents: a list of {role, content}
    messages_column: str = "messages"
    # invalid UTF-8 in a text column: "error" (names the file and row) or "replace" (U+FFFD)
    invalid_utf8: Literal["error", "replace"] = "error"
    # student tokens per window (documents are packed and split to fill windows of this length;
    # a resume may change it: the data continues at the next unread token, in the new windows)
    seq_len: int = 2048
    # windows per batch on each data-parallel rank
    batch_size: int = 8
    # DataLoader worker processes per rank (0: load in the training process)
    num_workers: int = 2
    # batches each worker prepares ahead
    prefetch_factor: int = 2
    # how workers are started: "auto" = spawn when this process already holds CUDA state (a
    # CUDA run: on an H200 the first step with forked workers had not finished after 190 s,
    # with spawned ones it took 47 s), else fork (fast; the CPU pipeline is fork-safe)
    multiprocessing_context: Literal["auto", "fork", "spawn", "forkserver"] = "auto"
    # watchdog: end the run with an error naming the worker when no batch arrives from the
    # loader workers for this many seconds (0: wait forever; only with num_workers > 0)
    timeout_s: float = 600.0
    # seed of the per-epoch document permutation
    seed: int = 0
    # shuffle documents each epoch (False: file order)
    shuffle: bool = True
    # passes over the data per iteration of the loader (null: repeat forever; trainers stop at
    # their step budget -- use null for multi-rank runs so all ranks get the same step count);
    # finite passes that end before train.steps stop the run with a checkpoint of the last step
    epochs: int | None = None
    # prepend the student's BOS token to each window; null = the student model's own default
    # (its tokenizer's add_bos_token / post-processor, the GGUF's tokenizer.ggml.add_bos_token);
    # true/false override it (a value unlike the model's default is logged once as a warning)
    add_bos: bool | None = None
    # chat roles whose message content carries loss
    loss_roles: list[str] = field(default_factory=lambda: ["assistant"])
    # also train the end-of-turn special token that follows a trained message
    end_of_turn_loss: bool = True
    # text documents: a special token's string written in the text (<|endoftext|>, </s>) is the
    # text it spells, for the student and every teacher alike (true), or that tokenizer's special
    # token (false: each side then reads other bytes there); chat templates' own tokens are
    # always special. A checkpoint saved before this key existed was written under false: its
    # data position resumes only with data.specials_as_text=false (else a clear error)
    specials_as_text: bool = True
    # chunk granularity passed to the aligner: "minimal" or "space" (merge to whitespace words)
    chunks: Literal["minimal", "space"] = "minimal"
    # aligner method: "auto" (exact when the bytes agree, else DP), "exact" or "dp"
    align_method: Literal["auto", "exact", "dp"] = "auto"
    # round padded sequence lengths up to a multiple of this (8 or 64 help GPU kernels)
    pad_to_multiple_of: int = 1


def validate_data(cfg: DataConfig, key: str = "data") -> None:
    """Value ranges of a data section; ConfigError naming ``<key>.<field>`` (before any compute)."""
    checks = [("seq_len", cfg.seq_len >= 2, ">= 2"), ("batch_size", cfg.batch_size >= 1, ">= 1"),
              ("num_workers", cfg.num_workers >= 0, ">= 0 (0 = load in the training process)"),
              ("prefetch_factor", cfg.prefetch_factor >= 1, ">= 1"),
              ("timeout_s", cfg.timeout_s >= 0, ">= 0 (0 = wait forever)"),
              ("pad_to_multiple_of", cfg.pad_to_multiple_of >= 1, ">= 1"),
              ("epochs", cfg.epochs is None or cfg.epochs >= 1, ">= 1 or null"),
              ("seed", cfg.seed >= 0, ">= 0 (numpy seeds are non-negative)")]
    for name, ok, want in checks:
        if not ok:
            raise ConfigError(f"{key}.{name} must be {want}, got {getattr(cfg, name)!r}")
    if not cfg.loss_roles:
        raise ConfigError(f"{key}.loss_roles: empty; chat rows would carry no loss")
