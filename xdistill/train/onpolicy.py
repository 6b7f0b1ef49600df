"""``xdistill train onpolicy``: the student samples responses to prompts, teachers score them.

Per optimizer step ``s`` (see :mod:`xdistill.train.onpolicy_step` for the loss and timing):

1. the next ``prompts.batch_size`` prompts of this rank (``StatefulDataLoader`` over a sharded,
   resumable :class:`xdistill.rollout.PromptDataset`);
2. ``engine.generate(prompts, sampling_for_step(cfg.rollout, s, rank))``: the sampling seed derives
   from ``(rollout.seed, s, rank)``, so a resumed run regenerates exactly the same samples;
3. :class:`xdistill.rollout.RolloutScorer` re-renders/re-tokenizes/aligns the responses for every
   teacher (identity view for teachers sharing the student's tokenizer; tool spans masked);
4. ``TeacherPool.forward`` -> per-teacher on-policy losses, static weights, normalised by the
   global unit count -> backward -> clip -> AdamW -> scheduler (``offpolicy.optimizer_step``);
5. ``engine.sync_weights(model)`` every ``rollout.sync_every`` steps (a no-op in-process);
6. metrics (clamp counters, mean log-ratio, tool-token ratio, time split), checkpoints holding the
   prompt loader state (``checkpoint.every``), the debugging stop.

With ``loss.offpolicy_lambda > 0`` a fraction of the steps instead trains on one off-policy batch
per rank from ``offpolicy.data`` through the off-policy path (:func:`xdistill.train.step.micro_step`
with a :class:`MultiTeacherLoss`; see :func:`xdistill.train.onpolicy_step.build_mix`).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from xdistill import distributed as xdist
from xdistill.data.loader import WatchedIterator
from xdistill.log import init_logging
from xdistill.metrics import MetricsWriter
from xdistill.train import setup
from xdistill.train.offpolicy import (build_student_stack, export_final, log_metrics, maybe_resume,
                                      maybe_stop, open_metrics, optimizer_step, save_run,
                                      set_num_threads)
from xdistill.train.onpolicy_config import OnPolicyConfig, validate_onpolicy
from xdistill.train.onpolicy_step import (OnPolicyPlan, build_mix, build_onpolicy_plan,
                                          finish_metrics, loss_and_backward, offpolicy_micro)
from xdistill.train.step import Timers

# metric keys summed over ranks (the rest are averaged)
_SUMMED = ("loss", "ce", "response_tokens", "tokens")


@dataclass
class OnPolicyRun:
    """The live components of an on-policy run (built by :func:`build_onpolicy_run`)."""

    cfg: OnPolicyConfig
    env: object
    plan: OnPolicyPlan
    device: torch.device
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    pool: object
    engine: object
    scorer: object
    # [prompt loader, *off-policy loaders]: their states go into every checkpoint
    loaders: list
    # the off-policy mix (None when loss.offpolicy_lambda = 0)
    mix: object = None
    reward_fn: object = None
    start_step: int = 0
    writer: MetricsWriter | None = None
    tb: object = None
    iters: list = field(default_factory=list)


class _SyncedGenerate:
    """The student seen by ``HFGenerateEngine`` under FSDP2: ``generate`` runs with
    ``synced_gpus=True`` so every rank keeps stepping (and all-gathering) until all are done."""

    def __init__(self, model):
        self._model = model

    def generate(self, *args, **kw):
        return self._model.generate(*args, synced_gpus=True, **kw)

    def __getattr__(self, name):
        return getattr(self._model, name)


def prompt_loader(cfg: OnPolicyConfig, rank: int, world: int):
    """A ``StatefulDataLoader`` of ``(indices, prompts)`` batches of this rank's prompt shard."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from xdistill.rollout import PromptDataset, collate_prompts, open_prompts

    pc = cfg.prompts
    source = open_prompts(pc.paths, prompt_column=pc.prompt_column,
                          messages_column=pc.messages_column)
    ds = PromptDataset(source, seed=cfg.train.seed, shuffle=pc.shuffle, rank=rank,
                       world_size=world, epochs=pc.epochs)
    return StatefulDataLoader(ds, batch_size=pc.batch_size, collate_fn=collate_prompts,
                              num_workers=pc.num_workers)


