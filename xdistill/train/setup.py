"""Build the off-policy run's components from a validated :class:`OffPolicyConfig`.

Order matters: everything that can fail on a bad config (tokenizers, projection pairs, loss kinds
vs tokenizer pairs) is checked in :func:`build_plan` before any model is loaded or any step runs.
Tokenizers, same-tokenizer flags, BOS settings, projections and shared vocabularies are the
per-teacher plan both modes share (:mod:`xdistill.train.teacher_plan`); this module adds the
off-policy loss of each teacher (:func:`plan_offpolicy_teacher`, also used by the on-policy
mode's mixed-in off-policy batches):

* a teacher is *same-tokenizer* when its tokenizer fingerprint equals the student's; same-tokenizer
  losses (forward_kl, reverse_kl, jsd, topk_kl) need that; cross-tokenizer losses work for either
  (a same-tokenizer teacher then gets the collator's identity alignment);
* ``pkl`` losses and ``projected`` outputs need the teacher's projection; ``exact_kl`` / ``gold``
  its shared vocabulary (identical token bytes, one-to-one).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from xdistill.data import build_loader
from xdistill.errors import ConfigError
from xdistill.log import get_logger, log0
from xdistill.losses import ContinuationTrie, MultiTeacherLoss, TeacherSpec
from xdistill.losses.multi_teacher import SAME_TOKENIZER_LOSSES
from xdistill.teacher import TeacherPool
from xdistill.train.config import OffPolicyConfig, TeacherLossConfig
from xdistill.train.teacher_plan import (DistillPlan, TeacherPlan, load_student_tokenizer,
                                         plan_teacher, resolve_bos_settings, with_projection,
                                         with_shared)

log = get_logger("train")


@dataclass
class Plan(DistillPlan):
    """Everything decided before compute: the student's and teachers' plans
    (:class:`DistillPlan`) and the loss-side teacher specs."""

    # loss-side specs, in config order
    loss_specs: list = field(default_factory=list)


def continuation_trie(student, teacher) -> ContinuationTrie:
    """The student tokens' teacher pieces as a trie (``loss.continuation``)."""
    # deferred: scipy via xdistill.projection (only loss.continuation needs it)
    from xdistill.projection.methods import continuation_pieces

    return ContinuationTrie.from_pieces(continuation_pieces(student, teacher),
                                        teacher.table.vocab_size)


def loss_spec(tp: TeacherPlan, lc: TeacherLossConfig, trie=None) -> TeacherSpec:
    """The :class:`TeacherSpec` of teacher ``tp`` with off-policy loss ``lc``."""
    kw = {"continuation": trie}
    if tp.shared is not None and lc.kind in ("exact_kl", "gold"):
        kw.update(shared_s_idx_N=tp.shared[0], shared_t_idx_N=tp.shared[1])
    return TeacherSpec(name=tp.name, loss=lc.kind, weight=lc.weight, temperature=lc.temperature,
                       projection=tp.projection if lc.kind == "pkl" else None,
                       direction=lc.direction, beta=lc.beta, alm_variant=lc.alm_variant,
                       alm_temperature=lc.alm_temperature, common_weight=lc.common_weight,
                       uncommon_weight=lc.uncommon_weight, **kw)


def plan_offpolicy_teacher(tp: TeacherPlan, lc: TeacherLossConfig, output: str,
                           student) -> tuple[TeacherPlan, TeacherSpec]:
    """Check teacher ``tp``'s off-policy loss ``lc`` against its tokenizer pair and its worker's
    ``output`` kind; returns ``tp`` with what the loss needs (projection, shared vocabulary) and
    the loss spec. Errors name the teacher's config key."""
    key, kind = tp.key, lc.kind
    if kind in SAME_TOKENIZER_LOSSES and not tp.same_tokenizer:
        raise ConfigError(
            f"{key}.loss.kind: {kind!r} needs the student's tokenizer, but teacher "
            f"{tp.name!r} uses {tp.tokenizer.name!r} and the student {student.name!r}; use a "
            "cross-tokenizer loss (pkl, alm, uld, gold, exact_kl)")
    if kind == "pkl" or output == "projected":
        tp = with_projection(tp, lc.projection, student,
                             "needed by loss 'pkl' / output 'projected'")
    if kind in ("exact_kl", "gold"):
        tp = with_shared(tp, student, f"loss {kind!r} works on the shared vocabulary")
    if output == "topk" and kind not in ("topk_kl",):
        raise ConfigError(f"{key}.worker.output: 'topk' outputs only feed loss 'topk_kl'")
    if output == "projected" and kind != "pkl":
        raise ConfigError(f"{key}.worker.output: 'projected' outputs only feed loss 'pkl'")
    trie = continuation_trie(student, tp.tokenizer) if lc.continuation else None
    return tp, loss_spec(tp, lc, trie)


def build_plan(cfg: OffPolicyConfig) -> Plan:
    """Load tokenizers and projections and check every teacher/loss pairing (no model loads)."""
    student = load_student_tokenizer(cfg)
    plan = Plan(student)
    for i, t in enumerate(cfg.teachers):
        tp, spec = plan_offpolicy_teacher(plan_teacher(t, i, student), t.loss, t.worker.output,
                                          student)
        plan.teachers[t.name] = tp
        plan.loss_specs.append(spec)
    resolve_bos_settings(cfg, plan)
    return plan


def build_loss(cfg: OffPolicyConfig, plan: Plan) -> MultiTeacherLoss | None:
    """The multi-teacher loss (None for a CE-only run without teachers)."""
    if not plan.loss_specs:
        return None
    lc = cfg.loss
    return MultiTeacherLoss(plan.loss_specs, weighting=lc.weighting, score=lc.score, alpha=lc.alpha,
                            ce_weight=lc.ce_weight, chunk_size=lc.chunk_size,
                            label_smoothing=lc.label_smoothing)


def build_pool(cfg: OffPolicyConfig, plan: Plan):
    """A started-on-enter :class:`TeacherPool` (None without teachers)."""
    if not cfg.teachers:
        return None
    projections = {t.name: plan.teachers[t.name].projection for t in cfg.teachers
                   if t.worker.output in ("projected", "support")}
    for i, t in enumerate(cfg.teachers):
        if t.worker.cache_mb > 0 and cfg.data.shuffle:
            log0("teachers.%d.worker.cache_mb: data.shuffle is true, so every epoch packs "
                 "other windows and the teacher output cache will rarely hit (set "
                 "data.shuffle: false to reuse teacher outputs across epochs)", i,
                 level=logging.WARNING, logger=log)
    return TeacherPool([t.worker for t in cfg.teachers], projections=projections)


def build_loaders(data, plan: DistillPlan, rank: int, world: int, shards: int,
                  paths=None) -> list:
    """One resumable loader of ``data`` (a :class:`DataConfig`; ``paths`` replace its paths) per
    data shard owned by this process (shards ``rank*k .. rank*k+k-1`` with ``k = shards /
    world``), collated for the plan's teachers."""
    if paths is not None:
        data = replace(data, paths=list(paths))
    per = shards // world
    teachers = plan.tokenizations()
    return [build_loader(data, plan.student_tok, teachers, rank=rank * per + j, world_size=shards)
            for j in range(per)]
