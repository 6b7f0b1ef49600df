"""Run configs: ``OffPolicyConfig`` (``xdistill train offpolicy``) and its sections.

Every field is documented by the comment above it (``xdistill config show offpolicy`` prints them).
:func:`validate_offpolicy` checks what can be checked before any compute: paths exist, batch
sizes divide, loss kinds fit the teachers; the trainer then checks the tokenizer/projection pairs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from xdistill.data.config import DataConfig, validate_data
from xdistill.errors import ConfigError
from xdistill.losses.multi_teacher import (CROSS_TOKENIZER_LOSSES, SAME_TOKENIZER_LOSSES, SCORES,
                                           WEIGHTINGS)
from xdistill.student.config import StudentConfig
from xdistill.teacher.config import TeacherConfig
from xdistill.train.optim import OptimConfig, SchedulerConfig

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
class TeacherRunConfig:
    """One teacher of a run: its tokenizer, its worker and its loss."""

    # teacher name (unique; used in metrics as <name>/loss)
    name: str = "teacher"
    # tokenizer spec (asset name, folder, .tiktoken/.model/.gguf); "" = the worker's model folder
    tokenizer: str = ""
    # most teacher tokens per window (longer windows are cut at a byte boundary shared with the
    # student); null = no limit
    max_len: int | None = None
    # prepend this teacher's BOS token to each of its rows; null = the teacher model's own
    # default (Gemma adds its <bos>, SmolLM2 and GPT-2 add none); true/false override it (a
    # value unlike the model's default is logged once as a warning)
    add_bos: bool | None = None
    # the teacher worker: model folder, placement, output kind, transport, timeouts
    worker: TeacherConfig = field(default_factory=TeacherConfig)
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
    # sequence positions per block when computing losses (bounds memory); null = no blocking
    chunk_size: int | None = 256


@dataclass
class TrainConfig:
    """The optimisation loop (shared by ``train offpolicy`` and ``train onpolicy``)."""

    # optimizer steps to run
    steps: int = 100
    # rows per optimizer step over all ranks: windows (off-policy) or prompts (on-policy). A
    # multiple of the per-rank micro-batch (data.batch_size, or prompts.batch_size on-policy) x
    # the data ranks; the quotient is the number of gradient-accumulation micro-batches. 0 = one
    # micro-batch per data rank (no accumulation)
    global_batch_size: int = 0
    # global seed (python, numpy, torch; data and prompt order)
    seed: int = 0
    # log a metrics line every this many steps
    log_every: int = 1
    # run directory: metrics.jsonl, checkpoints/, export/ ("" = runs/offpolicy or runs/onpolicy)
    out_dir: str = ""
    # device of the student: "auto" (cuda:<local rank> when available, else cpu), "cpu", "cuda"
    device: str = "auto"
    # off-policy: data shards (virtual data-parallel ranks) the corpus is split into; 0 = the
    # world size. Must be a multiple of the world size: each process reads data_ranks / world
    # loaders, so one process with data_ranks = N sees exactly the global batches of an N-rank run
    data_ranks: int = 0
    # write a hash of every window (off-policy) or response (on-policy) each rank trains on to
    # out_dir/samples_rank<R>.jsonl
    log_samples: bool = False
    # also log metrics to TensorBoard (out_dir/tb); needs the tensorboard package (pip install
    # 'xdistill[tracking]'; when it is missing a warning says so and the run goes on)
    tensorboard: bool = True
    # also log metrics to Weights & Biases: "off", "offline" (out_dir/wandb, no network; `wandb
    # sync` uploads it later) or "online" (after `wandb login`); needs the wandb package
    # (xdistill[tracking]); WANDB_MODE=offline keeps an online run offline
    wandb: Literal["off", "offline", "online"] = "off"
    # W&B project of the run (train.wandb)
    wandb_project: str = "xdistill"
    # debugging: after the checkpoint of this step, exit at once with code 3 (simulates a crash;
    # 0 = never)
    stop_after: int = 0
    # torch intra-op and aligner (numba) threads of the training process (0 = their defaults:
    # one per core)
    num_threads: int = 0
    # a step whose loss or gradient norm is NaN/inf is skipped (no optimizer update) and logged
    # with the teachers whose terms were non-finite; the run stops with an error after this many
    # such steps in a row (or when no step of the run was finite)
    max_nonfinite_steps: int = 3
    # off-policy: remote (subprocess / Ray) teachers score the next micro-batches while the
    # student computes (same results as the sequential path; needs teacher worker.slots >= 2)
    pipeline_teachers: bool = True


@dataclass
class CheckpointConfig:
    """Distributed checkpoints (torch.distributed.checkpoint) and the final export."""

    # save every this many steps (0 = only at the end)
    every: int = 0
    # keep the newest N complete checkpoints (0 = keep all)
    keep_last: int = 2
    # "auto" (latest complete checkpoint in out_dir/checkpoints, if any), a checkpoint path, or ""
    resume: str = "auto"
    # write a Hugging Face model folder (save_pretrained + tokenizer) to out_dir/export at the end
    export_hf: bool = True
    # dtype of the exported weights: "auto" = the student model's own (the dtype / torch_dtype
    # of its config.json, e.g. bfloat16 for SmolLM2; the training dtype for a fresh student or
    # a .gguf), or "float32", "bfloat16", "float16"
    export_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # resuming with another number of ranks than the checkpoint's: true = an error; false = load
    # the model, optimizer and scheduler only (per-rank RNG and data-loader states start fresh)
    strict_world_size: bool = True


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
class RunSchedulerConfig(SchedulerConfig):
    """Learning-rate schedule of a run: linear warmup, then a decay to ``min_lr_ratio * lr``."""

    # shape after warmup: "cosine" or "linear" decay to min_lr_ratio, or "constant"
    kind: Literal["cosine", "linear", "constant"] = "cosine"
    # optimizer steps of linear warmup from lr/warmup_steps up to lr (0 = start at lr)
    warmup_steps: int = 0
    # optimizer steps of the whole schedule (warmup included); 0 = train.steps
    total_steps: int = 0
    # final learning rate as a fraction of lr (cosine/linear)
    min_lr_ratio: float = 0.1


@dataclass
class OffPolicyConfig:
    """``xdistill train offpolicy``: distil teachers into a student over a fixed corpus."""

    # the student model and its FSDP2 sharding
    student: StudentConfig = field(default_factory=StudentConfig)
    # student tokenizer spec (asset name, folder, ...); "" = the student model folder
    student_tokenizer: str = ""
    # teachers, each with its own tokenizer, worker and loss
    teachers: list[TeacherRunConfig] = field(default_factory=list)
    # corpus, packing, sharding and collation
    data: DataConfig = field(default_factory=DataConfig)
    # how teacher losses combine (+ CE)
    loss: LossConfig = field(default_factory=LossConfig)
    # AdamW
    optim: OptimConfig = field(default_factory=OptimConfig)
    # learning-rate schedule (scheduler.total_steps defaults to train.steps when left at 0)
    scheduler: RunSchedulerConfig = field(default_factory=RunSchedulerConfig)
    # loop, seed, output directory
    train: TrainConfig = field(default_factory=TrainConfig)
    # checkpoints, resume and export
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
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


def default_out_dir(cfg, kind: str) -> None:
    """``train.out_dir = ""`` becomes ``runs/<kind>``."""
    if not cfg.train.out_dir:
        cfg.train.out_dir = f"runs/{kind}"


def check_path(path: str, key: str, kind: str = "any") -> None:
    """ConfigError naming ``key`` unless ``path`` exists (and is a directory for ``kind="dir"``)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"{key}: {path!r} does not exist")
    if kind == "dir" and not p.is_dir():
        raise ConfigError(f"{key}: {path!r} is not a directory")


