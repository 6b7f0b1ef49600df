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
from typing import TYPE_CHECKING

import torch

from xdistill import distributed as xdist
from xdistill.errors import ConfigError
from xdistill.losses.bytecredit import credit_alignment, uses_byte_credit
from xdistill.losses.chunks import ChunkAlignment
from xdistill.losses.onpolicy_kinds import FULL_LOGITS_KINDS, KINDS_2026, KindParams
from xdistill.losses.policy import PPOClip
from xdistill.losses.onpolicy import (Clamps, OnPolicyLossSpec, count_onpolicy_units, counter_keys,
                                      onpolicy_loss, reward_weights)
from xdistill.train import setup
from xdistill.train.onpolicy_config import OnPolicyConfig

if TYPE_CHECKING:
    from xdistill.tokenization.tokenizer import Tokenizer


@dataclass
class OnPolicyPlan:
    """Everything decided before compute (see the module doc)."""

    # the student's tokenizer
    student_tok: Tokenizer
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
    # teacher name -> (student ids [N], teacher ids [N]) of identical token bytes (cross route
    # exact, strict_topk)
    shared: dict = field(default_factory=dict)
    # teacher name -> BytePrefixTables (bpm, escd)
    tables: dict = field(default_factory=dict)
    # teacher name -> LongTokenTables (bpm, escd with loss.long_tokens)
    long_tables: dict = field(default_factory=dict)
    # True when some teacher's simple_opd uses the reference KL (needs the initial student)
    needs_reference: bool = False


def _kind_params(tl, clamps, baseline: str) -> KindParams:
    return KindParams(top_k=tl.top_k, ppo=PPOClip(tl.clip_low, tl.clip_high, tl.dual_clip),
                      adv_clamp=clamps.loss_max, ref_beta=tl.ref_beta,
                      mask_whitespace=tl.mask_whitespace, long_tokens=tl.long_tokens,
                      baseline=baseline)


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
        plan.specs[t.name] = OnPolicyLossSpec(tl.kind, tl.beta, tl.temperature, tl.cross, clamps,
                                              unpaired=lc.unpaired,
                                              credit="token" if same else lc.credit,
                                              stop_advantage=lc.stop_advantage,
                                              params=_kind_params(tl, clamps,
                                                                  lc.advantage_baseline),
                                              baseline=lc.advantage_baseline)
        plan.weights[t.name] = float(tl.weight)
        plan.needs_reference |= tl.kind == "simple_opd" and tl.ref_beta > 0
        if tl.kind == "topk_kl" and not same:
            raise ConfigError(f"{key}.loss.kind: 'topk_kl' needs the student's tokenizer; teacher "
                              f"{t.name!r} uses {tok.name!r}, the student {student.name!r}")
        if tl.kind in ("bpm", "escd"):
            plan.tables[t.name] = byteprefix_tables(student, tok)
            if tl.long_tokens:
                from xdistill.rollout.bytecredit import build_long_token_tables
                plan.long_tables[t.name] = build_long_token_tables(student.table, tok.table)
        if tl.kind == "strict_topk" or (not same and tl.kind in ("reverse_kl", "jsd")
                                        and tl.cross == "exact"):
            plan.shared[t.name] = _shared(key, student, tok)
        elif not same and tl.kind in ("reverse_kl", "jsd"):
            if not tl.projection:
                raise ConfigError(f"{key}.loss.projection: cross-tokenizer {tl.kind!r} through "
                                  "the projection needs an artifact (or set loss.cross = exact)")
            plan.projections[t.name] = setup._projection(t, key, student, tok)
    setup.resolve_bos_settings(cfg, plan, "rollout")
    return plan


def _shared(key: str, student, tok):
    s_N, t_N = setup.shared_vocab(student, tok)
    if s_N.numel() == 0:
        raise ConfigError(f"{key}: no token has identical bytes in {student.name!r} and "
                          f"{tok.name!r}; use loss.cross = projection")
    return s_N, t_N


