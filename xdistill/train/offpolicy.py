"""``xdistill train offpolicy``: distil one or more teachers into a student over a fixed corpus.

Per optimizer step (see :mod:`xdistill.train.step` for the normalisation and the timing split):

1. each data shard this process owns yields ``grad_accum_steps`` micro-batches (``DistillBatch``,
   already aligned to every teacher by the collator in the loader workers);
2. the loss units of all micro-batches are counted and summed over ranks (``num_valid``);
3. per micro-batch: teachers (``TeacherPool.forward``, each per its placement) -> student forward
   -> ``MultiTeacherLoss`` -> backward (gradient sync only on the last micro-batch);
4. clip -> AdamW -> scheduler; metrics (rank 0) -> checkpoint / evaluation when due.

Checkpoints (``checkpoint.every``) hold model, optimizer, scheduler, every loader's state, RNG and
the step; ``checkpoint.resume: auto`` continues from the latest complete one, so a killed run
resumes without losing or repeating a window. At the end the student is exported in Hugging Face
format to ``<out_dir>/export``.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from xdistill import distributed as xdist
from xdistill.data.loader import WatchedIterator
from xdistill.log import get_logger, init_logging
from xdistill.metrics import MetricsWriter
from xdistill.train import setup
from xdistill.train.config import OffPolicyConfig, data_ranks, grad_accum_steps, validate_offpolicy
from xdistill.train.step import Timers, global_counts, micro_step, sum_metrics, window_hashes

log = get_logger("train")
STOP_EXIT_CODE = 3


@dataclass
class Run:
    """The live components of a run (built by :func:`build_run`)."""

    cfg: OffPolicyConfig
    env: object
    plan: setup.Plan
    device: torch.device
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    loss_fn: object
    pool: object
    loaders: list
    accum: int
    eval_loaders: list = field(default_factory=list)
    start_step: int = 0
    writer: MetricsWriter | None = None
    tb: object = None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def set_num_threads(cfg) -> None:
    """``train.num_threads`` caps torch's intra-op threads and the aligner's numba threads."""
    if cfg.train.num_threads:
        from xdistill.align import set_align_threads

        torch.set_num_threads(cfg.train.num_threads)
        set_align_threads(cfg.train.num_threads)


def build_student_stack(cfg, env, plan) -> tuple:
    """Seed, then (device, student, AdamW, LR scheduler); a fresh student (no ``student.path``)
    gets ``vocab_size`` from the student tokenizer unless its model_config sets one."""
    from xdistill.train.optim import build_optimizer, build_scheduler

    if not cfg.student.path and "vocab_size" not in cfg.student.model_config:
        cfg.student.model_config["vocab_size"] = plan.student_tok.vocab_size
    seed_everything(cfg.train.seed)
    device = setup.resolve_device(cfg.train.device, env)
    model = setup.build_student(cfg, env, device)
    setup.check_vocab(model, plan)
    optimizer = build_optimizer(model, cfg.optim)
    return device, model, optimizer, build_scheduler(optimizer, cfg.scheduler)


def build_run(cfg: OffPolicyConfig) -> Run:
    """Validate (before any compute), then build tokenizers, student, optimizer, loss, data."""
    env = xdist.init_distributed()
    validate_offpolicy(cfg, env.world_size)
    shards, accum = data_ranks(cfg, env.world_size), grad_accum_steps(cfg, env.world_size)
    set_num_threads(cfg)
    plan = setup.build_plan(cfg)
    device, model, optimizer, scheduler = build_student_stack(cfg, env, plan)
    loaders = setup.build_loaders(cfg, plan, env.rank, env.world_size, shards)
    run = Run(cfg, env, plan, device, model, optimizer, scheduler, setup.build_loss(cfg, plan),
              setup.build_pool(cfg, plan), loaders, accum)
    if cfg.eval.paths and cfg.eval.every >= 0:
        from dataclasses import replace

        data = replace(cfg.data, num_workers=0, epochs=None)
        run.eval_loaders = setup.build_loaders(cfg, plan, env.rank, env.world_size, shards,
                                               data=data, paths=cfg.eval.paths)
    return run


def maybe_resume(run: Run) -> None:
    """Load the checkpoint ``checkpoint.resume`` names (``auto``: the latest complete one)."""
    from xdistill.train.checkpoint import load_checkpoint, resolve_resume

    path = resolve_resume(run.cfg.checkpoint.resume, setup.out_path(run.cfg, "checkpoints"))
    if path is None:
        return
    state = load_checkpoint(path, run.model, run.optimizer, run.scheduler)
    loader_states = state.dataloader_state or []
    if len(loader_states) != len(run.loaders):
        from xdistill.train.checkpoint import CheckpointError

        raise CheckpointError(f"{path}: holds {len(loader_states)} loader state(s) per rank, this "
                              f"run has {len(run.loaders)} (keep train.data_ranks unchanged)")
    for loader, st in zip(run.loaders, loader_states):
        loader.load_state_dict(st)
    run.start_step = state.step
    if xdist.is_main_process():
        log.info("resumed from %s at step %d", path, state.step)


def save_run(run, step: int, extra: dict) -> None:
    """Checkpoint model, optimizer, scheduler and every loader's state (+ ``extra``) at ``step``."""
    from xdistill.train.checkpoint import save_checkpoint

    save_checkpoint(setup.out_path(run.cfg, "checkpoints"), step, run.model, run.optimizer,
                    run.scheduler, dataloader_state=[ld.state_dict() for ld in run.loaders],
                    extra=extra, keep_last=run.cfg.checkpoint.keep_last)


