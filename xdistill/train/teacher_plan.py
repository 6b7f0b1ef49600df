"""The per-teacher plan both training modes share, decided before any model loads.

A :class:`TeacherPlan` is what a run knows of one teacher apart from its loss: its tokenizer,
whether that is the student's (same fingerprint), its resolved BOS setting and row limit, and --
when its loss or outputs need them -- the projection into the student vocabulary or the shared
vocabulary of identical token bytes. A mode's plan is a :class:`DistillPlan` (the student's
tokenizer and one :class:`TeacherPlan` per teacher, in config order) plus its loss specs:
:class:`xdistill.train.setup.Plan` off-policy, :class:`xdistill.train.onpolicy_step.OnPolicyPlan`
on-policy.

* tokenizers: ``student_tokenizer`` (or the student folder) and each teacher's ``tokenizer`` (or
  its model folder), :func:`load_tokenizer_for` (a failure names the config key);
* BOS: a teacher's tri-state ``add_bos`` resolved against its model's default
  (:func:`teacher_bos`, :mod:`xdistill.tokenization.bos`);
* projections: :func:`xdistill.projection.load_projection` refuses a matrix built for other
  tokenizers; the CSR arrays become a torch sparse ``proj_VsVt`` (:func:`load_projection_matrix`);
* shared vocabulary: pairs of text tokens whose bytes are identical in both
  :class:`TokenByteTable` (vectorised ``projection.methods.exact_pairs``), made one-to-one
  (:func:`shared_vocab`).

Legend: Vs/Vt student/teacher vocabularies, N shared vocabulary entries.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from xdistill.data.collator import TeacherTokenization
from xdistill.errors import ConfigError, ProjectionError
from xdistill.losses import projection_from_csr
from xdistill.tokenization import load_tokenizer
from xdistill.tokenization.bos import resolve_add_bos

if TYPE_CHECKING:
    from xdistill.tokenization.tokenizer import Tokenizer


@dataclass(frozen=True, eq=False)
class TeacherPlan:
    """One teacher as planned before compute (see the module doc)."""

    # teacher name (unique in the run; metrics <name>/...)
    name: str
    # its config key, "teachers.<i>" (errors name it)
    key: str
    # the teacher's tokenizer
    tokenizer: Tokenizer
    # True when its tokenizer fingerprint equals the student's
    same_tokenizer: bool
    # whether its rows start with its BOS (its add_bos, else its model's default)
    add_bos: bool
    # most teacher tokens per row (None: no limit)
    max_len: int | None = None
    # torch sparse CSR proj_VsVt [Vs, Vt] when its loss or outputs go through a projection
    projection: torch.Tensor | None = None
    # (student ids [N], teacher ids [N]) of one-to-one identical token bytes, when its loss
    # works on the shared vocabulary
    shared: tuple[torch.Tensor, torch.Tensor] | None = None

    def tokenization(self) -> TeacherTokenization:
        """The collator's and the rollout scorer's view of this teacher."""
        return TeacherTokenization(self.name, self.tokenizer, self.max_len, add_bos=self.add_bos)


@dataclass
class DistillPlan:
    """The student's tokenizer and every teacher's :class:`TeacherPlan` (what both modes' plans
    share; the core reads ``student_tok``)."""

    # the student's tokenizer
    student_tok: Tokenizer
    # teacher name -> its plan, in config order
    teachers: dict[str, TeacherPlan] = field(default_factory=dict)

    def tokenizations(self) -> list[TeacherTokenization]:
        """The teachers' tokenizations, in config order."""
        return [tp.tokenization() for tp in self.teachers.values()]

    def tokenizers(self) -> dict:
        """Teacher name -> tokenizer."""
        return {name: tp.tokenizer for name, tp in self.teachers.items()}

    def tokenizer_keys(self) -> dict[str, str]:
        """Teacher name -> the config key of its tokenizer (``teachers.<i>.tokenizer``)."""
        return {name: f"{tp.key}.tokenizer" for name, tp in self.teachers.items()}


def load_tokenizer_for(spec: str, fallback: str, key: str) -> Tokenizer:
    """The tokenizer ``spec`` names, else the one in the model folder ``fallback``; a missing or
    unloadable tokenizer is a :class:`ConfigError` naming ``key``."""
    source = spec or fallback
    if not source:
        raise ConfigError(f"{key}: no tokenizer given and no model folder to take it from")
    try:
        return load_tokenizer(source)
    except Exception as exc:
        raise ConfigError(f"{key}: cannot load tokenizer {source!r}: {exc}") from None


