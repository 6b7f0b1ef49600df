"""One on-policy step: rollouts -> scoring -> teachers -> per-teacher on-policy losses -> backward.

Legend: B samples, Ts/Tt student/teacher tokens, Vs/Vt vocabularies, K top-k, N shared vocabulary.

Plan (:func:`build_onpolicy_plan`, before any model loads): tokenizers, which teachers share the
student's tokenizer (identity views, ``align=None``), the :class:`OnPolicyLossSpec` and static
weight of each teacher, projections (``reverse_kl``/``jsd`` through ``cross: projection``) and
shared vocabularies (``cross: exact``).

Loss of a step: ``L = sum_i w_i * L_i`` with ``L_i = (1 / N_i) * sum_units loss_u``, where
``N_i`` is teacher ``i``'s global number of loss units (tokens for a same-tokenizer teacher,
aligned loss chunks across tokenizers; :func:`count_onpolicy_units` summed over ranks with
``all_reduce_sum``). With ``student.grad_reduce = "sum"`` the update equals one process on the
global batch. Teacher inputs: the sampled estimators use the worker's ``token_logp_BTt`` (log q of
the teacher's own next tokens, present for every output kind) when it was taken at the loss
temperature, else recompute it from the logits; full-distribution losses get the logits at
temperature 1 (a tempered worker's ``z / T`` is multiplied back).

Timing (seconds per step): ``generation``, ``score`` (re-render, re-tokenize, align), ``teacher``,
``student`` (forward + backward), ``loss`` (loss forward), ``optim``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from xdistill import distributed as xdist
from xdistill.errors import ConfigError
from xdistill.losses.chunks import ChunkAlignment
from xdistill.losses.onpolicy import (COUNTERS, Clamps, OnPolicyLossSpec, count_onpolicy_units,
                                      onpolicy_loss, reward_weights)
from xdistill.train import setup
from xdistill.train.onpolicy_config import OnPolicyConfig


@dataclass
class OnPolicyPlan:
    """Everything decided before compute (see the module doc)."""

    # the student's tokenizer
    student_tok: object
    # teacher name -> tokenizer
    teacher_toks: dict
    # teacher name -> True when its tokenizer fingerprint equals the student's
    same_tok: dict
    # teacher name -> OnPolicyLossSpec
    specs: dict
    # teacher name -> static weight
    weights: dict
    # teacher name -> torch sparse CSR proj_VsVt (cross route projection)
    projections: dict = field(default_factory=dict)
    # teacher name -> (student ids [N], teacher ids [N]) of identical token bytes (cross route exact)
    shared: dict = field(default_factory=dict)


def build_onpolicy_plan(cfg: OnPolicyConfig) -> OnPolicyPlan:
    """Load tokenizers/projections and check every teacher/loss pairing (no model loads)."""
    lc = cfg.loss
    clamps = Clamps(lc.logp_min, lc.loss_max, lc.exp_clip)
    student = setup._load_tok(cfg.student_tokenizer, cfg.student.path, "student_tokenizer")
    plan = OnPolicyPlan(student, {}, {}, {}, {})
    for i, t in enumerate(cfg.teachers):
        key, tl = f"teachers.{i}", t.loss
        tok = setup._load_tok(t.tokenizer, t.worker.model, f"{key}.tokenizer")
        same = tok.fingerprint == student.fingerprint
        plan.teacher_toks[t.name], plan.same_tok[t.name] = tok, same
        plan.specs[t.name] = OnPolicyLossSpec(tl.kind, tl.beta, tl.temperature, tl.cross, clamps)
        plan.weights[t.name] = float(tl.weight)
        if tl.kind == "topk_kl" and not same:
            raise ConfigError(f"{key}.loss.kind: 'topk_kl' needs the student's tokenizer; teacher "
                              f"{t.name!r} uses {tok.name!r}, the student {student.name!r}")
        if same or tl.kind not in ("reverse_kl", "jsd"):
            continue
        if tl.cross == "projection":
            if not tl.projection:
                raise ConfigError(f"{key}.loss.projection: cross-tokenizer {tl.kind!r} through "
                                  "the projection needs an artifact (or set loss.cross = exact)")
            plan.projections[t.name] = setup._projection(t, key, student, tok)
        else:
            s_N, t_N = setup.shared_vocab(student, tok)
            if s_N.numel() == 0:
                raise ConfigError(f"{key}: no token has identical bytes in {student.name!r} and "
                                  f"{tok.name!r}; use loss.cross = projection")
            plan.shared[t.name] = (s_N, t_N)
    return plan


def teacher_alignment(plan: OnPolicyPlan, name: str, view):
    """None for an identity view of a same-tokenizer teacher, else the view's chunk alignment."""
    return None if (view.identity and plan.same_tok[name]) else ChunkAlignment.from_view(view)


def local_units(plan: OnPolicyPlan, batch) -> dict[str, int]:
    """Loss units of this rank's batch per teacher name."""
    out = {}
    for name, spec in plan.specs.items():
        view = batch.teacher(name)
        align = teacher_alignment(plan, name, view)
        out[name] = count_onpolicy_units(spec, batch.loss_mask_BTs, align,
                                         None if align is None else view.loss_mask_BTt)
    return out


