"""Several teachers, each with its own loss, in one call: ``L = sum_i w_i L_i + lambda * CE``.

Legend: B batch, Ts/Tt student/teacher tokens, Vs/Vt vocabularies, K top-k, C chunks, N shared
vocabulary entries.

Weighting modes (weights are constants for the backward pass):

* ``"static"``: ``w_i = spec.weight``;
* ``"dynamic"``: ``w = softmax(alpha * score + log(spec.weight))`` over the teachers, per batch,
  i.e. ``w_i ∝ spec.weight_i * exp(alpha * score_i)`` (plain ``softmax(alpha * score)`` when all
  weights are 1); the weights sum to 1;
* ``"pick_best"``: weight 1 for the teacher with the highest score (the first on ties), 0 others.

In both score-based modes a teacher with no scored positions in the batch (its score is NaN: a
cross-tokenizer teacher with no loss chunks there) gets weight 0 and does not compete (a score of 0
would win: real ``neg_ce``/``neg_entropy`` scores are negative); when no teacher can be weighted
(none has positions, or every one left has prior weight 0 in ``"dynamic"``) all weights are 0.

Scores (per teacher, a batch mean over the teacher's scored positions: the loss tokens of a
same-tokenizer teacher, the teacher tokens of its loss chunks otherwise):
``"neg_ce"`` = mean ``log q(t_j)`` of the actual text (higher = the teacher finds the text more
likely), ``"neg_entropy"`` = mean ``-H(q_j)``, ``"confidence"`` = mean ``max_v q_j(v)``. From top-k
outputs the CE uses the tail log-mass for tokens outside the top-k (an upper bound on their
probability) and the entropy is that of the top-k + tail-bucket distribution (a lower bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from xdistill.losses.alm import alm as _alm_loss
from xdistill.losses import cross as _cross
from xdistill.losses import divergences as _div
from xdistill.losses.uld import gold_hybrid as _gold_hybrid
from xdistill.losses.uld import uld as _uld_loss
from xdistill.losses.chunks import ChunkAlignment
from xdistill.losses.continuation import ContinuationTrie, continuation_kl
from xdistill.losses.engine import DEFAULT_CHUNK_SIZE
from xdistill.losses.scores import coverage, loss_units, teacher_score

SAME_TOKENIZER_LOSSES = ("forward_kl", "reverse_kl", "jsd", "topk_kl")
CROSS_TOKENIZER_LOSSES = ("exact_kl", "pkl", "uld", "gold", "alm")
WEIGHTINGS = ("static", "dynamic", "pick_best")
SCORES = ("neg_ce", "neg_entropy", "confidence")


@dataclass(frozen=True)
class TeacherSpec:
    """How one teacher enters the loss."""

    # teacher name (matches TeacherLossInput.name)
    name: str
    # one of SAME_TOKENIZER_LOSSES + CROSS_TOKENIZER_LOSSES
    loss: str
    # static weight (prior weight in "dynamic" mode)
    weight: float = 1.0
    # softmax temperature of the loss (tau, both sides; tau^2 scaling on KL terms)
    temperature: float = 1.0
    # sparse proj_VsVt for "pkl" (see projection_from_csr)
    projection: torch.Tensor | None = None
    # "pkl" only: add the continuation KL inside multi-piece student tokens (ContinuationTrie of
    # this tokenizer pair, see xdistill.losses.continuation); None = chunk starts only
    continuation: ContinuationTrie | None = None
    # identical-bytes vocabulary map for "exact_kl" / "gold": student ids and teacher ids, [N]
    shared_s_idx_N: torch.Tensor | None = None
    shared_t_idx_N: torch.Tensor | None = None
    # divergence for KL-type cross losses: "forward" | "reverse" | "jsd"
    direction: str = "forward"
    # JSD beta ("jsd" loss, or direction "jsd")
    beta: float = 0.5
    # ALM: "bce" | "abs" and its likelihood temperature
    alm_variant: str = "bce"
    alm_temperature: float = 100.0
    # GOLD: weights of the shared-vocabulary KL and of the sorted L1 on the rest
    common_weight: float = 1.0
    uncommon_weight: float = 1.0

    def __post_init__(self):
        if self.loss not in SAME_TOKENIZER_LOSSES + CROSS_TOKENIZER_LOSSES:
            raise ValueError(f"teacher {self.name!r}: unknown loss {self.loss!r}; allowed: "
                             f"{SAME_TOKENIZER_LOSSES + CROSS_TOKENIZER_LOSSES}")
        if self.loss == "pkl" and self.projection is None:
            raise ValueError(f"teacher {self.name!r}: loss 'pkl' needs a projection")
        if self.continuation is not None and (self.loss != "pkl" or self.direction != "forward"):
            raise ValueError(f"teacher {self.name!r}: the continuation KL extends loss 'pkl' "
                             f"with direction 'forward' (got {self.loss!r}, {self.direction!r})")
        if self.loss in ("exact_kl", "gold") and (self.shared_s_idx_N is None
                                                  or self.shared_t_idx_N is None):
            raise ValueError(f"teacher {self.name!r}: loss {self.loss!r} needs shared_s_idx_N "
                             "and shared_t_idx_N")
        if self.temperature <= 0 or self.weight < 0:
            raise ValueError(f"teacher {self.name!r}: temperature must be > 0 and weight >= 0")


@dataclass(frozen=True)
class TeacherLossInput:
    """One teacher's outputs for a batch plus its alignment (plain tensors only)."""

    # teacher name (matches TeacherSpec.name)
    name: str
    # teacher logits divided by ``temperature`` (outputs at input positions), [B, Tt, Vt]
    logits_BTtV: torch.Tensor | None = None
    # top-K log-probs at ``temperature`` and their ids, [B, Tt, K]
    topk_logp_BTtK: torch.Tensor | None = None
    topk_idx_BTtK: torch.Tensor | None = None
    # log-mass outside the top-K at ``temperature`` (accurate for tiny tails), [B, Tt]
    tail_logmass_BTt: torch.Tensor | None = None
    # teacher distribution already projected into student space (log), [B, Tt, Vs]
    proj_logp_BTtVs: torch.Tensor | None = None
    # teacher logits / ``temperature`` at the projection's support columns only, [B, Tt, S]
    support_logits_BTtS: torch.Tensor | None = None
    # log p_T(t_j | t_<j) at input positions (ALM, CE score), [B, Tt]
    token_logp_BTt: torch.Tensor | None = None
    # teacher token ids (None for a same-tokenizer teacher: the student ids), [B, Tt]
    input_ids_BTt: torch.Tensor | None = None
    # True on teacher tokens whose prediction is distilled, [B, Tt]
    loss_mask_BTt: torch.Tensor | None = None
    # chunk alignment to the student; None = same tokenizer (identity)
    alignment: ChunkAlignment | None = None
    # temperature the outputs above were taken at (the teacher worker's T)
    temperature: float = 1.0