def byteprefix_tables(student, teacher):
    """The BPM/ESCD byte-prefix map of a tokenizer pair; stop tokens bridged by role (each
    side's EOS and chat end-of-turn token)."""
    from xdistill.losses.byteprefix import BytePrefixTables
    from xdistill.projection.byteprefix import build_byteprefix_map
    from xdistill.rollout.render import stop_token_ids

    m = build_byteprefix_map(student, teacher, student_stop_ids=list(stop_token_ids(student)),
                             teacher_stop_ids=list(stop_token_ids(teacher)))
    return BytePrefixTables.from_map(m)


def teacher_alignment(plan: OnPolicyPlan, name: str, view):
    """None for an identity view of a same-tokenizer teacher, else the view's chunk alignment
    (the 2026 kinds always work on chunks: the identity view's for a same-tokenizer teacher)."""
    if view.identity and plan.same_tok[name] and plan.specs[name].kind not in KINDS_2026:
        return None
    return ChunkAlignment.from_view(view)


def teacher_mask(batch, name: str, rows: dict | None):
    """The student loss mask of teacher ``name``: only its routed samples (``rows``) when
    samples are routed to one teacher each."""
    if rows is None:
        return batch.loss_mask_BTs
    return batch.loss_mask_BTs & rows[name].to(batch.loss_mask_BTs.device)[:, None]


def local_units(plan: OnPolicyPlan, batch, rows: dict | None = None,
                stop_BTs=None) -> dict[str, int]:
    """Loss units of this rank's batch per teacher name (``rows``: per-sample routing;
    ``stop_BTs``: the student's stop tokens, one unit with the content they end under byte
    credit)."""
    out = {}
    for name, spec in plan.specs.items():
        view = batch.teacher(name)
        align = teacher_alignment(plan, name, view)
        out[name] = count_onpolicy_units(spec, teacher_mask(batch, name, rows), align,
                                         None if align is None else view.loss_mask_BTt,
                                         None if align is None else view.s_unpaired_BTs,
                                         student_ids_BTs=batch.input_ids_BTs,
                                         tables=plan.tables.get(name), stop_BTs=stop_BTs)
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
        kw.update(t_loss_mask_BTt=view.loss_mask_BTt, teacher_ids_BTt=view.input_ids_BTt,
                  unpaired_BTs=view.s_unpaired_BTs)
    logits = out.logits_BTtV
    if logits is not None:
        logits = logits.float() * out.temperature if out.temperature != 1.0 else logits.float()
        if align is None:
            logits = _fit_width(logits, s_width, name)
    if uses_byte_credit(spec.credit, spec.kind, align):
        kw["teacher_logits_BTtV"] = logits         # the covering sums read the full rows
    if spec.kind in KINDS_2026:
        return align, dict(kw, **_kind_inputs(plan, name, spec, out, logits, view))
    if spec.kind in ("k1", "k3") and "teacher_logits_BTtV" in kw:
        return align, kw
    if spec.kind in ("k1", "k3"):
        if out.token_logp_BTt is not None and out.temperature == spec.temperature:
            kw["teacher_token_logp_BTt"] = out.token_logp_BTt
        else:
            kw["teacher_logits_BTtV"] = logits
        return align, kw
    if spec.kind == "topk_kl":
        return align, dict(kw, topk_logp_BTtK=out.topk_logp_BTtK, topk_idx_BTtK=out.topk_idx_BTtK,
                           tail_logmass_BTt=out.tail_logmass_BTt)
    kw["teacher_logits_BTtV"] = logits
    if name in plan.projections:
        kw["projection"] = plan.projections[name]  # moved (and cached) by the loss itself
    if name in plan.shared:
        s_N, t_N = plan.shared[name]
        kw.update(shared_s_idx_N=s_N.to(logits.device), shared_t_idx_N=t_N.to(logits.device))
    return align, kw


