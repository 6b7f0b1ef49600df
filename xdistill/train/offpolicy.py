"""``xdistill train offpolicy``: distil one or more teachers into a student over a fixed corpus.

The loop, checkpoints, evaluation cadence and export are the shared core
(:mod:`xdistill.train.core`); this mode supplies the step's micro-batches and their loss:

1. each data shard this process owns yields ``accum`` micro-batches per step (``DistillBatch``,
   already aligned to every teacher by the collator in the loader workers), through a
   :class:`xdistill.train.pipeline.MicroBatchStream` that submits the next micro-batches to
   remote teachers while the student computes (``train.pipeline_teachers``);
2. their loss units are counted (the core sums them over ranks: ``num_valid``);
3. per micro-batch (:func:`xdistill.train.forward.teachers_and_student`): in-process teachers
   -> student forward (remote teachers compute meanwhile) -> remote outputs collected ->
   ``MultiTeacherLoss`` -> backward (gradient sync only on the last micro-batch).

Checkpoints (``checkpoint.every``) hold model, optimizer, scheduler, every loader's state (as of
the step boundary, whatever was prefetched), RNG and the step; ``checkpoint.resume: auto``
continues from the latest complete one, so a killed run resumes without losing or repeating a
window. At the end the student is exported in Hugging Face format to ``<out_dir>/export``.
"""

from __future__ import annotations

import json
from dataclasses import replace

from xdistill import distributed as xdist
from xdistill.align.api import kernels_cached
from xdistill.data.loader import WatchedIterator, describe_loader
from xdistill.errors import ConfigError
from xdistill.log import get_logger
from xdistill.train import core, setup
from xdistill.train.config import (OffPolicyConfig, data_ranks, grad_accum_steps,
                                   validate_offpolicy)
from xdistill.train.evaluate import evaluate
from xdistill.train.metrics import (CE, GRAD_NORM_KEY, LR_KEY, TOK_PER_S_KEY, TOKENS, TOTAL,
                                    teacher_coverage, teacher_loss, teacher_weight, time_key)
from xdistill.train.mode import Run, TrainMode
from xdistill.train.pipeline import MicroBatchStream
from xdistill.train.step import micro_step, record_report, sum_counts, window_hashes

log = get_logger("train")
STOP_EXIT_CODE = core.STOP_EXIT_CODE


