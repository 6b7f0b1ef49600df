"""Run configs: ``OffPolicyConfig`` (``xdistill train offpolicy``) and its sections.

``OffPolicyConfig`` is a :class:`xdistill.train.run_config.RunConfig` (student, optim, scheduler,
train, checkpoint: the sections every run has) plus its own: teachers, data, loss, eval.
Every field is documented by the comment above it (``xdistill config show offpolicy`` prints them).
:func:`validate_offpolicy` checks what can be checked before any compute: paths exist, batch
sizes divide, loss kinds fit the teachers; the trainer then checks the tokenizer/projection pairs.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Literal

from xdistill.data.config import DataConfig, validate_data
from xdistill.errors import ConfigError
from xdistill.losses.multi_teacher import (CROSS_TOKENIZER_LOSSES, SAME_TOKENIZER_LOSSES, SCORES,
                                           WEIGHTINGS)
from xdistill.train.run_config import (RunConfig, RunTeacherConfig, check_loss_scale, check_path,
                                       check_teacher_names, default_out_dir, validate_run_sections,
                                       validate_student_source, validate_teacher_worker)

LossKind = Literal["forward_kl", "reverse_kl", "jsd", "topk_kl", "exact_kl", "pkl", "uld", "gold",
                   "alm"]


@dataclass
class TeacherLossConfig:
    """How one teacher enters the loss (see xdistill.losses)."""

    # loss type: same-tokenizer forward_kl/reverse_kl/jsd/topk_kl, or cross-tokenizer
    # exact_kl/pkl/uld/gold/alm
    kind: LossKind = "pkl"
    # static weight (the prior weight when loss.weighting = dynamic)
    weight: float = 1.0
    # loss temperature tau on both sides (tau^2 scaling on KL terms)
    temperature: float = 1.0
    # projection artifact (.npz from `xdistill projection build`) for kind pkl
    projection: str = ""
    # kind pkl: also compare the teacher's next-token distributions inside each chunk's first
    # student token when the teacher spells it in several pieces (a whole-number student token
    # vs digit pieces; see xdistill/losses/continuation.py); needs direction forward and
    # worker.output logits
    continuation: bool = False
    # KL direction of the cross-tokenizer KL losses: forward, reverse or jsd
    direction: Literal["forward", "reverse", "jsd"] = "forward"
    # JSD beta (kind jsd or direction jsd)
    beta: float = 0.5
    # ALM variant: bce (binary cross-entropy of chunk likelihoods) or abs (|l_S - l_T|)
    alm_variant: Literal["bce", "abs"] = "bce"
    # ALM likelihood temperature
    alm_temperature: float = 100.0
    # GOLD: weight of the KL on the exact-matched vocabulary
    common_weight: float = 1.0
    # GOLD: weight of the sorted L1 on the rest of the vocabulary
    uncommon_weight: float = 1.0


@dataclass
class TeacherRunConfig(RunTeacherConfig):
    """One teacher of an off-policy run: the shared part (:class:`RunTeacherConfig`: name,
    tokenizer, max_len, add_bos, worker) and its loss."""

    # how this teacher's divergence is computed and weighted
    loss: TeacherLossConfig = field(default_factory=TeacherLossConfig)


@dataclass
class LossConfig:
    """How the teachers' losses combine."""

    # teacher weighting: static, dynamic (softmax(alpha * score)) or pick_best
    weighting: Literal["static", "dynamic", "pick_best"] = "static"
    # per-batch teacher score for dynamic/pick_best: neg_ce, neg_entropy or confidence
    score: Literal["neg_ce", "neg_entropy", "confidence"] = "neg_ce"
    # sharpness alpha of the dynamic softmax
    alpha: float = 1.0
    # weight lambda of the student's own next-token cross-entropy
    ce_weight: float = 0.0
    # label smoothing eps of that cross-entropy, in [0, 1): (1 - eps) * CE + eps * the CE to the
    # uniform distribution over the vocabulary (torch's definition); evaluation's `ce` includes it
    label_smoothing: float = 0.0
    # sequence positions per block when computing losses (bounds memory), >= 1; null = no
    # blocking
    chunk_size: int | None = 256


@dataclass
class EvalConfig:
    """Held-out evaluation: student loss, bits per byte, per-teacher divergence, coverage."""

    # evaluate every this many steps (0 = only at the end; -1 = never)
    every: int = 0
    # held-out dataset paths (same formats as data.paths); empty = no evaluation
    paths: list[str] = field(default_factory=list)
    # held-out batches per evaluation
    batches: int = 4


@dataclass
class OffPolicyConfig(RunConfig):
    """``xdistill train offpolicy``: distil teachers into a student over a fixed corpus (the
    shared sections: :class:`RunConfig`)."""

    # teachers, each with its own tokenizer, worker and loss
    teachers: list[TeacherRunConfig] = field(default_factory=list)
    # corpus, packing, sharding and collation
    data: DataConfig = field(default_factory=DataConfig)
    # how teacher losses combine (+ CE)
    loss: LossConfig = field(default_factory=LossConfig)
    # held-out evaluation
    eval: EvalConfig = field(default_factory=EvalConfig)


def data_ranks(cfg: OffPolicyConfig, world_size: int) -> int:
    """Number of data shards (``train.data_ranks``, 0 = the world size); a multiple of the world."""
    n = cfg.train.data_ranks or world_size
    if n < 1 or n % world_size:
        raise ConfigError(f"train.data_ranks ({cfg.train.data_ranks}) must be 0 or a positive "
                          f"multiple of the world size ({world_size})")
    return n