def load_student_tokenizer(cfg) -> Tokenizer:
    """The student's tokenizer: ``student_tokenizer``, else the ``student.path`` folder's."""
    return load_tokenizer_for(cfg.student_tokenizer, cfg.student.path, "student_tokenizer")


def teacher_bos(t, tok) -> bool:
    """Whether teacher ``t`` gets its BOS: its own ``add_bos`` setting, else its model's default
    (:mod:`xdistill.tokenization.bos`). An explicit ``add_bos: true`` for a tokenizer without a
    BOS is an error naming the teacher; one unlike the model's default is logged once."""
    return resolve_add_bos(t.add_bos, tok, f"teacher {t.name!r} add_bos")


def plan_teacher(t, index: int, student: Tokenizer) -> TeacherPlan:
    """Teacher ``t`` (``teachers.<index>`` of a run config, either mode): tokenizer, same-tokenizer
    flag, BOS and row limit; no projection or shared vocabulary yet (:func:`with_projection`,
    :func:`with_shared`)."""
    key = f"teachers.{index}"
    tok = load_tokenizer_for(t.tokenizer, t.worker.model, f"{key}.tokenizer")
    return TeacherPlan(t.name, key, tok, tok.fingerprint == student.fingerprint,
                       teacher_bos(t, tok), t.max_len)


def load_projection_matrix(path: str, key: str, student, teacher) -> torch.Tensor:
    """The projection artifact ``path`` as a torch sparse CSR ``proj_VsVt``; an artifact built for
    other tokenizers is a :class:`ConfigError` naming ``key``."""
    # deferred: scipy via xdistill.projection (only a projection artifact needs it)
    from xdistill.projection import load_projection

    try:
        proj = load_projection(path, student, teacher)
    except ProjectionError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    m = proj.proj_VsVt
    return projection_from_csr(m.indptr, m.indices, m.data, m.shape)


def with_projection(tp: TeacherPlan, path: str, student, needed_by: str) -> TeacherPlan:
    """``tp`` with its projection (loaded from ``path`` unless it has one already); no ``path``
    is an error naming ``<key>.loss.projection`` and saying what needs it (``needed_by``)."""
    if tp.projection is not None:
        return tp
    key = f"{tp.key}.loss.projection"
    if not path:
        raise ConfigError(f"{key}: {needed_by}")
    return replace(tp, projection=load_projection_matrix(path, key, student, tp.tokenizer))


def shared_vocab(student, teacher) -> tuple[torch.Tensor, torch.Tensor]:
    """One-to-one (student id, teacher id) pairs of identical token bytes, int64 [N] each."""
    # deferred: scipy via xdistill.projection (only exact cross losses need it)
    from xdistill.projection.methods import exact_pairs

    s_N, t_N = exact_pairs(student, teacher)
    s_N, t_N = np.asarray(s_N, dtype=np.int64), np.asarray(t_N, dtype=np.int64)
    _, first = np.unique(t_N, return_index=True)  # a teacher id may be matched by several rows
    keep = np.sort(first)
    return torch.from_numpy(s_N[keep].copy()), torch.from_numpy(t_N[keep].copy())


def with_shared(tp: TeacherPlan, student, needed_by: str, remedy: str = "") -> TeacherPlan:
    """``tp`` with its shared vocabulary (unless it has one already); an empty one is an error
    naming the teacher's key, what needs it (``needed_by``) and what to do (``remedy``)."""
    if tp.shared is not None:
        return tp
    s_N, t_N = shared_vocab(student, tp.tokenizer)
    if s_N.numel() == 0:
        raise ConfigError(f"{tp.key}: {needed_by}, but no token has identical bytes in "
                          f"{student.name!r} and {tp.tokenizer.name!r}"
                          + (f"; {remedy}" if remedy else ""))
    return replace(tp, shared=(s_N, t_N))


def resolve_student_bos(cfg, student_tok, key: str) -> None:
    """The student's tri-state ``<key>.add_bos`` of ``cfg`` (``key`` a dotted section, e.g.
    ``data`` or ``offpolicy.data``) resolved in place against its model's default."""
    section = cfg
    for part in key.split("."):
        section = getattr(section, part)
    section.add_bos = resolve_add_bos(section.add_bos, student_tok, f"{key}.add_bos")


def resolve_bos_settings(cfg, plan: DistillPlan, student_key: str = "data") -> None:
    """Every tri-state ``add_bos`` of ``cfg`` (the student's ``<student_key>.add_bos`` and each
    teacher's, as its :class:`TeacherPlan` resolved it) written back, once, before anything
    reads them."""
    resolve_student_bos(cfg, plan.student_tok, student_key)
    for t in cfg.teachers:
        t.add_bos = plan.teachers[t.name].add_bos
