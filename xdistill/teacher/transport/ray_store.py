"""Ray object-store transport: for a teacher actor on another node.

The worker fills fresh CPU tensors and returns them as numpy arrays inside the reply; Ray puts the
reply in the object store (large numpy buffers go to shared memory on the driver's node after one
network copy) and ``ray.get`` deserialises numpy arrays zero-copy. dtypes numpy lacks (bfloat16)
travel as same-width integer arrays and are viewed back. Slots here are only a flow-control limit
(the same ring as the other transports); ``release`` drops the references so the object store can
free the memory.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from xdistill.teacher.transport.base import SlotReader, SlotWriter, dtype_name

_CARRIER = {torch.bfloat16: torch.int16}


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    return t.view(_CARRIER.get(t.dtype, t.dtype)).numpy()


def from_numpy(a: np.ndarray, dtname: str) -> torch.Tensor:
    with warnings.catch_warnings():  # object-store arrays are read-only; the student only reads
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(a)
    dtype = getattr(torch, dtname)
    return t.view(dtype) if t.dtype != dtype else t


class RayStoreWriter(SlotWriter):
    """Worker half: fresh tensors per request, returned through the object store."""

    kind = "ray"

    def __init__(self, n_slots: int, device):
        super().__init__(n_slots, device)
        self._out: dict[int, dict[str, torch.Tensor]] = {}

    def prepare(self, slot: int, spec: dict) -> dict[str, torch.Tensor]:
        self._check_slot(slot)
        out = {n: torch.empty(shape, dtype=dt) for n, (shape, dt) in spec.items()}
        self._out[slot] = out
        return out

    def publish(self, slot: int) -> dict:
        out = self._out.pop(slot)
        return {"arrays": {n: (to_numpy(t), dtype_name(t.dtype)) for n, t in out.items()}}


class RayStoreReader(SlotReader):
    """Training half: wraps the arrays of a reply; ``release`` drops them."""

    kind = "ray"

    def __init__(self):
        self._held: dict[int, dict] = {}

    def read(self, slot: int, meta: dict) -> dict[str, torch.Tensor]:
        self._held[slot] = meta
        return {n: from_numpy(a, dt) for n, (a, dt) in meta["arrays"].items()}

    def release(self, slot: int) -> None:
        self._held.pop(slot, None)

    def close(self) -> None:
        self._held.clear()