def _kind_inputs(plan, name, spec, out, logits, view) -> dict:
    """Teacher inputs of a 2026 kind: full logits (strict_topk, bpm, escd) or token log-probs
    at the loss temperature (dpca, simple_opd), the shared vocabulary or byte-prefix tables."""
    from xdistill.losses.onpolicy import input_token_logprobs

    kw = {}
    if spec.kind in FULL_LOGITS_KINDS:
        kw["teacher_logits_BTtV"] = logits
    elif out.token_logp_BTt is not None and out.temperature == spec.temperature:
        kw["teacher_token_logp_BTt"] = out.token_logp_BTt.float()
    else:
        kw["teacher_token_logp_BTt"] = input_token_logprobs(
            logits, view.input_ids_BTt.to(logits.device), temperature=spec.temperature)
    if name in plan.shared:
        s_N, t_N = plan.shared[name]
        kw.update(shared_s_idx_N=s_N, shared_t_idx_N=t_N)
    if name in plan.tables:
        kw["tables"] = plan.tables[name]
    if name in plan.long_tables:
        kw.update(long_tables=plan.long_tables[name], teacher_ids_BTt=view.input_ids_BTt)
    return kw


def byte_credit_terms(plan, name: str, batch, align, stop_BTs, s_mask_BTs):
    """The byte-credit terms of one cross-tokenizer teacher's batch (host side, then moved)."""
    from xdistill.rollout.bytecredit import build_byte_terms

    spec, view = plan.specs[name], batch.teacher(name)
    merged = credit_alignment(spec.kind, spec.stop_advantage, align, stop_BTs, s_mask_BTs,
                              view.loss_mask_BTt)
    cpu = (lambda x: None if x is None else x.cpu())  # noqa: E731
    student, teacher = plan.student_tok, plan.teacher_toks[name]
    return build_byte_terms(student.table, teacher.table, cpu(batch.input_ids_BTs),
                            cpu(view.input_ids_BTt), ChunkAlignment(*map(cpu, (
                                merged.s_chunk_BTs, merged.t_chunk_BTt, merged.chunk_valid_BC,
                                merged.chunk_exact_BC))), cpu(s_mask_BTs),
                            cpu(view.loss_mask_BTt), cpu(stop_BTs),
                            student_key=student.fingerprint, teacher_key=teacher.fingerprint)


def onpolicy_losses(plan, logits_BTsVs, batch, outputs, num_valid, metrics, *,
                    sample_weight_B=None, stop_BTs=None, behaviour_logp_BTs=None,
                    ref_logp_BTs=None, rows=None, chunk_size=None) -> torch.Tensor:
    """``sum_i w_i L_i`` (normalised by the global ``num_valid[name]``); records each teacher's
    term (summed), weight (averaged), clamp counters and log-ratio sums (summed) in
    ``metrics`` (a :class:`xdistill.train.metrics.StepMetrics`)."""
    total = None
    for name, spec in plan.specs.items():
        view = batch.teacher(name)
        align, kw = teacher_inputs(plan, name, view, outputs[name], logits_BTsVs.shape[-1])
        if chunk_size is not None:
            kw["chunk_size"] = chunk_size
        if spec.kind in KINDS_2026:
            kw.update(behaviour_logp_BTs=behaviour_logp_BTs, ref_logp_BTs=ref_logp_BTs)
        if uses_byte_credit(spec.credit, spec.kind, align):
            kw["byte_credit"] = byte_credit_terms(plan, name, batch, align, stop_BTs,
                                                  teacher_mask(batch, name, rows))
        res = onpolicy_loss(spec, logits_BTsVs, batch.input_ids_BTs,
                            teacher_mask(batch, name, rows), align=align,
                            sample_weight_B=sample_weight_B, stop_BTs=stop_BTs,
                            num_valid=num_valid[name], **kw)
        term = plan.weights[name] * res.loss
        total = term if total is None else total + term
        metrics.add(f"{name}/loss", res.loss.detach())
        metrics.mean(f"{name}/weight", plan.weights[name])
        for c in counter_keys(spec, align is not None and not view.identity):
            metrics.add(f"{name}/clamp/{c}", float(res.counters.get(c, 0)))
        if uses_byte_credit(spec.credit, spec.kind, align):
            g = res.credit_gap_sum
            metrics.add(f"{name}/credit_gap_sum", g if g == g else 0.0)
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
    from xdistill.train.metrics import StepMetrics, all_reduce_counts

    num_valid = all_reduce_counts(local_units(run.plan, scored.batch,
                                              stop_BTs=scored.stop_BTs))
    metrics = StepMetrics()
    scored_step(run, scored, num_valid, timers, metrics, backward=backward)
    out = metrics.reduce()
    out.update({f"units/{k}": v for k, v in num_valid.items()})
    return out