@dataclass(frozen=True)
class TeacherReport:
    """What one teacher contributed to a loss call (detached values)."""

    # its loss term L_i, normalised by its unit count (0 when its weight is 0), 0-dim tensor
    loss: torch.Tensor
    # its weight w_i in this call
    weight: float
    # fraction of student loss tokens its loss covers, 0-dim float64 tensor
    coverage: torch.Tensor
    # its batch score (dynamic / pick_best weighting), else None
    score: torch.Tensor | None = None


@dataclass(frozen=True)
class LossReport:
    """Typed metrics of one :class:`MultiTeacherLoss` call (values detached, on the logits'
    device: nothing is synchronised with the host here; the trainer records them as typed step
    metrics, ``xdistill.train.step.record_report``, and reduces them once per step)."""

    # the weighted total (detached)
    total: torch.Tensor
    # the CE term before its weight, or None without CE
    ce: torch.Tensor | None
    # teacher name -> its report, in spec order
    teachers: dict[str, TeacherReport] = field(default_factory=dict)


def _teacher_tau(spec: TeacherSpec, inp: TeacherLossInput) -> float:
    """Extra division of ``inp.logits_BTtV`` (= z / T) needed to reach ``z / spec.temperature``."""
    return spec.temperature / inp.temperature


def _check_pretempered(spec: TeacherSpec, inp: TeacherLossInput, what: str) -> None:
    if not math.isclose(spec.temperature, inp.temperature, rel_tol=1e-6):
        raise ValueError(f"teacher {spec.name!r}: {what} outputs were taken at temperature "
                         f"{inp.temperature} but the loss asks for {spec.temperature}; they "
                         "cannot be re-tempered (set the teacher's temperature to the loss's)")


