"""One on-policy step: rollouts -> scoring -> teachers -> per-teacher on-policy losses -> backward.

Legend: B samples, Ts/Tt student/teacher tokens, Vs/Vt vocabularies, K top-k, N shared vocabulary.

Plan (:func:`build_onpolicy_plan`, before any model loads): the per-teacher plans both modes
share (:mod:`xdistill.train.teacher_plan`: tokenizers, which teachers share the student's tokenizer
-- identity views, ``align=None`` --, BOS settings, projections for ``reverse_kl``/``jsd`` through
``cross: projection``, shared vocabularies for ``cross: exact`` and ``strict_topk``), the
:class:`OnPolicyLossSpec` and static weight of each teacher, and with ``loss.offpolicy_lambda >
0`` the off-policy loss specs of the mixed-in batches (:func:`mix_specs`, checked by the
off-policy planner :func:`xdistill.train.setup.plan_offpolicy_teacher`).

A scored batch runs through the step skeleton both modes share
(:func:`xdistill.train.forward.teachers_and_student`); this module supplies its loss.

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

import math
from dataclasses import dataclass, field

import torch

from xdistill import distributed as xdist
from xdistill.errors import ConfigError
from xdistill.losses import MultiTeacherLoss
from xdistill.losses.bytecredit import credit_alignment, uses_byte_credit
from xdistill.losses.byteprefix import BytePrefixTables
from xdistill.losses.chunks import ChunkAlignment
from xdistill.losses.onpolicy_kinds import FULL_LOGITS_KINDS, KINDS_2026, KindParams
from xdistill.losses.policy import PPOClip
from xdistill.losses.onpolicy import (SAMPLED_LOSSES, Clamps, OnPolicyLossSpec,
                                      count_onpolicy_units, counter_keys, input_token_logprobs,
                                      onpolicy_loss, reward_weights)
from xdistill.rollout.bytecredit import build_byte_terms, build_long_token_tables
from xdistill.rollout.render import stop_token_ids
from xdistill.train import setup
from xdistill.train.config import TeacherLossConfig
from xdistill.train.forward import student_logits, teachers_and_student
from xdistill.train.metrics import (TOKENS, TOTAL, Metric, StepMetrics, all_reduce_counts,
                                    teacher_loss, teacher_weight)
from xdistill.train.onpolicy_config import OnPolicyConfig
from xdistill.train.step import micro_step, record_report
from xdistill.train.teacher_plan import (DistillPlan, TeacherPlan, load_student_tokenizer,
                                         plan_teacher, resolve_bos_settings, resolve_student_bos,
                                         with_projection, with_shared)


@dataclass
class OnPolicyPlan(DistillPlan):
    """Everything decided before compute (see the module doc): the student's and teachers' plans
    (:class:`DistillPlan`: tokenizers, same-tokenizer flags, BOS, projections for ``cross:
    projection``, shared vocabularies for ``cross: exact`` and strict_topk) and the losses."""

    # teacher name -> OnPolicyLossSpec
    specs: dict = field(default_factory=dict)
    # teacher name -> static weight
    weights: dict = field(default_factory=dict)
    # teacher name -> BytePrefixTables (bpm, escd)
    tables: dict = field(default_factory=dict)
    # teacher name -> LongTokenTables (bpm, escd with loss.long_tokens)
    long_tables: dict = field(default_factory=dict)
    # True when some teacher's simple_opd uses the reference KL (needs the initial student)
    needs_reference: bool = False
    # the off-policy loss specs of the mixed-in batches, in config order (loss.offpolicy_lambda
    # > 0; else empty)
    mix_specs: list = field(default_factory=list)


def _kind_params(tl, clamps, baseline: str) -> KindParams:
    return KindParams(top_k=tl.top_k, ppo=PPOClip(tl.clip_low, tl.clip_high, tl.dual_clip),
                      adv_clamp=clamps.loss_max, ref_beta=tl.ref_beta,
                      mask_whitespace=tl.mask_whitespace, long_tokens=tl.long_tokens,
                      baseline=baseline)


def build_onpolicy_plan(cfg: OnPolicyConfig) -> OnPolicyPlan:
    """Load tokenizers/projections and check every teacher/loss pairing, the mixed-in
    off-policy losses' included (no model loads)."""
    lc = cfg.loss
    clamps = Clamps(lc.logp_min, lc.loss_max, lc.exp_clip)
    student = load_student_tokenizer(cfg)
    plan = OnPolicyPlan(student)
    for i, t in enumerate(cfg.teachers):
        plan.teachers[t.name] = _plan_teacher_loss(plan, t, plan_teacher(t, i, student), clamps, lc)
        _check_same_tokenizer_length(cfg, t, plan.teachers[t.name])
    resolve_bos_settings(cfg, plan, "rollout")
    if lc.offpolicy_lambda > 0:
        resolve_student_bos(cfg, student, "offpolicy.data")
        plan.mix_specs = mix_specs(cfg, plan)
    return plan


