"""One optimizer step of off-policy distillation: micro-batches, global normalisation, timing.

Legend: B batch, Ts/Tt student/teacher tokens, Vs/Vt vocabularies, K top-k.

Normalisation: every loss term is a *sum* over loss units divided by a count ``num_valid`` that
is the number of loss units of the whole global batch (all micro-batches of all ranks):
``MultiTeacherLoss.count_valid`` on each micro-batch, summed, ``all_reduce_sum``. Each
micro-batch's backward then adds ``d(sum_mb / n_global)``, gradient accumulation sums those, and
FSDP's *sum* reduction over ranks (``student.grad_reduce = "sum"``) adds the ranks' parts: the
update equals one process on the whole global batch, whatever the split.

Timing (seconds, per step, this rank): ``data`` waiting for the loader, ``teacher`` in-process
teacher forwards and waiting for remote ones, ``transport`` moving batches and teacher outputs
to the student device and building loss inputs, ``student`` student forward + backward (the
loss's backward included), ``loss`` the loss forward, ``optim`` clip + optimizer + scheduler.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict

from xdistill.losses import ChunkAlignment, TeacherLossInput
from xdistill.losses import cross_entropy
from xdistill.losses.multi_teacher import SAME_TOKENIZER_LOSSES, LossReport
from xdistill.train.forward import teachers_and_student
from xdistill.train.metrics import (CE, TOTAL, Metric, StepMetrics, Timers, all_reduce_counts,
                                    teacher_coverage, teacher_loss, teacher_weight)


def loss_inputs(specs, batch, outputs=None, device=None) -> list[TeacherLossInput]:
    """One :class:`TeacherLossInput` per teacher spec from the batch's views (+ its outputs).

    Same-tokenizer losses get no alignment; cross-tokenizer losses the view's chunk alignment
    (the identity alignment for a teacher that shares the student's tokenizer). ``outputs``
    None builds count-only inputs (alignment and masks), enough for ``count_valid``.
    """
    inputs = []
    for spec in specs:
        view = batch.teacher(spec.name)
        cross = spec.loss not in SAME_TOKENIZER_LOSSES
        kw = {}
        if outputs is not None:
            out = outputs[spec.name]
            if device is not None:
                out = out.to(device, non_blocking=True)
            kw = dict(logits_BTtV=out.logits_BTtV, topk_logp_BTtK=out.topk_logp_BTtK,
                      topk_idx_BTtK=out.topk_idx_BTtK, proj_logp_BTtVs=out.proj_logp_BTtVs,
                      support_logits_BTtS=getattr(out, "support_logits_BTtS", None),
                      tail_logmass_BTt=getattr(out, "tail_logmass_BTt", None),
                      token_logp_BTt=getattr(out, "token_logp_BTt", None),
                      temperature=out.temperature)
        inputs.append(TeacherLossInput(
            spec.name, input_ids_BTt=view.input_ids_BTt if cross else None,
            loss_mask_BTt=view.loss_mask_BTt if cross else None,
            alignment=ChunkAlignment.from_view(view) if cross else None, **kw))
    return inputs


def local_counts(loss_fn, batch, ce: bool) -> dict[str, int]:
    """Loss units of one micro-batch per teacher name (and ``"ce"``)."""
    labels = batch.labels_BTs
    if loss_fn is None:
        return {"ce": int((labels[:, 1:] >= 0).sum())}
    return loss_fn.count_valid(loss_inputs(loss_fn.specs, batch), batch.loss_mask_BTs,
                               labels if ce else None)


def sum_counts(loss_fn, batches, ce: bool) -> dict[str, int]:
    """Sum of :func:`local_counts` over ``batches`` (this rank)."""
    total: dict[str, int] = defaultdict(int)
    for batch in batches:
        for key, n in local_counts(loss_fn, batch, ce).items():
            total[key] += n
    return dict(total)


def global_counts(loss_fn, batches, ce: bool) -> dict[str, int]:
    """Sum of :func:`local_counts` over ``batches`` and over all ranks."""
    return all_reduce_counts(sum_counts(loss_fn, batches, ce))


def window_hashes(batch) -> list[str]:
    """Short hash of every window (its non-padding student ids) of a batch."""
    out = []
    for ids, mask in zip(batch.input_ids_BTs, batch.attention_mask_BTs):
        out.append(hashlib.sha1(ids[mask.bool()].numpy().tobytes()).hexdigest()[:16])
    return out


def compute_loss(loss_fn, ce_weight, logits_BTsVs, batch, inputs, num_valid,
                 label_smoothing: float = 0.0):
    """(loss tensor, :class:`LossReport`) of one micro-batch, normalised by the global
    ``num_valid`` (``label_smoothing``: of the CE-only path; a teacher loss carries its own)."""
    if loss_fn is None:
        # CE alone: nothing reads the logits after backward, so the gradient is written over
        # them (no second [B, T, Vs] buffer; see xdistill.losses.engine.token_logprobs)
        ce = cross_entropy(logits_BTsVs, batch.labels_BTs, num_valid=num_valid["ce"],
                           overwrite_logits=logits_BTsVs.requires_grad,
                           label_smoothing=label_smoothing)
        loss = ce_weight * ce
        return loss, LossReport(loss.detach(), ce.detach(), {})
    return loss_fn(logits_BTsVs, batch.input_ids_BTs, batch.loss_mask_BTs, inputs,
                   labels_BTs=batch.labels_BTs, num_valid=num_valid)


def record_report(metrics: StepMetrics, report: LossReport) -> None:
    """Put a loss report into the step metrics, typed (:class:`xdistill.train.metrics.Metric`):
    the total, the CE term and each teacher's loss term summed (each already a share of the
    global mean), weights / coverage / scores averaged."""
    metrics.add(TOTAL, report.total)
    if report.ce is not None:
        metrics.add(CE, report.ce)
    for name, t in report.teachers.items():
        metrics.add(teacher_loss(name), t.loss)
        metrics.mean(teacher_weight(name), t.weight)
        metrics.mean(teacher_coverage(name), t.coverage)
        if t.score is not None:  # NaN (nothing scored) adds no value but keeps the key, which
            # every rank must reduce alike; a step where no rank scored anything reports NaN
            metrics.mean(Metric("score", name), None if math.isnan(float(t.score)) else t.score)


def micro_step(model, loss_fn, pool, batch, num_valid, timers: Timers, *, device,
               ce_weight: float = 0.0, backward: bool = True, hook=None,
               remote: dict | None = None, label_smoothing: float = 0.0) -> LossReport:
    """Teachers, student forward, loss and (optionally) backward of one micro-batch
    (:func:`xdistill.train.forward.teachers_and_student` with the multi-teacher loss).

    Returns the micro-batch's :class:`LossReport` (terms already divided by the global counts,
    so summing them over micro-batches and ranks gives the step's values). ``hook(logits,
    batch)`` is called after the student forward (evaluation uses it). ``remote``: the remote
    teachers' step ids when the batch was submitted ahead (:mod:`xdistill.train.pipeline`).
    """
    specs = loss_fn.specs if loss_fn is not None else ()

    def loss_of(logits, batch, results):
        with timers("transport"):
            inputs = loss_inputs(specs, batch, results, device) if results is not None else []
        with timers("loss"):
            return compute_loss(loss_fn, ce_weight, logits, batch, inputs, num_valid,
                                label_smoothing)

    return teachers_and_student(model, pool, batch, timers, loss_of, device=device,
                                remote=remote, backward=backward, hook=hook)