def _fit_width(t_logits, width: int, name: str):
    """A same-tokenizer teacher's logits cut to the student's logit width (padded columns)."""
    if t_logits.shape[-1] == width:
        return t_logits
    if t_logits.shape[-1] > width:
        return t_logits[..., :width]
    raise ConfigError(f"teacher {name!r} emits {t_logits.shape[-1]} logits but the student {width}; "
                      "a same-tokenizer full-distribution loss needs the teacher at least as wide")


def teacher_inputs(plan: OnPolicyPlan, name: str, view, out, s_width: int) -> tuple:
    """(align, keyword arguments of :func:`onpolicy_loss`) for one teacher's output."""
    spec = plan.specs[name]
    align = teacher_alignment(plan, name, view)
    kw = {}
    if align is not None:
        kw.update(t_loss_mask_BTt=view.loss_mask_BTt, teacher_ids_BTt=view.input_ids_BTt)
    logits = out.logits_BTtV
    if logits is not None:
        logits = logits.float() * out.temperature if out.temperature != 1.0 else logits.float()
        if align is None:
            logits = _fit_width(logits, s_width, name)
    if spec.kind in ("k1", "k3"):
        if out.token_logp_BTt is not None and out.temperature == spec.temperature:
            kw["teacher_token_logp_BTt"] = out.token_logp_BTt
        else:
            kw["teacher_logits_BTtV"] = logits
        return align, kw
    if spec.kind == "topk_kl":
        return align, dict(kw, topk_logp_BTtK=out.topk_logp_BTtK, topk_idx_BTtK=out.topk_idx_BTtK)
    kw["teacher_logits_BTtV"] = logits
    if name in plan.projections:
        kw["projection"] = plan.projections[name]  # moved (and cached) by the loss itself
    if name in plan.shared:
        s_N, t_N = plan.shared[name]
        kw.update(shared_s_idx_N=s_N.to(logits.device), shared_t_idx_N=t_N.to(logits.device))
    return align, kw


def onpolicy_losses(plan, logits_BTsVs, batch, outputs, num_valid, metrics, *,
                    sample_weight_B=None, chunk_size=None) -> torch.Tensor:
    """``sum_i w_i L_i`` (normalised by the global ``num_valid[name]``); records each teacher's
    term (summed), weight (averaged), clamp counters and log-ratio sums (summed) in
    ``metrics`` (a :class:`xdistill.train.metrics.StepMetrics`)."""
    total = None
    for name, spec in plan.specs.items():
        view = batch.teacher(name)
        align, kw = teacher_inputs(plan, name, view, outputs[name], logits_BTsVs.shape[-1])
        if chunk_size is not None:
            kw["chunk_size"] = chunk_size
        res = onpolicy_loss(spec, logits_BTsVs, batch.input_ids_BTs, batch.loss_mask_BTs,
                            align=align, sample_weight_B=sample_weight_B,
                            num_valid=num_valid[name], **kw)
        term = plan.weights[name] * res.loss
        total = term if total is None else total + term
        metrics.add(f"{name}/loss", res.loss.detach())
        metrics.mean(f"{name}/weight", plan.weights[name])
        for c in COUNTERS:
            if c in res.counters:
                metrics.add(f"{name}/clamp/{c}", float(res.counters[c]))
        if spec.kind in ("k1", "k3"):
            r = res.mean_logratio
            metrics.add(f"{name}/logratio_sum", r * res.units if r == r else 0.0)
    metrics.add("loss", total.detach())
    return total


def sample_weights(scored, beta: float):
    """Per-sample reward weights (None when off or the rollouts carry no rewards)."""
    if beta <= 0 or scored.rewards_B is None:
        return None
    return reward_weights(scored.rewards_B, beta)


def loss_and_backward(run, scored, timers, *, backward: bool = True) -> dict:
    """:func:`scored_step` of one scored batch on its own: units counted over ranks, metrics
    reduced; returns them (``units/<name>``, ``<name>/loss``, ``loss``, ...)."""
    from xdistill.train.metrics import StepMetrics
    from xdistill.train.step import all_reduce_counts

    num_valid = all_reduce_counts(local_units(run.plan, scored.batch))
    metrics = StepMetrics()
    scored_step(run, scored, num_valid, timers, metrics, backward=backward)
    out = metrics.reduce()
    out.update({f"units/{k}": v for k, v in num_valid.items()})
    return out


def scored_step(run, scored, num_valid, timers, metrics, *, backward: bool = True) -> None:
    """Teachers, student forward, weighted on-policy losses and backward of one scored batch.

    Remote teachers are submitted first and compute while the student runs its forward."""
    cfg, plan, pool = run.cfg, run.plan, run.mode.pool
    with timers("transport"):
        batch = scored.batch.to(run.device, non_blocking=True)
    with timers("teacher"):
        remote = pool.submit_remote(batch)
    results = None
    try:
        with timers("student"):
            logits = setup_student_logits(run.model, batch)
        with timers("teacher"):
            results = pool.complete(batch, remote)
        outputs = {name: results[name].to(run.device) for name in plan.specs}
        weights = sample_weights(scored, cfg.loss.reward_beta)
        if weights is not None:
            weights = weights.to(run.device)
        with timers("loss"):
            loss = onpolicy_losses(plan, logits, batch, outputs, num_valid, metrics,
                                   sample_weight_B=weights, chunk_size=cfg.loss.chunk_size)
        if backward:
            with timers("student"):
                loss.backward()
    finally:
        if results is not None:
            results.release()
        elif remote:
            pool.collect(remote).release()