def _check_same_tokenizer_length(cfg: OnPolicyConfig, t, tp: TeacherPlan) -> None:
    """A same-tokenizer teacher scores the student's own rows, which are not cut: its
    ``max_len`` must hold the longest row (``rollout.max_prompt_len + rollout.max_new_tokens``)."""
    longest = cfg.rollout.max_prompt_len + cfg.rollout.max_new_tokens
    if tp.same_tokenizer and t.max_len is not None and t.max_len < longest:
        raise ConfigError(f"{tp.key}.max_len = {t.max_len}: teacher {t.name!r} uses the student's "
                          f"tokenizer and scores the student's rows as they are, up to "
                          f"rollout.max_prompt_len + rollout.max_new_tokens = {longest} tokens; "
                          f"raise max_len to {longest} (or null) or shorten the rollouts")


def _plan_teacher_loss(plan: OnPolicyPlan, t, tp: TeacherPlan, clamps, lc) -> TeacherPlan:
    """Record teacher ``t``'s on-policy loss spec, weight and tables in ``plan``; returns ``tp``
    with the projection or shared vocabulary its loss needs."""
    tl, same, student, tok = t.loss, tp.same_tokenizer, plan.student_tok, tp.tokenizer
    plan.specs[t.name] = OnPolicyLossSpec(tl.kind, tl.beta, tl.temperature, tl.cross, clamps,
                                          unpaired=lc.unpaired,
                                          credit="token" if same else lc.credit,
                                          byte_units=(lc.byte_units if not same and tl.kind
                                                      in SAMPLED_LOSSES else "chunk"),
                                          stop_advantage=lc.stop_advantage,
                                          params=_kind_params(tl, clamps, lc.advantage_baseline),
                                          baseline=lc.advantage_baseline,
                                          discount=lc.discount)
    plan.weights[t.name] = float(tl.weight)
    plan.needs_reference |= tl.kind == "simple_opd" and tl.ref_beta > 0
    if tl.kind == "topk_kl" and not same:
        raise ConfigError(f"{tp.key}.loss.kind: 'topk_kl' needs the student's tokenizer; teacher "
                          f"{t.name!r} uses {tok.name!r}, the student {student.name!r}")
    if tl.kind in ("bpm", "escd"):
        plan.tables[t.name] = byteprefix_tables(student, tok)
        if tl.long_tokens:
            plan.long_tables[t.name] = build_long_token_tables(student.table, tok.table)
    if tl.kind == "strict_topk":
        return with_shared(tp, student, "loss 'strict_topk' works on the shared vocabulary")
    if not same and tl.kind in ("reverse_kl", "jsd") and tl.cross == "exact":
        return with_shared(tp, student, f"loss {tl.kind!r} with loss.cross = exact works on the "
                           "shared vocabulary", "use loss.cross = projection")
    if not same and tl.kind in ("reverse_kl", "jsd"):
        return with_projection(tp, tl.projection, student,
                               f"cross-tokenizer {tl.kind!r} through the projection needs an "
                               "artifact (or set loss.cross = exact)")
    return tp


def byteprefix_tables(student, teacher):
    """The BPM/ESCD byte-prefix map of a tokenizer pair; stop tokens bridged by role (each
    side's EOS and chat end-of-turn token)."""
    # deferred: scipy via xdistill.projection (only the byte-prefix loss needs it)
    from xdistill.projection.byteprefix import build_byteprefix_map

    m = build_byteprefix_map(student, teacher, student_stop_ids=list(stop_token_ids(student)),
                             teacher_stop_ids=list(stop_token_ids(teacher)))
    return BytePrefixTables.from_map(m)


