"""``xdistill train onpolicy``: the student samples responses to prompts, teachers score them.

The loop, checkpoints and export are the shared core (:mod:`xdistill.train.core`); this mode
supplies the step's micro-batches and their loss. Per optimizer step ``s``, for each of the step's
micro-batches ``m`` (``train.global_batch_size / (prompts.batch_size x world)`` of them):

1. the next ``prompts.batch_size`` prompts of this rank (``StatefulDataLoader`` over a sharded,
   resumable :class:`xdistill.rollout.PromptDataset`);
2. ``engine.generate(prompts, sampling_for_step(cfg.rollout, s, rank, m))``: the sampling seed
   derives from ``(rollout.seed, s, rank[, m])``, so a resumed run regenerates exactly the same
   samples;
3. :class:`xdistill.rollout.RolloutScorer` renders every teacher's own view of the conversation
   with the response inside and aligns it (identity view for teachers sharing the student's
   tokenizer; tool spans masked);
4. remote teachers start scoring, the student runs its forward meanwhile, then per-teacher
   on-policy losses with static weights, normalised by the global unit count -> backward.

After the optimizer step, ``engine.sync_weights(model)`` every ``rollout.sync_every`` steps and
at every periodic checkpoint (``checkpoint.every``), and once at the start after any resume (a
no-op in-process; vLLM: :mod:`xdistill.rollout.vllm_engine`): a run resumed from a periodic
checkpoint samples from the weights the uninterrupted run's engine held.
Metrics: clamp counters, mean log-ratio, coverage, tool-token ratio, the time
split. With ``loss.offpolicy_lambda > 0`` a fraction of the steps instead trains on off-policy
batches from ``offpolicy.data`` (:func:`xdistill.train.onpolicy_step.build_mix`).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import torch

from xdistill import distributed as xdist
from xdistill.data.loader import WatchedIterator, stateful_loader
from xdistill.errors import ConfigError
from xdistill.log import get_logger
from xdistill.rollout import (PromptDataset, RolloutScorer, build_engine, collate_prompts,
                              open_prompts, sampling_for_step)
from xdistill.student.build import check_positions
from xdistill.student.model import load_student
from xdistill.teacher import TeacherPool
from xdistill.train import core
from xdistill.train.config import grad_accum_steps
from xdistill.train.core import DataExhausted, seed_everything
from xdistill.train.metrics import (GRAD_NORM_KEY, LR_KEY, TOK_PER_S_KEY, TOKENS, TOTAL, Metric,
                                    teacher_coverage, teacher_loss, time_key)
from xdistill.train.mode import Run, TrainMode
from xdistill.train.onpolicy_config import OnPolicyConfig, validate_onpolicy
from xdistill.train.onpolicy_step import (build_mix, build_onpolicy_plan, local_units,
                                          offpolicy_micro, scored_step, step_reward_norm)
from xdistill.train.step import sum_counts

# rollout figures of the step that the console shows
TOOL_TOKEN_RATIO, RESPONSE_LEN = Metric("tool_token_ratio"), Metric("response_len")
UNALIGNED_FRAC = Metric("onpolicy/unaligned_frac")
log = get_logger("train")

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
    pc = cfg.prompts
    source = open_prompts(pc.paths, prompt_column=pc.prompt_column,
                          messages_column=pc.messages_column, route_column=pc.route_column)
    if pc.route_column:
        check_routes(source, [t.name for t in cfg.teachers])
    ds = PromptDataset(source, seed=cfg.train.seed, shuffle=pc.shuffle, rank=rank,
                       world_size=world, epochs=pc.epochs)
    return stateful_loader(ds, batch_size=pc.batch_size, collate_fn=collate_prompts,
                           num_workers=pc.num_workers)


def check_routes(source, names: list[str]) -> None:
    """Every routed prompt names a teacher of the run (the error names the first that does not)."""
    for where, route in zip(source.where, source.routes):
        if route not in names:
            raise ConfigError(f"{where}: routed to teacher {route!r}, but the teachers are "
                              f"{names} (prompts.route_column)")


def route_rows(source, indices, names: list[str]) -> dict | None:
    """Teacher name -> bool [B]: the samples routed to it (None when routing is off)."""
    routes = getattr(source, "routes", None)
    if not routes:
        return None
    picked = [routes[int(i)] for i in indices]
    return {n: torch.tensor([r == n for r in picked]) for n in names}


def is_offpolicy_step(cfg: OnPolicyConfig, step: int) -> bool:
    """Whether optimizer step ``step`` (1-based) trains on off-policy batches (same on all ranks
    and on resume: a function of the config and the step only)."""
    lam = cfg.loss.offpolicy_lambda
    if lam <= 0:
        return False
    if cfg.loss.offpolicy_mode == "ratio":
        return int(np.floor(step * lam + 1e-9)) > int(np.floor((step - 1) * lam + 1e-9))
    return bool(np.random.default_rng([cfg.train.seed, step, 7]).random() < lam)


class OnPolicyMode(TrainMode):
    """Rollouts of the student, scored by teachers of any tokenizer (module doc)."""

    kind = "onpolicy"

    def __init__(self, reward_fn=None):
        self.reward_fn = reward_fn
        self.loaders, self.iters = [], []
        self.pool = self.engine = self.scorer = self.mix = None
        self._plan = None
        # (step, every loader's state when that step started pulling its micro-batches)
        self._boundary: tuple[int, list] | None = None
        self._reward_norm = None   # the step's reward normaliser (prepare_step)
        # the frozen initial student (simple_opd's reference KL), else None
        self.reference = None

    def plan(self, cfg: OnPolicyConfig, env):
        validate_onpolicy(cfg)
        self._plan = build_onpolicy_plan(cfg)
        return self._plan

    def sequence_length(self, cfg: OnPolicyConfig) -> tuple[int, str]:
        """A prompt and its response, each at its longest."""
        return (cfg.rollout.max_prompt_len + cfg.rollout.max_new_tokens,
                "rollout.max_prompt_len + rollout.max_new_tokens")

    def eval_every(self, cfg: OnPolicyConfig) -> int:
        """Never: an on-policy run has no held-out evaluation."""
        return -1

    def build(self, run: Run) -> None:
        cfg, env, plan = run.cfg, run.env, run.plan
        run.accum = grad_accum_steps(cfg, env.world_size, cfg.prompts.batch_size)
        if cfg.loss.offpolicy_lambda > 0:
            # the mixed-in windows, as the off-policy trainer checks data.seq_len
            data = cfg.offpolicy.data
            check_positions(getattr(run.model, "module", run.model),
                            data.seq_len + int(bool(data.add_bos)), "offpolicy.data.seq_len")
            self.mix = build_mix(cfg, plan, env)
        self.scorer = RolloutScorer(plan.student_tok, plan.tokenizations(),
                                    student_add_bos=cfg.rollout.add_bos, chunks=cfg.scoring.chunks,
                                    method=cfg.scoring.method)
        self.pool = TeacherPool([t.worker for t in cfg.teachers])
        self.loaders = [prompt_loader(cfg, env.rank, env.world_size)] + (
            self.mix.loaders if self.mix else [])
        if cfg.rollout.backend == "vllm" and env.world_size > 1:
            raise ConfigError(f"rollout.backend=vllm runs in one trainer process for now; this run "
                              f"has {env.world_size} (use rollout.backend=hf with torchrun)")
        gen_model = _SyncedGenerate(run.model) if env.distributed else run.model
        self.engine = build_engine(cfg.rollout, gen_model, plan.student_tok)
        if plan.needs_reference:
            self.reference = _frozen_initial_student(cfg, run.device)

    def start(self, run: Run) -> None:
        # an engine with its own copy of the weights (vLLM) starts from the student as resumed
        if run.start_step and not _sync_point(run.cfg, run.start_step) and xdist.is_main_process():
            log.warning("resuming at step %d, which is not a weight-sync step (rollout.sync_every "
                        "%d, checkpoint.every %d: a checkpoint written on a stop signal): an "
                        "engine with its own weights (vLLM) now samples from the step-%d student, "
                        "the uninterrupted run from an older one until its next sync",
                        run.start_step, run.cfg.rollout.sync_every, run.cfg.checkpoint.every,
                        run.start_step)
        self.engine.sync_weights(run.model)
        self.pool.start()
        self.pool.check_tokenizers(run.plan.tokenizers(), run.plan.tokenizer_keys())
        self.iters = [WatchedIterator(ld, "prompt" if i == 0 else "data")
                      for i, ld in enumerate(self.loaders)]

    # ------------------------------------------------------------------ micro-batches
    def micro_batches(self, run: Run, step: int, timers) -> list:
        """The step's micro-batches; :class:`DataExhausted` when finite prompts (or the mixed-in
        corpus) run out before the step is filled (the loader states of its start are kept for
        the checkpoint of the step before: :meth:`loader_states`)."""
        self._boundary = (step, [ld.state_dict() for ld in self.loaders])
        if self.mix is not None and is_offpolicy_step(run.cfg, step):
            try:
                with timers("data"):
                    return [("offpolicy", next(self.iters[1])) for _ in range(run.accum)]
            except StopIteration:
                raise DataExhausted(step, "the off-policy corpus (offpolicy.data.paths)",
                                    "offpolicy.data.epochs") from None
        prompts, ran_out = [], None
        with timers("data"):   # every prompt before any generation
            try:
                prompts = [next(self.iters[0]) for _ in range(run.accum)]
            except StopIteration:
                ran_out = DataExhausted(step, "the prompts (prompts.paths)", "prompts.epochs")
        # generation runs collectives (FSDP all-gathers): every rank agrees on the end first
        core.agree_on_data_end(step, ran_out)
        return [("rollout", rollout_batch(run, step, timers, m if run.accum > 1 else None, p))
                for m, p in enumerate(prompts)]

    def loader_states(self, step: int) -> list:
        """Every loader's state right after ``step``: the states recorded when step ``step + 1``
        started pulling (it ran out of data), else the loaders' current ones."""
        if self._boundary is not None and self._boundary[0] == step + 1:
            return self._boundary[1]
        return super().loader_states(step)

    def units(self, micros: list) -> dict[str, int]:
        if micros and micros[0][0] == "offpolicy":
            return sum_counts(self.mix.loss_fn, [b for _, b in micros], self.mix.ce_weight > 0)
        total: dict[str, int] = {}
        for _, (indices, _, scored) in micros:
            for k, n in local_units(self._plan, scored.batch, self.rows(indices),
                                    scored.stop_BTs).items():
                total[k] = total.get(k, 0) + n
        return total

    def rows(self, indices) -> dict | None:
        """Per teacher, the samples routed to it (``prompts.route_column``; None: all)."""
        return route_rows(self.loaders[0].dataset.source, indices, list(self._plan.specs))

    def prepare_step(self, run, micros: list) -> None:
        # reward weights are normalised over the whole step (every micro-batch and rank)
        self._reward_norm = step_reward_norm(
            [item[2] for kind, item in micros if kind == "rollout"], run.cfg.loss.reward_beta)

    def micro_step(self, run, micro, num_valid, timers, metrics) -> None:
        kind, item = micro
        metrics.mean("offpolicy", float(kind == "offpolicy"))
        if kind == "offpolicy":
            offpolicy_micro(run, item, num_valid, timers, metrics)
            return
        indices, ro, scored = item
        scored_step(run, scored, num_valid, timers, metrics, rows=self.rows(indices),
                    reward_norm=self._reward_norm)
        _rollout_metrics(metrics, ro, scored)

    def after_update(self, run, step: int) -> None:
        if _sync_point(run.cfg, step):
            self.engine.sync_weights(run.model)

    def log_samples(self, run, step: int, micros: list) -> None:
        rollouts = [item for kind, item in micros if kind == "rollout"]
        if not rollouts:
            return
        path = core.out_path(run.cfg, f"samples_rank{xdist.get_rank()}.jsonl")
        indices = [int(i) for idx, _, _ in rollouts for i in idx]
        hashes = [hashlib.sha1(ro.response_ids_BTr[b, :int(n)].numpy().tobytes()).hexdigest()[:16]
                  for _, ro, _ in rollouts for b, n in enumerate(ro.response_len_B)]
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, "prompts": indices, "responses": hashes}) + "\n")

    def console_keys(self, cfg) -> list[str]:
        keys = [TOTAL.key]
        for t in cfg.teachers:
            keys += [teacher_loss(t.name).key, teacher_coverage(t.name).key]
        keys += [m.key for m in (UNALIGNED_FRAC, TOOL_TOKEN_RATIO, RESPONSE_LEN)]
        keys += [LR_KEY, GRAD_NORM_KEY, TOK_PER_S_KEY]
        return keys + [time_key(k) for k in ("generation", "score", "teacher", "student", "loss",
                                             "optim")]

    def checkpoint_extra(self, cfg) -> dict:
        return {"prompts_batch_size": cfg.prompts.batch_size}

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        if self.pool is not None:
            self.pool.close()