def grad_accum_steps(cfg, world_size: int, micro_batch: int | None = None) -> int:
    """Micro-batches per optimizer step from each data shard; ConfigError when sizes don't divide.

    ``global_batch_size = micro_batch * data_ranks * grad_accum_steps`` (``micro_batch`` is
    ``data.batch_size`` off-policy, ``prompts.batch_size`` on-policy; ``global_batch_size = 0``
    means one micro-batch per data rank).
    """
    shards = data_ranks(cfg, world_size)
    micro = cfg.data.batch_size if micro_batch is None else int(micro_batch)
    key = "data.batch_size" if micro_batch is None else "prompts.batch_size"
    per_step = micro * shards
    total = cfg.train.global_batch_size or per_step
    if micro < 1 or total < 1 or total % per_step:
        raise ConfigError(
            f"train.global_batch_size ({cfg.train.global_batch_size}) must be 0 or a positive "
            f"multiple of {key} ({micro}) x data ranks ({shards}, the world size unless "
            f"train.data_ranks is set) = {per_step}")
    return total // per_step


def check_chunk_size(value, key: str = "loss.chunk_size") -> None:
    """A loss block size is null (one block) or a whole number >= 1 (a negative one computed
    every loss over no row at all: zero loss, zero gradient)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"{key} must be >= 1 or null (no blocking), got {value!r}")


def validate_offpolicy(cfg: OffPolicyConfig, world_size: int = 1) -> OffPolicyConfig:
    """Checks that need no compute; raises ConfigError naming the key. Fills derived defaults."""
    validate_run_sections(cfg)
    default_out_dir(cfg, "offpolicy")
    if cfg.eval.paths and cfg.eval.batches < 1:
        raise ConfigError(f"eval.batches must be >= 1, got {cfg.eval.batches}")
    grad_accum_steps(cfg, world_size)
    validate_student_source(cfg, "dir")
    if not cfg.data.paths:
        raise ConfigError("data.paths: no training data given")
    validate_data(cfg.data, "data")
    if not cfg.loss.ce_weight >= 0:    # NaN too
        raise ConfigError(f"loss.ce_weight must be >= 0, got {cfg.loss.ce_weight}")
    if not math.isfinite(cfg.loss.alpha):
        raise ConfigError(f"loss.alpha must be finite, got {cfg.loss.alpha}")
    if cfg.eval.every < -1:
        raise ConfigError(f"eval.every must be >= -1 (-1 = never, 0 = at the end), got "
                          f"{cfg.eval.every}")
    if not 0.0 <= cfg.loss.label_smoothing < 1.0:
        raise ConfigError(f"loss.label_smoothing must lie in [0, 1), got "
                          f"{cfg.loss.label_smoothing}")
    check_chunk_size(cfg.loss.chunk_size)
    for i, path in enumerate(cfg.data.paths):
        check_path(path, f"data.paths.{i}")
    for i, path in enumerate(cfg.eval.paths):
        check_path(path, f"eval.paths.{i}")
    check_teacher_names(cfg.teachers)
    if not cfg.teachers and cfg.loss.ce_weight <= 0:
        raise ConfigError("teachers: no teacher and loss.ce_weight = 0 leaves nothing to train")
    for i, t in enumerate(cfg.teachers):
        _validate_teacher(t, f"teachers.{i}")
    if cfg.loss.weighting not in WEIGHTINGS or cfg.loss.score not in SCORES:
        raise ConfigError("loss.weighting/score out of range")
    for i, t in enumerate(cfg.teachers):
        if t.worker.output == "support" and cfg.loss.weighting != "static":
            raise ConfigError(f"teachers.{i}.worker.output: 'support' outputs carry no scores "
                              f"for loss.weighting {cfg.loss.weighting!r} (use 'logits')")
    return cfg


def _validate_teacher(t: TeacherRunConfig, key: str) -> None:
    validate_teacher_worker(t, key, "dir")
    kind = t.loss.kind
    if kind not in SAME_TOKENIZER_LOSSES + CROSS_TOKENIZER_LOSSES:
        raise ConfigError(f"{key}.loss.kind: unknown loss {kind!r}")
    if kind == "pkl":
        if not t.loss.projection:
            raise ConfigError(f"{key}.loss.projection: loss 'pkl' needs a projection artifact "
                              "(build one with `xdistill projection build`)")
        check_path(t.loss.projection, f"{key}.loss.projection")
    if t.loss.continuation and (kind != "pkl" or t.loss.direction != "forward"
                                or t.worker.output != "logits"):
        raise ConfigError(f"{key}.loss.continuation: needs loss.kind 'pkl', loss.direction "
                          f"'forward' and worker.output 'logits' (got {kind!r}, "
                          f"{t.loss.direction!r}, {t.worker.output!r})")
    if t.worker.output == "support" and kind != "pkl":
        raise ConfigError(f"{key}.worker.output: 'support' outputs (the logits at a projection's "
                          f"support) only feed loss 'pkl', got loss.kind {kind!r}")
    if kind == "topk_kl" and t.worker.output != "topk":
        raise ConfigError(f"{key}: loss 'topk_kl' needs worker.output = 'topk', "
                          f"got {t.worker.output!r}")
    check_loss_scale(t.loss, key)
    lc = t.loss      # written so that NaN fails too
    for name, ok, want in (("alm_temperature", 0 < lc.alm_temperature < math.inf, "> 0"),
                           ("common_weight", 0 <= lc.common_weight < math.inf, ">= 0"),
                           ("uncommon_weight", 0 <= lc.uncommon_weight < math.inf, ">= 0"),
                           ("beta", 0 <= lc.beta <= 1, "in [0, 1]")):
        if not ok:
            raise ConfigError(f"{key}.loss.{name} must be {want} and finite, got "
                              f"{getattr(lc, name)}")
