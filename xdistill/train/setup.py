"""Build the off-policy run's components from a validated :class:`OffPolicyConfig`.

Order matters: everything that can fail on a bad config (tokenizers, projection pairs, loss kinds
vs tokenizer pairs) is checked in :func:`build_plan` before any model is loaded or any step runs.

* tokenizers: ``student_tokenizer`` (or the student folder) and each teacher's ``tokenizer`` (or
  its model folder);
* a teacher is *same-tokenizer* when its tokenizer fingerprint equals the student's; same-tokenizer
  losses (forward_kl, reverse_kl, jsd, topk_kl) need that; cross-tokenizer losses work for either
  (a same-tokenizer teacher then gets the collator's identity alignment);
* ``pkl`` projections: :func:`xdistill.projection.load_projection` refuses a matrix built for other
  tokenizers; the CSR arrays become a torch sparse ``proj_VsVt`` (``losses.projection_from_csr``);
* ``exact_kl`` / ``gold``: the shared vocabulary = pairs of text tokens whose bytes are identical
  in both :class:`TokenByteTable` (vectorised ``projection.methods.exact_pairs``), made one-to-one.

Legend: Vs/Vt student/teacher vocabularies, N shared vocabulary entries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from xdistill.data.collator import TeacherTokenization
from xdistill.errors import ConfigError, ProjectionError
from xdistill.log import get_logger
from xdistill.losses import ContinuationTrie, MultiTeacherLoss, TeacherSpec, projection_from_csr
from xdistill.losses.multi_teacher import SAME_TOKENIZER_LOSSES
from xdistill.tokenization.bos import resolve_add_bos
from xdistill.train.config import OffPolicyConfig, TeacherRunConfig

if TYPE_CHECKING:
    from xdistill.tokenization.tokenizer import Tokenizer

log = get_logger("train")


@dataclass
class Plan:
    """Everything decided before compute: tokenizers, which teachers share the student's
    tokenizer, projections and the loss-side teacher specs."""

    # the student's tokenizer
    student_tok: Tokenizer
    # teacher name -> its tokenizer
    teacher_toks: dict
    # teacher name -> True when its tokenizer fingerprint equals the student's
    same_tok: dict
    # teacher name -> torch sparse CSR proj_VsVt (pkl losses and projected outputs)
    projections: dict = field(default_factory=dict)
    # loss-side specs, in config order
    loss_specs: list = field(default_factory=list)


def _load_tok(spec: str, fallback: str, key: str):
    from xdistill.tokenization import load_tokenizer

    source = spec or fallback
    if not source:
        raise ConfigError(f"{key}: no tokenizer given and no model folder to take it from")
    try:
        return load_tokenizer(source)
    except Exception as exc:
        raise ConfigError(f"{key}: cannot load tokenizer {source!r}: {exc}") from None


def shared_vocab(student, teacher) -> tuple[torch.Tensor, torch.Tensor]:
    """One-to-one (student id, teacher id) pairs of identical token bytes, int64 [N] each."""
    from xdistill.projection.methods import exact_pairs

    s_N, t_N = exact_pairs(student, teacher)
    s_N, t_N = np.asarray(s_N, dtype=np.int64), np.asarray(t_N, dtype=np.int64)
    _, first = np.unique(t_N, return_index=True)  # a teacher id may be matched by several rows
    keep = np.sort(first)
    return torch.from_numpy(s_N[keep].copy()), torch.from_numpy(t_N[keep].copy())


def _projection(t: TeacherRunConfig, key: str, student, teacher) -> torch.Tensor:
    from xdistill.projection import load_projection

    try:
        proj = load_projection(t.loss.projection, student, teacher)
    except ProjectionError as exc:
        raise ConfigError(f"{key}.loss.projection: {exc}") from None
    m = proj.proj_VsVt
    return projection_from_csr(m.indptr, m.indices, m.data, m.shape)


def continuation_trie(student, teacher) -> ContinuationTrie:
    """The student tokens' teacher pieces as a trie (``loss.continuation``)."""
    from xdistill.projection.methods import continuation_pieces

    return ContinuationTrie.from_pieces(continuation_pieces(student, teacher),
                                        teacher.table.vocab_size)


def _loss_spec(t: TeacherRunConfig, proj, shared, trie=None) -> TeacherSpec:
    lc = t.loss
    kw = {"continuation": trie}
    if shared is not None:
        kw.update(shared_s_idx_N=shared[0], shared_t_idx_N=shared[1])
    return TeacherSpec(name=t.name, loss=lc.kind, weight=lc.weight, temperature=lc.temperature,
                       projection=proj if lc.kind == "pkl" else None, direction=lc.direction,
                       beta=lc.beta, alm_variant=lc.alm_variant, alm_temperature=lc.alm_temperature,
                       common_weight=lc.common_weight, uncommon_weight=lc.uncommon_weight, **kw)


