"""Pipelined teachers: remote teachers score the next micro-batches while the student computes.

Off-policy batches do not depend on the student, so a subprocess or Ray teacher can already score
micro-batch ``k + 1`` (and, across a step boundary, the first micro-batch of step ``n + 1``) while
the student runs forward and backward on micro-batch ``k``. A step then costs about
``max(teacher, student)`` instead of their sum.

:class:`MicroBatchStream` pulls the micro-batches of every step in the trainer's fixed order (for
each of this process's loaders, ``accum`` consecutive batches) and keeps up to ``lookahead``
micro-batches beyond the current one submitted to the remote teachers (the teacher clients' slot
ring holds them: ``lookahead = min(slots) - 1`` over remote teachers; in-process teachers run when
their micro-batch is consumed). Results are identical to the sequential path: the same batches in
the same order meet the same teacher forwards; only the wall-clock overlap changes.

Checkpoints must not skip prefetched batches: before pulling the first micro-batch of a step the
stream records every loader's ``state_dict()``, and :meth:`MicroBatchStream.state_after` gives the
loader states right after a finished step (the recorded boundary when the next step was already
prefetched, else the loaders' current state). Only the boundaries a checkpoint can still ask for
are kept: those of the steps prefetched beyond the one being trained (and, while a step is being
pulled, its own: the checkpoint of the step before needs it if the data runs out).

Finite data (``data.epochs``): a loader that runs out while the stream prefetches ends the stream
quietly (the steps already pulled still train); asking for a step it could not fill raises
:class:`DataExhausted`, and :meth:`MicroBatchStream.state_after` of the step before still gives
the loader states at that step's end, for the checkpoint written then.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from xdistill.train.core import DataExhausted


@dataclass
class PendingMicro:
    """One micro-batch of a step, possibly already submitted to the remote teachers."""

    # optimizer step (1-based) this micro-batch belongs to
    step: int
    # the DistillBatch (CPU)
    batch: object
    # teacher name -> submitted step id of the remote teachers (None: not submitted yet)
    remote: dict | None = None


class MicroBatchStream:
    """Micro-batches of successive steps with remote teachers ``lookahead`` micro-batches ahead.

    Args:
        iters: one iterator per loader (e.g. :class:`xdistill.data.loader.WatchedIterator`).
        loaders: the matching stateful loaders (their ``state_dict()`` is recorded per step).
        accum: micro-batches per loader per step.
        pool: the :class:`xdistill.teacher.TeacherPool` (None: no teachers).
        lookahead: micro-batches submitted ahead of the one being consumed (0: sequential).
        last_step: the run's final step (nothing beyond it is pulled from the loaders).
    """

    def __init__(self, iters, loaders, accum: int, pool=None, lookahead: int = 0,
                 last_step: int | None = None, data: str = "the data",
                 epochs_key: str = "data.epochs"):
        self.iters, self.loaders, self.accum = list(iters), list(loaders), int(accum)
        self.last_step = last_step
        self.pool, self.lookahead = pool, max(0, int(lookahead))
        # what the loaders read and the key of its passes (named when it runs out)
        self.data, self.epochs_key = data, epochs_key
        self._queue: deque[PendingMicro] = deque()
        self._boundary: dict[int, list] = {}
        self._next_step: int | None = None
        # the first step the loaders could not fill (None: not run out)
        self._exhausted: int | None = None

    @property
    def per_step(self) -> int:
        return self.accum * len(self.iters)

    def start(self, first_step: int) -> None:
        self._next_step = int(first_step)

    def _may_pull(self) -> bool:
        return self._exhausted is None and (self.last_step is None
                                            or self._next_step <= self.last_step)

    def _pull_step(self) -> None:
        """Pull every micro-batch of the next step; a loader that runs out marks the stream
        exhausted at that step and leaves none of its micro-batches queued."""
        step = self._next_step
        self._boundary[step] = [ld.state_dict() for ld in self.loaders]
        pulled = []
        try:
            for it in self.iters:
                for _ in range(self.accum):
                    pulled.append(PendingMicro(step, next(it)))
        except StopIteration:
            self._exhausted = step
            return
        self._queue.extend(pulled)
        self._next_step += 1

    def _submit_ahead(self, upto: int) -> None:
        """Ensure the first ``upto`` queued micro-batches are submitted to remote teachers."""
        if self.pool is None or not self.pool.has_remote:
            return
        for i, micro in enumerate(self._queue):
            if i >= upto:
                break
            if micro.remote is None:
                micro.remote = self.pool.submit_remote(micro.batch)

    def peek_step(self, step: int) -> list[PendingMicro]:
        """The micro-batches of ``step`` (pulled if needed), in consumption order, neither consumed
        nor submitted: the trainer counts their loss units before the first one runs, then hands
        each to :meth:`consume`."""
        if self._next_step is None:
            self.start(step)
        self._forget_boundaries(before=step)   # kept: the checkpoint of step - 1 if this fails
        while sum(1 for m in self._queue if m.step == step) < self.per_step:
            if self._exhausted is not None and self._exhausted <= step:
                raise DataExhausted(step, self.data, self.epochs_key)
            if self._next_step > step:
                raise RuntimeError(f"step {step} is no longer in the micro-batch stream")
            self._pull_step()
        self._forget_boundaries(before=step + 1)   # only state_after(>= step) can follow
        return [m for m in self._queue if m.step == step]

    def _forget_boundaries(self, before: int) -> None:
        """Drop the loader states recorded at the start of steps ``< before``: with the stream at
        step ``before``, :meth:`state_after` is asked for step ``before - 1`` at the earliest."""
        for s in [s for s in self._boundary if s < before]:
            del self._boundary[s]

    def consume(self, micro: PendingMicro) -> PendingMicro:
        """Take ``micro`` (the next micro-batch, from :meth:`peek_step`) off the stream: it and the
        ``lookahead`` micro-batches after it are submitted to the remote teachers (their step ids
        in ``micro.remote``); returns it."""
        if not self._queue or self._queue[0] is not micro:
            raise RuntimeError("micro-batches consumed out of order: the one given is not the "
                               "next in the stream")
        while len(self._queue) < 1 + self.lookahead and self._may_pull():
            self._pull_step()
        self._submit_ahead(1 + self.lookahead)
        return self._queue.popleft()

    def state_after(self, step: int) -> list:
        """Loader states right after ``step`` was consumed (for its checkpoint)."""
        self._forget_boundaries(before=step + 1)
        if step + 1 in self._boundary:
            return self._boundary[step + 1]
        return [ld.state_dict() for ld in self.loaders]

    def drain(self) -> None:
        """Collect and release what was submitted ahead (end of run or on an error)."""
        while self._queue:
            micro = self._queue.popleft()
            if micro.remote and self.pool is not None:
                try:
                    self.pool.collect(micro.remote).release()
                except Exception:  # noqa: BLE001 - shutting down; the teacher error was reported
                    pass