class OffPolicyMode(TrainMode):
    """Batches from the corpus loaders; teachers score them; ``MultiTeacherLoss`` (module doc)."""

    kind = "offpolicy"

    def __init__(self):
        self.loaders, self.eval_loaders = [], []
        self.loss_fn = self.pool = self.stream = None
        self.shards, self._ce = 1, False

    def plan(self, cfg: OffPolicyConfig, env):
        validate_offpolicy(cfg, env.world_size)
        self.shards = data_ranks(cfg, env.world_size)
        return setup.build_plan(cfg)

    def sequence_length(self, cfg: OffPolicyConfig) -> tuple[int, str]:
        """A window: ``data.seq_len`` tokens, and the BOS when ``data.add_bos`` (resolved by
        :meth:`plan`)."""
        return cfg.data.seq_len + int(cfg.data.add_bos), "data.seq_len"

    def eval_every(self, cfg: OffPolicyConfig) -> int:
        """``eval.every`` (the held-out evaluation runs only when ``eval.paths`` is set)."""
        return cfg.eval.every

    def build(self, run: Run) -> None:
        cfg, env = run.cfg, run.env
        run.accum = grad_accum_steps(cfg, env.world_size)
        self.loaders = setup.build_loaders(cfg.data, run.plan, env.rank, env.world_size,
                                           self.shards)
        self.loss_fn = setup.build_loss(cfg, run.plan)
        self.pool = setup.build_pool(cfg, run.plan)
        if cfg.eval.paths and cfg.eval.every >= 0:
            data = replace(cfg.data, num_workers=0, epochs=None)
            self.eval_loaders = setup.build_loaders(data, run.plan, env.rank, env.world_size,
                                                    self.shards, paths=cfg.eval.paths)

    def start(self, run: Run) -> None:
        if self.pool is not None:
            self.pool.start()
            self.pool.check_tokenizers(run.plan.tokenizers(), run.plan.tokenizer_keys())
        lookahead = 0
        if self.pool is not None and run.cfg.train.pipeline_teachers and self.pool.has_remote:
            lookahead = max(0, self.pool.remote_slots - 1)
        _log_data_start(self.loaders)
        iters = [WatchedIterator(ld) for ld in self.loaders]
        self.stream = MicroBatchStream(iters, self.loaders, run.accum, self.pool, lookahead,
                                       last_step=run.cfg.train.steps,
                                       data="the training data (data.paths)",
                                       epochs_key="data.epochs")
        self.stream.start(run.start_step + 1)

    def micro_batches(self, run: Run, step: int, timers) -> list:
        self._ce = run.cfg.loss.ce_weight > 0
        with timers("data"):
            return self.stream.peek_step(step)

    def units(self, micros: list) -> dict[str, int]:
        return sum_counts(self.loss_fn, [m.batch for m in micros], self._ce)

    def micro_step(self, run, micro, num_valid, timers, metrics) -> None:
        """``micro``: a :class:`PendingMicro` of :meth:`micro_batches`; the stream submits it (and
        the next ones) to the remote teachers as it is consumed."""
        with timers("data"):
            self.stream.consume(micro)
        batch = micro.batch
        report = micro_step(run.model, self.loss_fn, self.pool, batch, num_valid, timers,
                            device=run.device, ce_weight=run.cfg.loss.ce_weight,
                            remote=micro.remote, label_smoothing=run.cfg.loss.label_smoothing)
        record_report(metrics, report)
        metrics.add(TOKENS, batch.stats.student_tokens)
        metrics.add("forward_tokens", batch.stats.student_tokens)

    def evaluate(self, run, step: int):
        if not self.eval_loaders:
            return None

        return evaluate(run.model, self.loss_fn, self.pool, self.eval_loaders, run.plan, run.cfg,
                        run.device)

    def loader_states(self, step: int) -> list:
        return self.stream.state_after(step)

    def log_samples(self, run, step: int, micros: list) -> None:
        path = core.out_path(run.cfg, f"samples_rank{xdist.get_rank()}.jsonl")
        hashes = [h for m in micros for h in window_hashes(m.batch)]
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, "hashes": hashes}) + "\n")

    def console_keys(self, cfg) -> list[str]:
        keys = [TOTAL.key]
        for t in cfg.teachers:
            keys += [m(t.name).key for m in (teacher_loss, teacher_weight, teacher_coverage)]
        keys += [CE.key, LR_KEY, GRAD_NORM_KEY, TOK_PER_S_KEY]
        return keys + [time_key(k) for k in ("data", "teacher", "transport", "student", "loss",
                                             "optim")]

    def checkpoint_extra(self, cfg) -> dict:
        return {"data_ranks": self.shards, "data_seq_len": cfg.data.seq_len,
                "data_documents": self._documents()}

    def _documents(self) -> int | None:
        source = getattr(self.loaders[0].dataset, "source", None) if self.loaders else None
        return len(source) if source is not None else None

    def check_resume(self, cfg, path, extra: dict) -> None:
        """Other data (another document count) is refused before any loader worker starts; another
        ``data.seq_len`` is allowed (the loader state is a document and token position, so the
        data continues at the next unread token in windows of the new length) and logged."""
        # deferred: torch.distributed.checkpoint via train.checkpoint (~1 s import)
        from xdistill.train.checkpoint import CheckpointError

        had, has = extra.get("data_documents"), self._documents()
        if had is not None and has is not None and had != has:
            raise CheckpointError(
                f"{path} was written while training on {had} documents, data.paths {cfg.data.paths} "
                f"now hold {has}: its data position means nothing in other data; resume with the "
                "same data.paths, or start afresh (--resume none, or another train.out_dir)")
        seq_len = extra.get("data_seq_len")
        if seq_len is not None and seq_len != cfg.data.seq_len and xdist.is_main_process():
            log.warning("resuming %s (data.seq_len %d) with data.seq_len %d: the data continues at "
                        "the next unread token, in windows of the new length", path.name, seq_len,
                        cfg.data.seq_len)

    def close(self) -> None:
        try:
            if self.stream is not None:
                self.stream.drain()
        finally:
            if self.pool is not None:
                self.pool.close()


def _log_data_start(loaders) -> None:
    """What the loaders read, and whether the first batch must compile the aligner (rank 0)."""
    if not loaders or not xdist.is_main_process():
        return

    log.info("data: %s%s", describe_loader(loaders[0]),
             f" (x {len(loaders)} data shards)" if len(loaders) > 1 else "")
    if not kernels_cached():
        log.info("the token aligner is not compiled yet (first run after an install or an edit of "
                 "xdistill/align): the first batch compiles it with numba, ~30 s on 2 CPU cores; "
                 "later runs load it from numba's cache")


def run_offpolicy(cfg: OffPolicyConfig) -> dict:
    """Train ``cfg`` (an :class:`OffPolicyConfig`, e.g. from :func:`xdistill.load_config`):
    build, resume from ``train.out_dir`` (``checkpoint.resume``), train, export. Returns the
    final step's metrics (rank 0's view): ``loss``, ``<teacher>/loss``, ``ce``, ``lr``, ...,
    and the ``eval/...`` figures of the last step's evaluation when ``eval.paths`` is set."""
    return core.train(cfg, OffPolicyMode())


def evaluate_offpolicy(cfg: OffPolicyConfig) -> dict:
    """The run's held-out evaluation (``eval.paths``) at step 0, without training or writing
    anything: the student's ``eval/loss`` and ``eval/bpb``, each teacher's loss term and
    coverage -- what training starts from (``xdistill eval --config``)."""
    if not cfg.eval.paths:
        raise ConfigError("eval.paths is empty: nothing to evaluate on")
    cfg.eval.every = 0 if cfg.eval.every < 0 else cfg.eval.every
    cfg.checkpoint.resume = cfg.checkpoint.resume or ""
    run = core.build(cfg, OffPolicyMode())
    try:
        if run.mode.pool is not None:
            run.mode.pool.start()
        return run.mode.evaluate(run, 0)
    finally:
        run.mode.close()