def build_plan(cfg: OffPolicyConfig) -> Plan:
    """Load tokenizers and projections and check every teacher/loss pairing (no model loads)."""
    student = _load_tok(cfg.student_tokenizer, cfg.student.path, "student_tokenizer")
    plan = Plan(student, {}, {})
    for i, t in enumerate(cfg.teachers):
        key = f"teachers.{i}"
        tok = _load_tok(t.tokenizer, t.worker.model, f"{key}.tokenizer")
        plan.teacher_toks[t.name] = tok
        same = tok.fingerprint == student.fingerprint
        plan.same_tok[t.name] = same
        if t.loss.kind in SAME_TOKENIZER_LOSSES and not same:
            raise ConfigError(
                f"{key}.loss.kind: {t.loss.kind!r} needs the student's tokenizer, but teacher "
                f"{t.name!r} uses {tok.name!r} and the student {student.name!r}; use a "
                "cross-tokenizer loss (pkl, alm, uld, gold, exact_kl)")
        proj = None
        if t.loss.kind == "pkl" or t.worker.output == "projected":
            if not t.loss.projection:
                raise ConfigError(f"{key}.loss.projection: needed by loss 'pkl' / output 'projected'")
            proj = _projection(t, key, student, tok)
            plan.projections[t.name] = proj
        shared = shared_vocab(student, tok) if t.loss.kind in ("exact_kl", "gold") else None
        if shared is not None and shared[0].numel() == 0:
            raise ConfigError(f"{key}: loss {t.loss.kind!r} found no token with identical bytes in "
                              f"{student.name!r} and {tok.name!r}")
        if t.worker.output == "topk" and t.loss.kind not in ("topk_kl",):
            raise ConfigError(f"{key}.worker.output: 'topk' outputs only feed loss 'topk_kl'")
        if t.worker.output == "projected" and t.loss.kind != "pkl":
            raise ConfigError(f"{key}.worker.output: 'projected' outputs only feed loss 'pkl'")
        trie = continuation_trie(student, tok) if t.loss.continuation else None
        plan.loss_specs.append(_loss_spec(t, proj, shared, trie))
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


def collator_teachers(cfg: OffPolicyConfig, plan: Plan) -> list[TeacherTokenization]:
    """The collator's view of the teachers (tokenizer, max_len, BOS per :func:`teacher_bos`)."""
    return [TeacherTokenization(t.name, plan.teacher_toks[t.name], t.max_len,
                            add_bos=teacher_bos(t, plan.teacher_toks[t.name]))
            for t in cfg.teachers]


def teacher_bos(t, tok) -> bool:
    """Whether teacher ``t`` gets its BOS: its own ``add_bos`` setting, else its model's default
    (:mod:`xdistill.tokenization.bos`). An explicit ``add_bos: true`` for a tokenizer without a
    BOS is an error naming the teacher; one unlike the model's default is logged once."""
    return resolve_add_bos(t.add_bos, tok, f"teacher {t.name!r} add_bos")


def resolve_bos_settings(cfg, plan, student_key: str = "data") -> None:
    """Every tri-state ``add_bos`` of ``cfg`` (the student's ``<student_key>.add_bos`` and each
    teacher's) resolved in place against its model's default, once, before anything uses them."""
    section = getattr(cfg, student_key)
    section.add_bos = resolve_add_bos(section.add_bos, plan.student_tok,
                                      f"{student_key}.add_bos")
    for t in cfg.teachers:
        t.add_bos = teacher_bos(t, plan.teacher_toks[t.name])


def build_pool(cfg: OffPolicyConfig, plan: Plan):
    """A started-on-enter :class:`TeacherPool` (None without teachers)."""
    from xdistill.teacher import TeacherPool

    if not cfg.teachers:
        return None
    projections = {t.name: plan.projections[t.name] for t in cfg.teachers
                   if t.worker.output == "projected"}
    for i, t in enumerate(cfg.teachers):
        if t.worker.cache_mb > 0 and cfg.data.shuffle:
            log.warning("teachers.%d.worker.cache_mb: data.shuffle is true, so every epoch packs "
                        "other windows and the teacher output cache will rarely hit (set "
                        "data.shuffle: false to reuse teacher outputs across epochs)", i)
    return TeacherPool([t.worker for t in cfg.teachers], projections=projections)


def build_loaders(cfg: OffPolicyConfig, plan: Plan, rank: int, world: int, shards: int,
                  data=None, paths=None) -> list:
    """One resumable loader per data shard owned by this process (shards ``rank*k .. rank*k+k-1``
    with ``k = shards / world``)."""
    from dataclasses import replace

    from xdistill.data import build_loader

    data = data or cfg.data
    if paths is not None:
        data = replace(data, paths=list(paths))
    per = shards // world
    teachers = collator_teachers(cfg, plan)
    return [build_loader(data, plan.student_tok, teachers, rank=rank * per + j, world_size=shards)
            for j in range(per)]