def setup_student_logits(model, batch) -> torch.Tensor:
    return model(input_ids=batch.input_ids_BTs, attention_mask=batch.attention_mask_BTs.long(),
                 use_cache=False).logits


def finish_metrics(metrics: dict, plan: OnPolicyPlan) -> dict:
    """Turn summed log-ratios into means over the global units (after the rank reduction)."""
    for name in plan.specs:
        s = metrics.pop(f"{name}/logratio_sum", None)
        if s is not None:
            metrics[f"{name}/mean_logratio"] = s / max(metrics.get(f"units/{name}", 0), 1)
    return metrics


# ----------------------------------------------------------------------------- off-policy mixing
@dataclass
class OffPolicyMix:
    """Off-policy batches mixed into an on-policy run (``loss.offpolicy_lambda > 0``)."""

    # the equivalent off-policy run config (teachers with their off-policy loss kinds)
    cfg: object
    # its plan (tokenizers, projections, loss specs)
    plan: object
    # MultiTeacherLoss over the off-policy kinds
    loss_fn: object
    # one resumable loader of this rank's shard of offpolicy.data
    loaders: list


def derived_offpolicy_kind(t, same: bool) -> str:
    """The off-policy loss kind of teacher ``t`` on mixed-in batches (``loss.offpolicy_kind`` or
    derived from its on-policy kind, see :class:`OnPolicyTeacherLoss`)."""
    lc = t.loss
    if lc.offpolicy_kind:
        return lc.offpolicy_kind
    if same:
        if lc.kind in ("reverse_kl", "jsd", "topk_kl"):
            return lc.kind
        return "topk_kl" if t.worker.output == "topk" else "forward_kl"
    if lc.kind in ("reverse_kl", "jsd"):
        return "pkl" if lc.cross == "projection" else "exact_kl"
    if t.worker.output != "logits":
        raise ConfigError(f"teacher {t.name!r}: no off-policy loss fits a cross-tokenizer "
                          f"{t.worker.output!r} teacher; set its loss.offpolicy_kind or "
                          "loss.offpolicy_lambda = 0")
    return "alm"


def offpolicy_config(cfg: OnPolicyConfig, plan: OnPolicyPlan):
    """The :class:`OffPolicyConfig` of the mixed-in batches (shares student, teachers, optim)."""
    from xdistill.train.config import (LossConfig, OffPolicyConfig, TeacherLossConfig,
                                       TeacherRunConfig, TrainConfig)

    teachers = []
    for t in cfg.teachers:
        kind = derived_offpolicy_kind(t, plan.same_tok[t.name])
        direction = {"reverse_kl": "reverse", "jsd": "jsd"}.get(t.loss.kind, "forward")
        loss = TeacherLossConfig(kind=kind, weight=t.loss.weight, temperature=t.loss.temperature,
                                 projection=t.loss.projection, direction=direction,
                                 beta=t.loss.beta)
        teachers.append(TeacherRunConfig(t.name, t.tokenizer, t.max_len, t.worker, loss))
    data = cfg.offpolicy.data
    train = TrainConfig(steps=cfg.train.steps, global_batch_size=0, seed=cfg.train.seed,
                        out_dir=cfg.train.out_dir)
    return OffPolicyConfig(student=cfg.student, student_tokenizer=cfg.student_tokenizer,
                           teachers=teachers, data=data,
                           loss=LossConfig(ce_weight=cfg.offpolicy.ce_weight,
                                           chunk_size=cfg.loss.chunk_size),
                           optim=cfg.optim, scheduler=cfg.scheduler, train=train)


def build_mix(cfg: OnPolicyConfig, plan: OnPolicyPlan, env) -> OffPolicyMix:
    """Plan, loss and this rank's loader of the off-policy batches (reusing train.setup)."""
    off = offpolicy_config(cfg, plan)
    off_plan = setup.build_plan(off)
    loaders = setup.build_loaders(off, off_plan, env.rank, env.world_size, env.world_size)
    return OffPolicyMix(off, off_plan, setup.build_loss(off, off_plan), loaders)


def offpolicy_micro(run, batch, num_valid, timers, metrics) -> None:
    """One mixed-in off-policy micro-batch through :func:`xdistill.train.step.micro_step`."""
    from xdistill.train.step import micro_step, record_report

    mix = run.mode.mix
    report = micro_step(run.model, mix.loss_fn, run.mode.pool, batch, num_valid, timers,
                        device=run.device, ce_weight=mix.cfg.loss.ce_weight)
    record_report(metrics, report)
    metrics.add("tokens", batch.stats.student_tokens)