def _build_engine(cfg: OnPolicyConfig, env, model, tok):
    from xdistill.rollout import build_engine

    gen_model = _SyncedGenerate(model) if env.distributed else model
    return build_engine(cfg.rollout, gen_model, tok)


def build_onpolicy_run(cfg: OnPolicyConfig, reward_fn=None) -> OnPolicyRun:
    """Validate (before any compute), then build tokenizers, student, engine, teachers, data."""
    from xdistill.data import TeacherSpec as ScoringTeacher
    from xdistill.rollout import RolloutScorer
    from xdistill.teacher import TeacherPool

    env = xdist.init_distributed()
    validate_onpolicy(cfg)
    set_num_threads(cfg)
    plan = build_onpolicy_plan(cfg)
    mix = None
    if cfg.loss.offpolicy_lambda > 0:
        mix = build_mix(cfg, plan, env)
    device, model, optimizer, scheduler = build_student_stack(cfg, env, plan)
    add_bos = cfg.rollout.add_bos
    scorer = RolloutScorer(
        plan.student_tok,
        [ScoringTeacher(t.name, plan.teacher_toks[t.name], t.max_len,
                        add_bos=add_bos and plan.teacher_toks[t.name].bos_id is not None)
         for t in cfg.teachers],
        student_add_bos=add_bos, chunks=cfg.scoring.chunks, method=cfg.scoring.method)
    pool = TeacherPool([t.worker for t in cfg.teachers])
    loaders = [prompt_loader(cfg, env.rank, env.world_size)] + (mix.loaders if mix else [])
    return OnPolicyRun(cfg, env, plan, device, model, optimizer, scheduler, pool,
                       _build_engine(cfg, env, model, plan.student_tok), scorer, loaders, mix,
                       reward_fn)


def is_offpolicy_step(cfg: OnPolicyConfig, step: int) -> bool:
    """Whether optimizer step ``step`` (1-based) trains on an off-policy batch (same on all ranks
    and on resume: a function of the config and the step only)."""
    lam = cfg.loss.offpolicy_lambda
    if lam <= 0:
        return False
    if cfg.loss.offpolicy_mode == "ratio":
        return int(np.floor(step * lam + 1e-9)) > int(np.floor((step - 1) * lam + 1e-9))
    return bool(np.random.default_rng([cfg.train.seed, step, 7]).random() < lam)


def rollout_batch(run: OnPolicyRun, step: int, timers: Timers):
    """Prompts -> rollouts -> scored batch for step ``step``; returns (indices, rollouts, scored)."""
    from xdistill.rollout import sampling_for_step

    with timers("data"):
        indices, prompts = next(run.iters[0])
    with timers("generation"):
        ro = run.engine.generate(prompts, sampling_for_step(run.cfg.rollout, step, run.env.rank))
    if run.reward_fn is not None:
        ro = ro.with_rewards(run.reward_fn(ro))
    with timers("score"):
        scored = run.scorer(ro)
    return indices, ro, scored


def rollout_metrics(ro, scored) -> dict:
    st = scored.stats
    out = {"response_tokens": st.response_tokens, "tool_token_ratio": st.tool_token_ratio,
           "response_len": float(ro.response_len_B.float().mean()),
           "stop_fraction": float(np.mean([r == "stop" for r in ro.finish_reasons]))}
    for name in st.coverage:
        out[f"{name}/coverage"] = st.coverage[name]
        out[f"{name}/tool_ratio"] = st.teacher_tool_ratio[name]
    return out