def _need(inp: TeacherLossInput, field: str, spec: TeacherSpec):
    value = getattr(inp, field)
    if value is None:
        raise ValueError(f"teacher {spec.name!r}: loss {spec.loss!r} needs {field}")
    return value


def _same_tok_loss(spec, inp, s_logits, s_mask, num_valid, chunk_size):
    kw = dict(temperature=spec.temperature, num_valid=num_valid, chunk_size=chunk_size)
    if spec.loss == "topk_kl":
        _check_pretempered(spec, inp, "top-k")
        return _div.topk_forward_kl(s_logits, _need(inp, "topk_logp_BTtK", spec),
                                    _need(inp, "topk_idx_BTtK", spec), s_mask,
                                    teacher_tail_logmass_BT=inp.tail_logmass_BTt, **kw)
    t_logits = _need(inp, "logits_BTtV", spec)
    kw["teacher_temperature"] = _teacher_tau(spec, inp)
    if spec.loss == "forward_kl":
        return _div.forward_kl(s_logits, t_logits, s_mask, **kw)
    if spec.loss == "reverse_kl":
        return _div.reverse_kl(s_logits, t_logits, s_mask, **kw)
    return _div.jsd(s_logits, t_logits, s_mask, beta=spec.beta, **kw)


def _cross_loss(spec, inp, s_logits, s_ids, s_mask, num_valid, chunk_size):
    align = _need(inp, "alignment", spec)
    kw = dict(s_loss_mask_BTs=s_mask, t_loss_mask_BTt=inp.loss_mask_BTt,
              temperature=spec.temperature, num_valid=num_valid, chunk_size=chunk_size)
    if spec.loss == "alm":
        token_logp = inp.token_logp_BTt  # taken at the worker's temperature
        if token_logp is not None and not math.isclose(spec.temperature, inp.temperature,
                                                       rel_tol=1e-6):
            if inp.logits_BTtV is None:
                _check_pretempered(spec, inp, "token log-prob")  # raises: nothing to re-temper
            token_logp = None                                  # recomputed from the logits
        logits = inp.logits_BTtV if token_logp is None else None
        return _alm_loss(s_logits, s_ids, align, teacher_logits_BTtVt=logits,
                        teacher_ids_BTt=inp.input_ids_BTt, teacher_token_logp_BTt=token_logp,
                        variant=spec.alm_variant, alm_temperature=spec.alm_temperature,
                        teacher_temperature=_teacher_tau(spec, inp), **kw)
    if spec.loss == "pkl" and inp.logits_BTtV is None and inp.proj_logp_BTtVs is not None:
        _check_pretempered(spec, inp, "projected")
        if spec.continuation is not None:
            raise ValueError(f"teacher {spec.name!r}: the continuation KL needs teacher logits, "
                             "not outputs already projected to the student vocabulary")
        return _cross.student_space_kl(s_logits, inp.proj_logp_BTtVs, align,
                                       direction=spec.direction, beta=spec.beta, **kw)
    if spec.loss == "pkl" and inp.logits_BTtV is None and inp.support_logits_BTtS is not None:
        if spec.continuation is not None:
            raise ValueError(f"teacher {spec.name!r}: the continuation KL needs teacher logits, "
                             "not only the projection's support columns")
        return _cross.projected_kl(s_logits, inp.support_logits_BTtS, align, spec.projection,
                                   direction=spec.direction, beta=spec.beta,
                                   teacher_temperature=_teacher_tau(spec, inp),
                                   teacher_on_support=True, **kw)
    t_logits = _need(inp, "logits_BTtV", spec)
    kw["teacher_temperature"] = _teacher_tau(spec, inp)
    if spec.loss == "pkl":
        loss = _cross.projected_kl(s_logits, t_logits, align, spec.projection,
                                   direction=spec.direction, beta=spec.beta, **kw)
        if spec.continuation is None:
            return loss
        trie = spec.continuation.to(s_logits.device)
        return loss + continuation_kl(s_logits, t_logits, align, trie, s_ids,
                                      _need(inp, "input_ids_BTt", spec), **kw)
    if spec.loss == "exact_kl":
        return _cross.exact_kl(s_logits, t_logits, align, spec.shared_s_idx_N, spec.shared_t_idx_N,
                               direction=spec.direction, beta=spec.beta, **kw)
    if spec.loss == "uld":
        return _uld_loss(s_logits, t_logits, align, **kw)
    return _gold_hybrid(s_logits, t_logits, align, spec.shared_s_idx_N, spec.shared_t_idx_N,
                            direction=spec.direction, beta=spec.beta,
                            common_weight=spec.common_weight,
                            uncommon_weight=spec.uncommon_weight, **kw)