def check_model_path(spec: str, key: str, kind: str = "any") -> None:
    """Like :func:`check_path`, but a pretrained model asset name (``smollm2-135m``) is resolved
    to its fetched folder first (an unfetched asset is an error naming the fetch script)."""
    from xdistill.errors import XDistillError
    from xdistill.student.model import resolve_model_path

    try:
        path = resolve_model_path(spec)
    except XDistillError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    check_path(str(path), key, kind)


def validate_run_sections(cfg) -> None:
    """Checks shared by the off- and on-policy configs: student, optim, scheduler (fills
    ``scheduler.total_steps`` from ``train.steps``), ``train.steps`` and ``train.stop_after``."""
    cfg.student.validate()
    cfg.optim.validate()
    if cfg.scheduler.total_steps == 0:
        cfg.scheduler.total_steps = max(cfg.train.steps, cfg.scheduler.warmup_steps, 1)
    cfg.scheduler.validate()
    if cfg.train.steps < 1:
        raise ConfigError(f"train.steps must be >= 1, got {cfg.train.steps}")
    if cfg.train.log_every < 1:
        raise ConfigError(f"train.log_every must be >= 1, got {cfg.train.log_every}")
    if cfg.checkpoint.every < 0 or cfg.checkpoint.keep_last < 0:
        raise ConfigError(f"checkpoint.every and checkpoint.keep_last must be >= 0, got "
                          f"{cfg.checkpoint.every} and {cfg.checkpoint.keep_last}")
    if cfg.train.max_nonfinite_steps < 1:
        raise ConfigError(f"train.max_nonfinite_steps must be >= 1, got "
                          f"{cfg.train.max_nonfinite_steps}")
    if cfg.train.stop_after and (cfg.checkpoint.every <= 0
                                 or cfg.train.stop_after % cfg.checkpoint.every):
        raise ConfigError(f"train.stop_after ({cfg.train.stop_after}) must be a multiple of "
                          f"checkpoint.every ({cfg.checkpoint.every}) so a checkpoint exists")