def onpolicy_train_step(run: OnPolicyRun, step: int) -> dict:
    """One optimizer step (module doc); returns this step's metrics (reduced over ranks)."""
    timers = Timers(sync=torch.cuda.synchronize if run.device.type == "cuda" else None)
    t0 = time.perf_counter()
    if run.mix is not None and is_offpolicy_step(run.cfg, step):
        local, sample = offpolicy_micro(run, timers), None
        local["offpolicy"] = 1.0
    else:
        indices, ro, scored = rollout_batch(run, step, timers)
        local = {**loss_and_backward(run, scored, timers), **rollout_metrics(ro, scored),
                 "offpolicy": 0.0}
        sample = (indices, ro)
    with timers("optim"):
        lr, norm = optimizer_step(run)
    if step % run.cfg.rollout.sync_every == 0:
        run.engine.sync_weights(run.model)
    if run.cfg.train.log_samples and sample is not None:
        _log_samples(run, step, *sample)
    metrics = finish_metrics(reduce_onpolicy_metrics(local), run.plan)
    elapsed = time.perf_counter() - t0
    metrics.update({"lr": lr, "grad_norm": norm, "step_s": elapsed})
    if "response_tokens" in metrics:
        metrics["tok_per_s"] = metrics["response_tokens"] / elapsed
    metrics.update({f"time/{k}": v for k, v in timers.seconds.items()})
    return metrics


def reduce_onpolicy_metrics(local: dict) -> dict:
    """Losses, clamp counters, log-ratio sums and token counts are summed over ranks; unit
    counts are already global; ratios, coverage and times are averaged."""
    keys = sorted(local)
    summed = xdist.all_reduce_sum(torch.tensor([float(local[k]) for k in keys],
                                               dtype=torch.float64))
    world = xdist.get_world_size()
    out = {}
    for k, v in zip(keys, summed.tolist()):
        add = k in _SUMMED or k.endswith("/loss") or "/clamp/" in k or k.endswith("_sum")
        out[k] = v if add else v / world
    return out


def _log_samples(run: OnPolicyRun, step: int, indices, ro) -> None:
    path = setup.out_path(run.cfg, f"samples_rank{xdist.get_rank()}.jsonl")
    hashes = [hashlib.sha1(ro.response_ids_BTr[b, :int(n)].numpy().tobytes()).hexdigest()[:16]
              for b, n in enumerate(ro.response_len_B)]
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"step": step, "prompts": [int(i) for i in indices],
                            "responses": hashes}) + "\n")


def save(run: OnPolicyRun, step: int) -> None:
    save_run(run, step, {"prompts_batch_size": run.cfg.prompts.batch_size})


def after_step(run: OnPolicyRun, step: int) -> None:
    """Checkpoint and the debugging stop, when due after optimizer step ``step``."""
    cfg = run.cfg
    if (cfg.checkpoint.every > 0 and step % cfg.checkpoint.every == 0) or step == cfg.train.steps:
        save(run, step)
    maybe_stop(run, step)


def console_keys(cfg: OnPolicyConfig) -> list[str]:
    keys = ["loss"]
    for t in cfg.teachers:
        keys += [f"{t.name}/loss", f"{t.name}/coverage"]
    keys += ["tool_token_ratio", "response_len", "lr", "grad_norm", "tok_per_s"]
    return keys + [f"time/{k}" for k in ("generation", "score", "teacher", "student", "loss",
                                         "optim")]


def train_loop(run: OnPolicyRun) -> dict:
    """Steps ``start_step+1 .. train.steps``; returns the last step's metrics."""
    run.iters = [WatchedIterator(ld, "prompt" if i == 0 else "data")
                 for i, ld in enumerate(run.loaders)]
    metrics: dict = {}
    for step in range(run.start_step + 1, run.cfg.train.steps + 1):
        metrics = onpolicy_train_step(run, step)
        log_metrics(run, step, metrics)
        after_step(run, step)
    return metrics


def run_onpolicy(cfg: OnPolicyConfig, reward_fn=None) -> dict:
    """Build, resume, train, export; returns the final metrics (rank 0's view).

    ``reward_fn(rollouts) -> float[B]`` (optional) attaches task rewards to every rollout batch;
    with ``loss.reward_beta > 0`` they weight the samples.
    """
    init_logging()
    run = build_onpolicy_run(cfg, reward_fn)
    maybe_resume(run)
    run.writer = open_metrics(cfg, console_keys(cfg))
    try:
        run.pool.start()
        metrics = train_loop(run)
    finally:
        run.pool.close()
        run.writer.close()
    export_final(run)
    return metrics
