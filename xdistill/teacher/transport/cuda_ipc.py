"""CUDA IPC transport: teacher outputs stay on the teacher's GPU; the student maps them.

UNTESTED ON GPU HERE (the development machine has no CUDA); its tests carry ``@pytest.mark.gpu``.

* Each slot is one persistent ``uint8`` CUDA buffer allocated by the worker on its device. Its IPC
  handle comes from ``torch.multiprocessing.reductions.reduce_tensor`` (``cudaIpcGetMemHandle`` plus
  torch's cross-process reference counter, so the producer keeps the block alive while a consumer
  maps it) and is sent once per buffer generation; the reader rebuilds it once and caches it.
* Device remapping: a handle names the device by index in the *worker's* numbering, which depends
  on its ``CUDA_VISIBLE_DEVICES`` (Ray sets its own). The worker also sends the device UUID; the
  reader finds the local index with that UUID and substitutes it (argument 6 of
  ``rebuild_cuda_tensor``) before rebuilding. A GPU the reader cannot see is an error: CUDA IPC is
  node-local; use the Ray transport across nodes.
* Synchronisation: the worker synchronises its device before ``publish`` returns, so the data is
  complete when the reply arrives. The reader records a CUDA event on its current stream at
  ``release`` and waits for it in ``wait_reusable`` before the slot is named in a new request, so
  kernels the student queued on the slot have finished reading before the worker overwrites it.
"""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

from xdistill.errors import TeacherError
from xdistill.teacher.transport.base import SlotReader, SlotWriter, layout_views, pack_layout

_DEVICE_ARG = 6  # index of storage_device in rebuild_cuda_tensor's arguments


def device_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def local_index_of(uuid: str) -> int:
    """The local CUDA device index whose UUID is ``uuid`` (raises TeacherError if invisible)."""
    for i in range(torch.cuda.device_count()):
        if device_uuid(i) == uuid:
            return i
    raise TeacherError(f"CUDA IPC: the teacher's GPU {uuid} is not visible to the training process "
                       "(check CUDA_VISIBLE_DEVICES; across nodes use transport 'ray')")


class CudaIpcWriter(SlotWriter):
    """Worker half: persistent per-slot CUDA buffers with cached IPC handles."""

    kind = "cuda_ipc"

    def __init__(self, n_slots: int, device):
        super().__init__(n_slots, device)
        if self.device.type != "cuda":
            raise TeacherError(f"CUDA IPC transport needs a CUDA teacher device, got {self.device}")
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._bufs: dict[int, tuple[int, torch.Tensor]] = {}
        self._announced: set[tuple[int, int]] = set()
        self._gen = 0

    def prepare(self, slot: int, spec: dict) -> dict[str, torch.Tensor]:
        self._check_slot(slot)
        layout, nbytes = pack_layout(spec)
        held = self._bufs.get(slot)
        if held is None or held[1].numel() < nbytes:
            if held is not None:
                nbytes = max(nbytes, held[1].numel() * 5 // 4)
            self._gen += 1
            held = self._bufs[slot] = (self._gen, torch.empty(nbytes, dtype=torch.uint8,
                                                              device=self.device))
        self._layout[slot] = layout
        return layout_views(held[1], layout)

    def publish(self, slot: int) -> dict:
        gen, buf = self._bufs[slot]
        torch.cuda.synchronize(self.device)
        meta = {"gen": gen, "layout": self._layout[slot]}
        if (slot, gen) not in self._announced:
            self._announced.add((slot, gen))
            _, args = reduce_tensor(buf)
            meta["handle"] = args
            meta["uuid"] = device_uuid(self.device.index)
        return meta

    def close(self) -> None:
        self._bufs.clear()
        if torch.cuda.is_available():
            torch.cuda.synchronize(self.device)


class CudaIpcReader(SlotReader):
    """Training half: rebuilds each slot's buffer once (device remapped by UUID)."""

    kind = "cuda_ipc"

    def __init__(self):
        self._bufs: dict[int, tuple[int, torch.Tensor]] = {}
        self._events: dict[int, torch.cuda.Event] = {}

    def read(self, slot: int, meta: dict) -> dict[str, torch.Tensor]:
        held = self._bufs.get(slot)
        if held is None or held[0] != meta["gen"]:
            if "handle" not in meta:
                raise TeacherError(f"CUDA IPC: slot {slot} generation {meta['gen']} arrived "
                                   "without its handle (worker/reader out of sync)")
            args = list(meta["handle"])
            args[_DEVICE_ARG] = local_index_of(meta["uuid"])
            held = self._bufs[slot] = (meta["gen"], rebuild_cuda_tensor(*args))
        return layout_views(held[1], meta["layout"])

    def release(self, slot: int) -> None:
        held = self._bufs.get(slot)
        if held is not None:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(held[1].device))
            self._events[slot] = event

    def wait_reusable(self, slot: int) -> None:
        event = self._events.pop(slot, None)
        if event is not None:
            event.synchronize()

    def forget_worker(self, pid: int) -> None:
        self._bufs.clear()
        self._events.clear()

    def close(self) -> None:
        for event in self._events.values():
            event.synchronize()
        self._bufs.clear()
        self._events.clear()