def _frozen_initial_student(cfg, device):
    """A second, frozen copy of the student as it starts (before any resume): the reference
    ``q_init`` of simple_opd's KL term. Built from the same config and seed, so it equals the
    initial weights even on a resumed run."""
    state = torch.random.get_rng_state()
    seed_everything(cfg.train.seed)
    model = load_student(cfg.student).to(device).eval()
    torch.random.set_rng_state(state)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def rollout_batch(run: Run, step: int, timers, micro: int | None = None, batch=None):
    """Prompts -> rollouts -> scored batch of ``step`` (micro-batch ``micro``); returns
    (prompt indices, rollouts, scored batch). ``batch``: the prompt loader's ``(indices,
    prompts)``, else the next one is read."""
    mode = run.mode
    if batch is None:
        with timers("data"):
            batch = next(mode.iters[0])
    indices, prompts = batch
    with timers("generation"):
        params = sampling_for_step(run.cfg.rollout, step, run.env.rank, micro)
        ro = mode.engine.generate(prompts, params)
    if mode.reward_fn is not None:
        ro = ro.with_rewards(mode.reward_fn(ro))
    with timers("score"):
        scored = mode.scorer(ro)
    return indices, ro, scored


def build_onpolicy_run(cfg: OnPolicyConfig, reward_fn=None) -> Run:
    """The built (not started, not resumed) run: student, engine, scorer, teachers, loaders."""
    return core.build(cfg, OnPolicyMode(reward_fn))