def teacher_alignment(plan: OnPolicyPlan, name: str, view):
    """None for an identity view of a same-tokenizer teacher, else the view's chunk alignment
    (the 2026 kinds always work on chunks: the identity view's for a same-tokenizer teacher)."""
    if (view.identity and plan.teachers[name].same_tokenizer
            and plan.specs[name].kind not in KINDS_2026):
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
    tp = plan.teachers[name]
    if tp.projection is not None:
        kw["projection"] = tp.projection  # moved (and cached) by the loss itself
    if tp.shared is not None:
        s_N, t_N = tp.shared
        kw.update(shared_s_idx_N=s_N.to(logits.device), shared_t_idx_N=t_N.to(logits.device))
    return align, kw


def _kind_inputs(plan, name, spec, out, logits, view) -> dict:
    """Teacher inputs of a 2026 kind: full logits (strict_topk, bpm, escd) or token log-probs
    at the loss temperature (dpca, simple_opd), the shared vocabulary or byte-prefix tables."""
    kw = {}
    if spec.kind in FULL_LOGITS_KINDS:
        kw["teacher_logits_BTtV"] = logits
    elif out.token_logp_BTt is not None and out.temperature == spec.temperature:
        kw["teacher_token_logp_BTt"] = out.token_logp_BTt.float()
    else:
        kw["teacher_token_logp_BTt"] = input_token_logprobs(
            logits, view.input_ids_BTt.to(logits.device), temperature=spec.temperature)
    shared = plan.teachers[name].shared
    if shared is not None:
        kw.update(shared_s_idx_N=shared[0], shared_t_idx_N=shared[1])
    if name in plan.tables:
        kw["tables"] = plan.tables[name]
    if name in plan.long_tables:
        kw.update(long_tables=plan.long_tables[name], teacher_ids_BTt=view.input_ids_BTt)
    return kw


def byte_credit_terms(plan, name: str, batch, align, stop_BTs, s_mask_BTs):
    """The byte-credit terms of one cross-tokenizer teacher's batch (host side, then moved)."""
    spec, view = plan.specs[name], batch.teacher(name)
    merged = credit_alignment(spec.kind, spec.stop_advantage, align, stop_BTs, s_mask_BTs,
                              view.loss_mask_BTt)
    cpu = (lambda x: None if x is None else x.cpu())  # noqa: E731
    student, teacher = plan.student_tok, plan.teachers[name].tokenizer
    return build_byte_terms(student.table, teacher.table, cpu(batch.input_ids_BTs),
                            cpu(view.input_ids_BTt), ChunkAlignment(*map(cpu, (
                                merged.s_chunk_BTs, merged.t_chunk_BTt, merged.chunk_valid_BC,
                                merged.chunk_exact_BC))), cpu(s_mask_BTs),
                            cpu(view.loss_mask_BTt), cpu(stop_BTs),
                            student_key=student.fingerprint, teacher_key=teacher.fingerprint,
                            units=spec.byte_units, t_phantom_BTt=cpu(view.t_phantom_BTt))


def onpolicy_losses(plan, logits_BTsVs, batch, outputs, num_valid, metrics, *,
                    sample_weight_B=None, stop_BTs=None, behaviour_logp_BTs=None,
                    ref_logp_BTs=None, rows=None, chunk_size=None) -> torch.Tensor:
    """``sum_i w_i L_i`` (normalised by the global ``num_valid[name]``); records each teacher's
    term (summed), weight (averaged), clamp counters and log-ratio sums (summed) in
    ``metrics`` (a :class:`xdistill.train.metrics.StepMetrics`, :func:`_record_teacher`)."""
    total = None
    logits_BTsVs = tokenizer_columns(logits_BTsVs, plan.student_tok)
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
        _record_teacher(metrics, name, spec, res, plan.weights[name],
                        align is not None and not view.identity,
                        uses_byte_credit(spec.credit, spec.kind, align))
    metrics.add(TOTAL, total.detach())
    return total