class MultiTeacherLoss:
    """``loss, report = MultiTeacherLoss(specs, ...)(student_logits, ids, mask, teachers)``.

    Teachers may mix tokenizers: a :class:`TeacherLossInput` without ``alignment`` is a
    same-tokenizer teacher, one with it is scored over aligned chunks. ``num_valid`` maps teacher
    name (and ``"ce"``) to the trainer's global count of loss units (tokens for same-tokenizer
    losses, loss chunks for cross-tokenizer ones); :meth:`count_valid` gives the local counts to
    all-reduce. The second result is a :class:`LossReport` (per teacher: loss term, weight,
    coverage = fraction of student loss tokens its loss covers, score when scores are used; plus
    the CE term and the total), detached tensors on the logits' device.
    """

    def __init__(self, specs, *, weighting: str = "static", score: str = "neg_ce",
                 alpha: float = 1.0, ce_weight: float = 0.0,
                 chunk_size: int | None = DEFAULT_CHUNK_SIZE, label_smoothing: float = 0.0):
        self.specs = tuple(specs)
        names = [s.name for s in self.specs]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"need at least one teacher spec with distinct names, got {names}")
        if weighting not in WEIGHTINGS:
            raise ValueError(f"unknown weighting {weighting!r}; allowed: {WEIGHTINGS}")
        if score not in SCORES:
            raise ValueError(f"unknown score {score!r}; allowed: {SCORES}")
        self.weighting, self.score, self.alpha = weighting, score, float(alpha)
        self.ce_weight, self.chunk_size = float(ce_weight), chunk_size
        self.label_smoothing = float(label_smoothing)

    def _inputs(self, teachers) -> list[TeacherLossInput]:
        by_name = {t.name: t for t in teachers}
        missing = [s.name for s in self.specs if s.name not in by_name]
        if missing:
            raise ValueError(f"no teacher outputs for {missing}; got {sorted(by_name)}")
        for spec in self.specs:
            inp = by_name[spec.name]
            if (spec.loss in CROSS_TOKENIZER_LOSSES) != (inp.alignment is not None):
                raise ValueError(f"teacher {spec.name!r}: loss {spec.loss!r} "
                                 f"{'needs' if inp.alignment is None else 'takes no'} alignment")
        return [by_name[s.name] for s in self.specs]

    def count_valid(self, teachers, student_loss_mask_BTs, labels_BTs=None) -> dict[str, int]:
        """Local loss-unit counts per teacher name (and ``"ce"``), to sum over ranks/micro-batches."""
        out = {spec.name: loss_units(inp, student_loss_mask_BTs, spec.loss == "exact_kl")
               for spec, inp in zip(self.specs, self._inputs(teachers))}
        if labels_BTs is not None:
            out["ce"] = int((labels_BTs[:, 1:] >= 0).sum())
        return out

    def weights(self, scores: list[torch.Tensor] | None) -> torch.Tensor:
        """The teacher weights for this batch (module doc), float32 [num teachers]."""
        prior = torch.tensor([s.weight for s in self.specs], dtype=torch.float32)
        if self.weighting == "static":
            return prior
        s = torch.stack([x.float().cpu() for x in scores])
        absent = torch.isnan(s)  # no scored positions in this batch: no weight, no competition
        if self.weighting == "dynamic":
            # alpha 0 means the priors alone (0 * a -inf score would be NaN)
            scaled = torch.zeros_like(s) if self.alpha == 0 else self.alpha * s
            logits = (scaled + torch.log(prior)).masked_fill(absent, -math.inf)
            if bool(torch.isneginf(logits).all()):
                return torch.zeros_like(prior)
            return torch.softmax(logits, dim=0)
        w = torch.zeros_like(s)
        if not bool(absent.all()):
            w[int(torch.argmax(s.masked_fill(absent, -math.inf)))] = 1.0
        return w

    def __call__(self, student_logits_BTsVs, student_ids_BTs, student_loss_mask_BTs, teachers, *,
                 labels_BTs=None, num_valid: dict | None = None):
        inputs = self._inputs(teachers)
        num_valid = num_valid or {}
        scores = None
        if self.weighting != "static":
            scores = [teacher_score(inp, self.score, student_ids_BTs, student_loss_mask_BTs,
                                    self.chunk_size, spec.loss == "exact_kl")
                      for spec, inp in zip(self.specs, inputs)]
        w = self.weights(scores)
        total, reports = None, {}
        zero = student_logits_BTsVs.new_zeros((), dtype=torch.float32)
        for i, (spec, inp) in enumerate(zip(self.specs, inputs)):
            cov = coverage(inp, student_loss_mask_BTs, spec.loss == "exact_kl")
            score = scores[i].detach() if scores is not None else None
            if float(w[i]) == 0.0:
                reports[spec.name] = TeacherReport(zero, 0.0, cov, score)
                continue
            args = (spec, inp, student_logits_BTsVs)
            if spec.loss in SAME_TOKENIZER_LOSSES:
                term = _same_tok_loss(*args, student_loss_mask_BTs, num_valid.get(spec.name),
                                      self.chunk_size)
            else:
                term = _cross_loss(*args, student_ids_BTs, student_loss_mask_BTs,
                                   num_valid.get(spec.name), self.chunk_size)
            reports[spec.name] = TeacherReport(term.detach(), float(w[i]), cov, score)
            total = float(w[i]) * term if total is None else total + float(w[i]) * term
        ce = None
        if self.ce_weight > 0:
            if labels_BTs is None:
                raise ValueError("ce_weight > 0 needs labels_BTs")
            ce = _div.cross_entropy(student_logits_BTsVs, labels_BTs, num_valid=num_valid.get("ce"),
                                    chunk_size=self.chunk_size,
                                    label_smoothing=self.label_smoothing)
            total = self.ce_weight * ce if total is None else total + self.ce_weight * ce
            ce = ce.detach()
        if total is None:
            total = student_logits_BTsVs[..., :0].sum().float()   # 0, attached; -inf rows kept out
        return total, LossReport(total.detach(), ce, reports)