def _rollout_metrics(metrics, ro, scored) -> None:
    st = scored.stats
    metrics.add("response_tokens", st.response_tokens)
    metrics.add(TOKENS, st.response_tokens)
    metrics.add("forward_tokens", scored.batch.stats.student_tokens)
    metrics.mean(TOOL_TOKEN_RATIO, st.tool_token_ratio)
    metrics.mean(RESPONSE_LEN, float(ro.response_len_B.float().mean()))
    metrics.mean("stop_fraction", float(np.mean([r == "stop" for r in ro.finish_reasons])))
    for name in st.coverage:
        metrics.mean(teacher_coverage(name), st.coverage[name])
        metrics.mean(Metric("tool_ratio", name), st.teacher_tool_ratio[name])
        metrics.mean(Metric("unaligned_frac", name), st.unaligned_frac.get(name, 0.0))
        metrics.add(Metric("missing_bytes", name), st.missing_bytes.get(name, 0))
    metrics.mean(UNALIGNED_FRAC, float(np.mean(list(st.unaligned_frac.values())))
                 if st.unaligned_frac else 0.0)


def run_onpolicy(cfg: OnPolicyConfig, reward_fn=None) -> dict:
    """Train ``cfg`` (an :class:`OnPolicyConfig`): build, resume, train, export; returns the
    final step's metrics (rank 0's view: ``loss``, ``<teacher>/loss``, rollout statistics).

    ``reward_fn(rollouts) -> float[B]`` (optional) attaches task rewards to every rollout batch;
    with ``loss.reward_beta > 0`` they weight the samples.
    """
    return core.train(cfg, OnPolicyMode(reward_fn))


def _sync_point(cfg, step: int) -> bool:
    """Whether the engine gets the student's weights after ``step``: every ``rollout.sync_every``
    steps, and at each periodic checkpoint (so that a resume from it starts from the weights the
    uninterrupted run's engine holds)."""
    every = cfg.checkpoint.every
    return step % cfg.rollout.sync_every == 0 or (every > 0 and step % every == 0)