def save(run: Run, step: int) -> None:
    save_run(run, step, {"global_batch_size": run.cfg.train.global_batch_size})


def optimizer_step(run: Run) -> tuple[float, float]:
    """Clip, AdamW step, scheduler step; returns (lr used by this step, grad norm)."""
    from xdistill.train.optim import clip_grad_norm

    lr = float(run.optimizer.param_groups[0]["lr"])
    norm = clip_grad_norm(run.model, run.cfg.optim.grad_clip)
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return lr, norm


def _set_sync(model, on: bool) -> None:
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(on)


def train_step(run: Run, iters: list, step: int) -> dict:
    """One optimizer step (module doc); returns this step's metrics (reduced over ranks)."""
    timers = Timers(sync=_device_sync(run.device))
    t0 = time.perf_counter()
    with timers("data"):
        batches = [next(it) for it in iters for _ in range(run.accum)]
    ce = run.cfg.loss.ce_weight > 0
    num_valid = global_counts(run.loss_fn, batches, ce)
    parts = []
    for i, batch in enumerate(batches):
        _set_sync(run.model, i == len(batches) - 1)
        parts.append(micro_step(run.model, run.loss_fn, run.pool, batch, num_valid, timers,
                                device=run.device, ce_weight=run.cfg.loss.ce_weight))
    with timers("optim"):
        lr, norm = optimizer_step(run)
    if run.cfg.train.log_samples:
        _log_samples(run, step, batches)
    metrics = reduce_metrics(sum_metrics(parts))
    tokens = xdist.all_reduce_sum(sum(b.stats.student_tokens for b in batches))
    elapsed = time.perf_counter() - t0
    metrics.update({"lr": lr, "grad_norm": norm, "tokens": tokens, "tok_per_s": tokens / elapsed,
                    "step_s": elapsed})
    metrics.update({f"time/{k}": v for k, v in timers.seconds.items()})
    for name, n in num_valid.items():
        metrics[f"units/{name}"] = n
    return metrics


def reduce_metrics(local: dict) -> dict:
    """Loss terms are summed over ranks (each rank holds its share of the global mean);
    weights, coverage and scores are averaged."""
    keys = sorted(local)
    summed = xdist.all_reduce_sum(torch.tensor([local[k] for k in keys], dtype=torch.float64))
    world = xdist.get_world_size()
    return {k: (v if k in ("loss", "ce") or k.endswith("/loss") else v / world)
            for k, v in zip(keys, summed.tolist())}


def _device_sync(device: torch.device):
    if device.type == "cuda":
        return torch.cuda.synchronize
    return None