def validate_student_source(cfg, path_kind: str = "any") -> None:
    """``student.path`` exists; a fresh student (no path) needs ``student_tokenizer``."""
    if cfg.student.path:
        check_model_path(cfg.student.path, "student.path", path_kind)
    if not cfg.student_tokenizer and not cfg.student.path:
        raise ConfigError("student_tokenizer: set it (a fresh student model has no tokenizer)")


def check_teacher_names(teachers: list) -> None:
    names = [t.name for t in teachers]
    if len(set(names)) != len(names):
        raise ConfigError(f"teachers: names must be unique, got {names}")


def validate_teacher_worker(t, key: str, model_kind: str = "any") -> None:
    """Name the worker after its teacher; its model folder must be given and exist."""
    t.worker.name = t.name
    if not t.worker.model:
        raise ConfigError(f"{key}.worker.model: a teacher model folder is required")
    check_model_path(t.worker.model, f"{key}.worker.model", model_kind)
    t.worker.validate()


def check_loss_scale(loss, key: str) -> None:
    if loss.temperature <= 0 or loss.weight < 0:
        raise ConfigError(f"{key}.loss: temperature must be > 0 and weight >= 0")


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
    if cfg.loss.ce_weight < 0:
        raise ConfigError(f"loss.ce_weight must be >= 0, got {cfg.loss.ce_weight}")
    if not 0.0 <= cfg.loss.label_smoothing < 1.0:
        raise ConfigError(f"loss.label_smoothing must lie in [0, 1), got "
                          f"{cfg.loss.label_smoothing}")
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
    if kind == "topk_kl" and t.worker.output != "topk":
        raise ConfigError(f"{key}: loss 'topk_kl' needs worker.output = 'topk', "
                          f"got {t.worker.output!r}")
    check_loss_scale(t.loss, key)
