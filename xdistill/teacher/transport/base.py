"""One interface for moving teacher outputs to the student: slots, layouts, leases.

A transport has two halves:

* a :class:`SlotWriter` in the worker process: ``prepare(slot, spec)`` returns tensors to fill
  (views into the slot's persistent buffer, grown when a larger batch arrives), ``publish(slot)``
  makes the written data visible and returns a small, picklable ``meta`` dict (the buffer handle is
  included only the first time a buffer generation is published: the reader caches it);
* a :class:`SlotReader` in the training process: ``read(slot, meta)`` maps the slot (once per
  generation) and returns the tensors; ``release(slot)`` marks that the student is done reading.

The ack protocol lives on the reader's side (:class:`SlotRing`): the training process names the
slot in every request and only names a slot that is free, i.e. released by the student. A worker
therefore never writes into a slot the student is still reading; no message back to the worker is
needed. For CUDA, ``release`` records an event on the student's stream and ``wait_reusable`` waits
for it before the slot is named in a new request, so queued GPU reads finish first.

Buffers are one flat uint8 region per slot; each output field is a view at a 64-byte aligned
offset (:func:`pack_layout`).
"""

from __future__ import annotations

import abc
import threading

import torch

from xdistill.errors import TeacherError

ALIGN = 64


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def pack_layout(spec: dict[str, tuple[tuple, torch.dtype]]) -> tuple[list, int]:
    """``[(field, shape, dtype name, byte offset)]`` and the total bytes for one slot."""
    layout, offset = [], 0
    for name, (shape, dtype) in spec.items():
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        layout.append((name, tuple(shape), dtype_name(dtype), offset))
        offset += (nbytes + ALIGN - 1) // ALIGN * ALIGN
    return layout, max(offset, ALIGN)


def layout_views(buf_N: torch.Tensor, layout: list) -> dict[str, torch.Tensor]:
    """Typed views of the flat uint8 buffer ``buf_N`` for each field of ``layout``."""
    out = {}
    for name, shape, dtname, offset in layout:
        dtype = getattr(torch, dtname)
        n = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        out[name] = buf_N[offset:offset + n].view(dtype).view(shape)
    return out


class SlotWriter(abc.ABC):
    """Worker half of a transport (see module doc)."""

    kind = "base"

    def __init__(self, n_slots: int, device: torch.device):
        self.n_slots, self.device = n_slots, torch.device(device)
        self._layout: dict[int, list] = {}

    @abc.abstractmethod
    def prepare(self, slot: int, spec: dict) -> dict[str, torch.Tensor]:
        """Tensors (views into slot ``slot``) with the shapes/dtypes of ``spec`` to fill."""

    @abc.abstractmethod
    def publish(self, slot: int) -> dict:
        """Make the slot's data visible to the reader; return the picklable meta for ``read``."""

    def close(self) -> None:
        """Free the buffers (unlink shared-memory segments)."""

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.n_slots:
            raise TeacherError(f"slot {slot} out of range [0, {self.n_slots})")


class SlotReader(abc.ABC):
    """Training-process half of a transport (see module doc)."""

    kind = "base"

    @abc.abstractmethod
    def read(self, slot: int, meta: dict) -> dict[str, torch.Tensor]:
        """The output tensors of the reply ``meta`` for slot ``slot``."""

    def release(self, slot: int) -> None:
        """The student is done with ``slot`` (its tensors must not be used afterwards)."""

    def wait_reusable(self, slot: int) -> None:
        """Block until the student's (asynchronous) reads of ``slot`` have finished."""

    def forget_worker(self, pid: int) -> None:
        """The worker ``pid`` died: drop its buffers (unlink what it left in shared memory)."""

    def close(self) -> None:
        """Unmap everything and unlink what the worker may have left behind."""


class SlotRing:
    """Free list of a teacher's slots on the training side; the heart of the ack protocol."""

    def __init__(self, n_slots: int, name: str):
        self.name = name
        self._free = list(range(n_slots))
        self._lock = threading.Lock()

    def acquire(self) -> int:
        with self._lock:
            if not self._free:
                raise TeacherError(
                    f"teacher {self.name!r}: all output slots are held by the student; release a "
                    "TeacherLease (or use it as a context manager) before submitting another batch,"
                    " or raise TeacherConfig.slots")
            return self._free.pop(0)

    def release(self, slot: int) -> None:
        with self._lock:
            if slot in self._free:
                raise TeacherError(f"teacher {self.name!r}: slot {slot} released twice")
            self._free.append(slot)

    @property
    def n_free(self) -> int:
        return len(self._free)


class TeacherLease:
    """A teacher output living in a transport slot, valid until :meth:`release`.

    Use as a context manager (``with client.forward(view) as lease: ... lease.output``) or call
    ``release()``; ``output.clone()`` gives a copy that outlives the slot.
    """

    def __init__(self, output, release_fn=None):
        self._output = output
        self._release_fn = release_fn
        self.released = False

    @property
    def output(self):
        if self.released:
            raise TeacherError(f"teacher {self._output.name!r}: output of step "
                               f"{self._output.step} read after its slot was released")
        return self._output

    def release(self) -> None:
        if not self.released:
            self.released = True
            if self._release_fn is not None:
                self._release_fn()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.release()