def scored_step(run, scored, num_valid, timers, metrics, *, backward: bool = True,
                rows=None) -> None:
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
            stop = scored.stop_BTs.to(run.device) if scored.stop_BTs is not None else None
            ref = reference_logprobs(run, batch) if plan.needs_reference else None
            loss = onpolicy_losses(plan, logits, batch, outputs, num_valid, metrics,
                                   sample_weight_B=weights, stop_BTs=stop,
                                   behaviour_logp_BTs=scored.behaviour_logp_BTs.to(run.device),
                                   ref_logp_BTs=ref, rows=rows, chunk_size=cfg.loss.chunk_size)
        if backward:
            with timers("student"):
                loss.backward()
    finally:
        if results is not None:
            results.release()
        elif remote:
            pool.collect(remote).release()


@torch.no_grad()
def reference_logprobs(run, batch) -> torch.Tensor:
    """log q_init(y_i) of the sampled tokens at input positions (the frozen initial student kept
    by the mode for simple_opd's reference KL)."""
    from xdistill.losses.onpolicy import input_token_logprobs

    ref = run.mode.reference
    logits = setup_student_logits(ref, batch)
    return input_token_logprobs(logits.float(), batch.input_ids_BTs, batch.loss_mask_BTs)


def setup_student_logits(model, batch) -> torch.Tensor:
    return model(input_ids=batch.input_ids_BTs, attention_mask=batch.attention_mask_BTs.long(),
                 use_cache=False).logits


def finish_metrics(metrics: dict, plan: OnPolicyPlan) -> dict:
    """Turn summed log-ratios into means over the global units (after the rank reduction)."""
    for name in plan.specs:
        s = metrics.pop(f"{name}/logratio_sum", None)
        if s is not None:
            metrics[f"{name}/mean_logratio"] = s / max(metrics.get(f"units/{name}", 0), 1)
        g = metrics.pop(f"{name}/credit_gap_sum", None)
        if g is not None:  # byte credit: mean measured error log P_ub - log P_lb per unit
            metrics[f"{name}/credit_gap"] = g / max(metrics.get(f"units/{name}", 0), 1)
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
    if lc.kind == "strict_topk":
        return "exact_kl"
    if t.worker.output != "logits":
        raise ConfigError(f"teacher {t.name!r}: no off-policy loss fits a cross-tokenizer "
                          f"{t.worker.output!r} teacher; set its loss.offpolicy_kind or "
                          "loss.offpolicy_lambda = 0")
    return "alm"


def offpolicy_config(cfg: OnPolicyConfig, plan: OnPolicyPlan):
    """The :class:`OffPolicyConfig` of the mixed-in batches (shares student, teachers, optim)."""
    from xdistill.train.config import (LossConfig, OffPolicyConfig, TeacherLossConfig,
                                       TeacherRunConfig)
    from xdistill.train.run_config import TrainConfig

    teachers = []
    for t in cfg.teachers:
        kind = derived_offpolicy_kind(t, plan.same_tok[t.name])
        direction = {"reverse_kl": "reverse", "jsd": "jsd", "strict_topk": "reverse"}.get(
            t.loss.kind, "forward")
        loss = TeacherLossConfig(kind=kind, weight=t.loss.weight, temperature=t.loss.temperature,
                                 projection=t.loss.projection, direction=direction,
                                 beta=t.loss.beta)
        teachers.append(TeacherRunConfig(name=t.name, tokenizer=t.tokenizer, max_len=t.max_len,
                                         add_bos=t.add_bos, worker=t.worker, loss=loss))
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