def _record_teacher(metrics: StepMetrics, name: str, spec, res, weight: float, cross: bool,
                    byte_credit: bool) -> None:
    """Teacher ``name``'s loss term (summed), weight (averaged), clamp counters (summed), and
    per loss unit: the mean log-ratio (k1, k3) and the byte-credit gap (mean measured error
    log P_ub - log P_lb; both summed here, divided by the teacher's global units on reduction)."""
    metrics.add(teacher_loss(name), res.loss.detach())
    metrics.mean(teacher_weight(name), weight)
    for c in counter_keys(spec, cross):
        metrics.add(Metric(f"clamp/{c}", name), float(res.counters.get(c, 0)))
    if spec.kind in ("k1", "k3"):
        r = res.mean_logratio
        metrics.per_unit(Metric("mean_logratio", name), r * res.units if r == r else 0.0)
    if byte_credit:
        for key, g in (("credit_gap", res.credit_gap_sum),
                       ("credit_gap_seg", res.credit_gap_seg_sum)):
            metrics.per_unit(Metric(key, name), g if g == g else 0.0)


@dataclass(frozen=True)
class RewardNorm:
    """The reward normaliser of a whole step: N samples, ``log sum exp(r / beta)`` over them."""

    count: int
    log_norm: float


def step_reward_norm(scored_batches, beta: float) -> RewardNorm | None:
    """The step's :class:`RewardNorm` over every micro-batch of every rank (two collectives;
    every rank calls it); None when reward weighting is off or no rollout carries rewards."""
    if beta <= 0:
        return None
    rs = [s.rewards_B.detach().double().flatten() / beta for s in scored_batches
          if s.rewards_B is not None]
    local = torch.cat(rs) if rs else torch.zeros(0, dtype=torch.float64)
    top = xdist.all_reduce_max(float(local.max()) if local.numel() else -math.inf)
    if top == -math.inf:
        return None
    total = xdist.all_reduce_sum(float(torch.exp(local - top).sum()))
    return RewardNorm(int(xdist.all_reduce_sum(int(local.numel()))), top + math.log(total))


def sample_weights(scored, beta: float, norm: RewardNorm | None):
    """Per-sample reward weights normalised over the step (``norm``: :func:`step_reward_norm`);
    None when off or the rollouts carry no rewards."""
    if beta <= 0 or scored.rewards_B is None or norm is None:
        return None
    return reward_weights(scored.rewards_B, beta, count=norm.count, log_norm=norm.log_norm)


def loss_and_backward(run, scored, timers, *, backward: bool = True) -> dict[str, float]:
    """:func:`scored_step` of one scored batch on its own: units counted over ranks, metrics
    reduced; returns them flat (``units/<name>``, ``<name>/loss``, ``loss``, ...)."""
    num_valid = all_reduce_counts(local_units(run.plan, scored.batch,
                                              stop_BTs=scored.stop_BTs))
    metrics = StepMetrics()
    scored_step(run, scored, num_valid, timers, metrics, backward=backward,
                reward_norm=step_reward_norm([scored], run.cfg.loss.reward_beta))
    return metrics.reduce(num_valid).flat()


def scored_step(run, scored, num_valid, timers, metrics, *, backward: bool = True,
                rows=None, reward_norm: RewardNorm | None = None) -> None:
    """Teachers, student forward, weighted on-policy losses and backward of one scored batch
    (:func:`xdistill.train.forward.teachers_and_student`: remote teachers compute while the
    student runs its forward); ``reward_norm``: the step's (:func:`step_reward_norm`)."""
    cfg, plan = run.cfg, run.plan

    def loss_of(logits, batch, results):
        outputs = {name: results[name].to(run.device) for name in plan.specs}
        weights = sample_weights(scored, cfg.loss.reward_beta, reward_norm)
        if weights is not None:
            weights = weights.to(run.device)
        with timers("loss"):
            stop = scored.stop_BTs.to(run.device) if scored.stop_BTs is not None else None
            ref = reference_logprobs(run, batch) if plan.needs_reference else None
            loss = onpolicy_losses(plan, logits, batch, outputs, num_valid, metrics,
                                   sample_weight_B=weights, stop_BTs=stop,
                                   behaviour_logp_BTs=scored.behaviour_logp_BTs.to(run.device),
                                   ref_logp_BTs=ref, rows=rows, chunk_size=cfg.loss.chunk_size)
        return loss, None

    teachers_and_student(run.model, run.mode.pool, scored.batch, timers, loss_of,
                         device=run.device, backward=backward)