def _log_samples(run: Run, step: int, batches) -> None:
    path = setup.out_path(run.cfg, f"samples_rank{xdist.get_rank()}.jsonl")
    hashes = [h for b in batches for h in window_hashes(b)]
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"step": step, "hashes": hashes}) + "\n")


def console_keys(cfg: OffPolicyConfig) -> list[str]:
    keys = ["loss"]
    for t in cfg.teachers:
        keys += [f"{t.name}/loss", f"{t.name}/weight", f"{t.name}/coverage"]
    keys += ["ce", "lr", "grad_norm", "tok_per_s"]
    keys += [f"time/{k}" for k in ("data", "teacher", "transport", "student", "loss", "optim")]
    return keys


def _open_tensorboard(cfg: OffPolicyConfig):
    if not cfg.train.tensorboard or not xdist.is_main_process():
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:  # tensorboard not installed: skip silently
        return None
    return SummaryWriter(str(setup.out_path(cfg, "tb")))


def log_metrics(run: Run, step: int, metrics: dict) -> None:
    if run.writer is not None and (step % run.cfg.train.log_every == 0 or "eval/loss" in metrics):
        run.writer.write(step, metrics)
    if run.tb is not None:
        for k, v in metrics.items():
            if isinstance(v, (int, float)):
                run.tb.add_scalar(k, v, step)


def after_step(run: Run, step: int) -> None:
    """Evaluation, checkpoint and the debugging stop, when due after optimizer step ``step``."""
    cfg = run.cfg
    last = step == cfg.train.steps
    every = cfg.eval.every
    if run.eval_loaders and ((every > 0 and step % every == 0) or (last and every >= 0)):
        from xdistill.train.evaluate import evaluate

        log_metrics(run, step, evaluate(run.model, run.loss_fn, run.pool, run.eval_loaders,
                                        run.plan, cfg, run.device))
    if (cfg.checkpoint.every > 0 and step % cfg.checkpoint.every == 0) or last:
        save(run, step)
    maybe_stop(run, step)


def maybe_stop(run, step: int) -> None:
    """The debugging stop: after step ``train.stop_after`` (checkpointed), exit hard with code 3."""
    if run.cfg.train.stop_after and step == run.cfg.train.stop_after:
        if run.writer is not None:
            run.writer.close()
        log.warning("train.stop_after=%d: exiting hard with code %d", step, STOP_EXIT_CODE)
        os._exit(STOP_EXIT_CODE)


def train_loop(run: Run) -> dict:
    """Steps ``start_step+1 .. train.steps``; returns the last step's metrics."""
    iters = [WatchedIterator(loader) for loader in run.loaders]
    metrics: dict = {}
    for step in range(run.start_step + 1, run.cfg.train.steps + 1):
        metrics = train_step(run, iters, step)
        log_metrics(run, step, metrics)
        after_step(run, step)
    return metrics


def run_offpolicy(cfg: OffPolicyConfig) -> dict:
    """Build, resume, train, export; returns the final metrics (rank 0's view)."""
    init_logging()
    run = build_run(cfg)
    maybe_resume(run)
    run.writer = open_metrics(cfg, console_keys(cfg))
    run.tb = _open_tensorboard(cfg)
    try:
        if run.pool is not None:
            run.pool.start()
        metrics = train_loop(run)
    finally:
        if run.pool is not None:
            run.pool.close()
        run.writer.close()
        if run.tb is not None:
            run.tb.close()
    export_final(run)
    return metrics


def open_metrics(cfg, keys: list[str]) -> MetricsWriter:
    """``<out_dir>/metrics.jsonl`` (written by rank 0 only, which also creates ``out_dir``)."""
    out = setup.out_path(cfg)
    main = xdist.is_main_process()
    if main:
        out.mkdir(parents=True, exist_ok=True)
    return MetricsWriter(out / "metrics.jsonl", enabled=main, console_keys=keys)


def export_final(run) -> None:
    """The Hugging Face export of the student to ``<out_dir>/export`` (``checkpoint.export_hf``)."""
    if run.cfg.checkpoint.export_hf:
        from xdistill.student.model import export_hf

        export_hf(run.model, setup.out_path(run.cfg, "export"), run.plan.student_tok,
                  overwrite=True)
