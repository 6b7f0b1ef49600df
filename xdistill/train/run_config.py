"""The sections every run config shares: ``RunConfig`` (student, optim, schedule, loop, checkpoints).

``OffPolicyConfig`` (:mod:`xdistill.train.config`) and ``OnPolicyConfig``
(:mod:`xdistill.train.onpolicy_config`) both inherit :class:`RunConfig` (the student, its
tokenizer, AdamW, the learning-rate schedule, the loop, checkpoints) and add only their own
sections (teachers, data or prompts, loss, ...). The trainer core (:mod:`xdistill.train.core`)
reads nothing but these shared sections. Also here: the checks both modes run on them
(:func:`validate_run_sections`) and the small path / teacher checks their validators share,
and :class:`RunTeacherConfig`, the part of a teacher's config both modes share.

Every field is documented by the comment above it (``xdistill config show`` prints them).
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from xdistill.errors import ConfigError, XDistillError
from xdistill.student.config import StudentConfig
from xdistill.student.model import resolve_model_path
from xdistill.teacher.config import TeacherConfig
from xdistill.train.optim import OptimConfig, SchedulerConfig


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
    # log a metrics line every this many steps (and at the last step; trackers get every step)
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
    # torch intra-op threads of the training process (0 = torch's default: one per core); the
    # training process always aligns on one thread (numba's parallel kernel would start a second
    # OpenMP runtime beside torch's; loader worker processes align in parallel)
    num_threads: int = 0
    # large freed host blocks: "reuse" keeps them in the process for the next step (glibc
    # mallopt; no page faults re-touching fresh memory every step; resident memory stays at its
    # peak), "system" = the C library's default (return them to the OS), "auto" = reuse on a CPU
    # device, system on CUDA. Teacher worker processes follow the trainer's choice
    host_allocator: Literal["auto", "reuse", "system"] = "auto"
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
    # "auto" (latest complete checkpoint in out_dir/checkpoints, if any), a checkpoint path, or
    # "none" (or ""): start afresh;
    # a run starting before the latest step renames the later checkpoints step_N.abandoned
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
class RunSchedulerConfig(SchedulerConfig):
    """Learning-rate schedule of a run: linear warmup, then a decay to ``min_lr_ratio * lr``."""

    # shape after warmup: "cosine" or "linear" decay to min_lr_ratio, or "constant"
    kind: Literal["cosine", "linear", "constant"] = "cosine"
    # optimizer steps of linear warmup from lr/warmup_steps up to lr (0 = start at lr)
    warmup_steps: int = 0
    # optimizer steps of the whole schedule (warmup included); 0 = train.steps, or
    # warmup_steps when that is larger (a run shorter than its warmup ends still warming up)
    total_steps: int = 0
    # final learning rate as a fraction of lr (cosine/linear)
    min_lr_ratio: float = 0.1


@dataclass
class RunTeacherConfig:
    """One teacher of a run, the part both modes share: its name, tokenizer, length cap, BOS and
    worker. Each mode's teacher config extends it with its loss only
    (:class:`xdistill.train.config.TeacherRunConfig`,
    :class:`xdistill.train.onpolicy_config.OnPolicyTeacherConfig`)."""

    # teacher name (unique; used in metrics as <name>/loss)
    name: str = "teacher"
    # tokenizer spec (asset name, folder, .tiktoken/.model/.gguf); "" = the worker's model folder
    tokenizer: str = ""
    # most teacher tokens per row; null = no limit. Off-policy: longer windows are cut at a byte
    # boundary shared with the student; on-policy: a scored row's prompt is cut from the left first
    # (its BOS kept), except for a teacher of the student's tokenizer, which scores the student's
    # rows as they are and must hold rollout.max_prompt_len + rollout.max_new_tokens
    max_len: int | None = None
    # prepend this teacher's BOS token to each of its rows (on-policy: unless its rendered prompt
    # already starts with it); null = the teacher model's own default (Gemma adds its <bos>,
    # SmolLM2 and GPT-2 add none); true/false override it (a value unlike the model's default is
    # logged once as a warning)
    add_bos: bool | None = None
    # the teacher worker: model folder, placement, output kind, transport, timeouts
    worker: TeacherConfig = field(default_factory=TeacherConfig)


@dataclass
class RunConfig:
    """The sections of every run (``train offpolicy`` and ``train onpolicy``); a mode's config
    inherits them and adds its own (teachers, data or prompts, loss, ...)."""

    # the student model and its FSDP2 sharding
    student: StudentConfig = field(default_factory=StudentConfig)
    # student tokenizer spec (asset name, folder, ...); "" = the student model folder
    student_tokenizer: str = ""
    # AdamW
    optim: OptimConfig = field(default_factory=OptimConfig)
    # learning-rate schedule (scheduler.total_steps left at 0: train.steps, or warmup_steps if
    # larger)
    scheduler: RunSchedulerConfig = field(default_factory=RunSchedulerConfig)
    # loop, seed, output directory
    train: TrainConfig = field(default_factory=TrainConfig)
    # checkpoints (with every data or prompt loader's state), resume and export
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)


def default_out_dir(cfg: RunConfig, kind: str) -> None:
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
    try:
        path = resolve_model_path(spec)
    except XDistillError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    check_path(str(path), key, kind)


def validate_run_sections(cfg: RunConfig) -> None:
    """Checks shared by the off- and on-policy configs: student, optim, scheduler (fills
    ``scheduler.total_steps`` from ``train.steps``), checkpoint cadence and the ``train``
    section (steps, log_every, seed, num_threads, stop_after, max_nonfinite_steps)."""
    cfg.student.validate()
    cfg.optim.validate()
    if cfg.scheduler.total_steps == 0:
        cfg.scheduler.total_steps = max(cfg.train.steps, cfg.scheduler.warmup_steps, 1)
    cfg.scheduler.validate()
    if cfg.train.steps < 1:
        raise ConfigError(f"train.steps must be >= 1, got {cfg.train.steps}")
    if cfg.train.log_every < 1:
        raise ConfigError(f"train.log_every must be >= 1, got {cfg.train.log_every}")
    if not 0 <= cfg.train.seed < 2 ** 32:
        raise ConfigError(f"train.seed must be in [0, 2**32), got {cfg.train.seed}")
    for key, zero in (("num_threads", "torch's default"), ("stop_after", "never")):
        if getattr(cfg.train, key) < 0:
            raise ConfigError(f"train.{key} must be >= 0 (0 = {zero}), got "
                              f"{getattr(cfg.train, key)}")
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


def validate_student_source(cfg: RunConfig, path_kind: str = "any") -> None:
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
    if not (0 < loss.temperature < math.inf and 0 <= loss.weight < math.inf):    # NaN too
        raise ConfigError(f"{key}.loss: temperature must be > 0 and weight >= 0 (got "
                          f"temperature={loss.temperature}, weight={loss.weight})")