@torch.no_grad()
def reference_logprobs(run, batch) -> torch.Tensor:
    """log q_init(y_i) of the sampled tokens at input positions (the frozen initial student kept
    by the mode for simple_opd's reference KL)."""
    logits = tokenizer_columns(student_logits(run.mode.reference, batch), run.plan.student_tok)
    return input_token_logprobs(logits.float(), batch.input_ids_BTs, batch.loss_mask_BTs)


def tokenizer_columns(logits_BTsV: torch.Tensor, student_tok) -> torch.Tensor:
    """The student's logits at its tokenizer's ids only: a padded vocabulary's extra columns are
    never sampled (the rollout engine suppresses them), so the policy they are scored under is
    the softmax over the tokenizer's ids."""
    V = int(student_tok.vocab_size)
    return logits_BTsV[..., :V] if logits_BTsV.shape[-1] > V else logits_BTsV


# ----------------------------------------------------------------------------- off-policy mixing
@dataclass
class OffPolicyMix:
    """Off-policy batches mixed into an on-policy run (``loss.offpolicy_lambda > 0``)."""

    # MultiTeacherLoss over the teachers' off-policy kinds (OnPolicyPlan.mix_specs)
    loss_fn: MultiTeacherLoss
    # weight of the student's own next-token CE on these batches (offpolicy.ce_weight)
    ce_weight: float
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


def mix_teacher_loss(t, same: bool) -> TeacherLossConfig:
    """Teacher ``t``'s off-policy loss on mixed-in batches: :func:`derived_offpolicy_kind`, its
    on-policy weight, temperature, projection and JSD beta, and the divergence direction of its
    on-policy kind (reverse for reverse_kl / strict_topk, jsd for jsd, else forward)."""
    tl = t.loss
    direction = {"reverse_kl": "reverse", "jsd": "jsd", "strict_topk": "reverse"}.get(
        tl.kind, "forward")
    return TeacherLossConfig(kind=derived_offpolicy_kind(t, same), weight=tl.weight,
                             temperature=tl.temperature, projection=tl.projection,
                             direction=direction, beta=tl.beta)


def mix_specs(cfg: OnPolicyConfig, plan: OnPolicyPlan) -> list:
    """The mixed-in batches' :class:`TeacherSpec` per teacher, checked against the tokenizer pair
    and worker output like an off-policy run's (:func:`setup.plan_offpolicy_teacher`; the
    on-policy plan's projection or shared vocabulary is reused when it has one)."""
    specs = []
    for t in cfg.teachers:
        tp = plan.teachers[t.name]
        _, spec = setup.plan_offpolicy_teacher(tp, mix_teacher_loss(t, tp.same_tokenizer),
                                               t.worker.output, plan.student_tok)
        specs.append(spec)
    return specs


def build_mix(cfg: OnPolicyConfig, plan: OnPolicyPlan, env) -> OffPolicyMix:
    """Loss and this rank's loader of the off-policy batches (:attr:`OnPolicyPlan.mix_specs`)."""
    loss_fn = MultiTeacherLoss(plan.mix_specs, weighting="static",
                               ce_weight=cfg.offpolicy.ce_weight, chunk_size=cfg.loss.chunk_size)
    loaders = setup.build_loaders(cfg.offpolicy.data, plan, env.rank, env.world_size,
                                  env.world_size)
    return OffPolicyMix(loss_fn, cfg.offpolicy.ce_weight, loaders)


def offpolicy_micro(run, batch, num_valid, timers, metrics) -> None:
    """One mixed-in off-policy micro-batch through :func:`xdistill.train.step.micro_step`."""
    mix = run.mode.mix
    report = micro_step(run.model, mix.loss_fn, run.mode.pool, batch, num_valid, timers,
                        device=run.device, ce_weight=mix.ce_weight)
    record_report(metrics, report)
    metrics.add(TOKENS, batch.stats.student_tokens)
