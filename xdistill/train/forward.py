"""One micro-batch through the teachers and the student: the skeleton both training modes share.

Forward, loss and backward for off-policy :func:`xdistill.train.step.micro_step` and on-policy
:func:`xdistill.train.onpolicy_step.scored_step`; a mode supplies only its loss.

Order (:func:`teachers_and_student`):

1. the batch moves to the student's device (``transport``);
2. remote teachers get it, unless it was submitted ahead (:mod:`xdistill.train.pipeline`), then
   in-process teachers score it (``teacher``): before the student's activations exist;
3. student forward (``student``) while the remote teachers compute;
4. every teacher's output collected (``teacher``); the mode's loss (it times its own parts);
5. backward (``student``); the teachers' output slots are released only after it (autograd may
   hold views of them), or on an error, so that no slot stays leased.

With ``backward=False`` the forward and the loss run under ``torch.no_grad()`` (evaluation).

Legend: B batch, Ts student tokens, Vs student vocabulary.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable

import torch


def student_logits(model, batch) -> torch.Tensor:
    """The student's logits [B, Ts, Vs] of a batch (no KV cache)."""
    return model(input_ids=batch.input_ids_BTs, attention_mask=batch.attention_mask_BTs.long(),
                 use_cache=False).logits


def teachers_and_student(model, pool, batch, timers, loss_of: Callable[..., tuple[Any, Any]], *,
                         device, remote: dict | None = None, backward: bool = True,
                         hook=None) -> Any:
    """Teachers, student forward, loss and (optionally) backward of one micro-batch (module doc).

    ``loss_of(logits_BTsVs, batch, results)`` returns ``(loss tensor, what to return)``;
    ``results`` is the :class:`xdistill.teacher.TeacherResults` of the batch (None without a
    ``pool``). ``remote``: the remote teachers' step ids when the batch was submitted ahead.
    ``hook(logits, batch)`` runs right after the student forward (evaluation uses it).
    """
    with timers("transport"):
        batch = batch.to(device, non_blocking=True)
    pending = None  # submitted steps not handed to collect yet
    if pool is not None:
        with timers("teacher"):
            pending = pool.submit_remote(batch) if remote is None else remote
            pending = pool.submit_inprocess(batch, pending)
    results = None
    grad = nullcontext() if backward else torch.no_grad()
    try:
        with grad, timers("student"):
            logits = student_logits(model, batch)
        if hook is not None:
            hook(logits, batch)
        if pending is not None:
            steps, pending = pending, None
            with timers("teacher"):
                results = pool.collect(steps)
        with grad:
            loss, out = loss_of(logits, batch, results)
        if backward:
            with timers("student"):
                loss.backward()
    finally:
        if results is not None:
            results.release()
        elif pending:
            pool.discard(pending)
    return out
