"""Teacher-output transports behind one interface (see ``base.py``) and the automatic choice.

====================  =====================================  ==========================
transport             when ``auto`` picks it                 module
====================  =====================================  ==========================
``inprocess``         in-process teacher (tensors handed)     ``placement.py``
``cuda_ipc``          worker on this node, CUDA device        ``cuda_ipc.py``
``shm``               worker on this node, CPU device         ``shm.py``
``ray``               Ray actor on another node               ``ray_store.py``
====================  =====================================  ==========================
"""

from __future__ import annotations

from xdistill.errors import ConfigError
from xdistill.teacher.transport.base import (SlotReader, SlotRing, SlotWriter, TeacherLease,
                                             layout_views, pack_layout)
from xdistill.teacher.transport.cuda_ipc import CudaIpcReader, CudaIpcWriter
from xdistill.teacher.transport.ray_store import RayStoreReader, RayStoreWriter
from xdistill.teacher.transport.shm import ShmReader, ShmWriter


def choose_transport(requested: str, placement: str, device: str, same_node: bool = True) -> str:
    """Resolve ``TeacherConfig.transport`` (``auto`` or an explicit override) to a transport."""
    if placement == "inprocess":
        return "inprocess"
    if requested != "auto":
        if requested == "cuda_ipc" and not str(device).startswith("cuda"):
            raise ConfigError(f"transport 'cuda_ipc' needs a CUDA teacher device, got {device!r}")
        if requested in ("cuda_ipc", "shm") and not same_node:
            raise ConfigError(f"transport {requested!r} is node-local but the teacher runs on "
                              "another node; use 'ray'")
        return requested
    if not same_node:
        return "ray"
    return "cuda_ipc" if str(device).startswith("cuda") else "shm"


def make_writer(kind: str, n_slots: int, device) -> SlotWriter:
    if kind == "shm":
        return ShmWriter(n_slots, device)
    if kind == "cuda_ipc":
        return CudaIpcWriter(n_slots, device)
    if kind == "ray":
        return RayStoreWriter(n_slots, device)
    raise ConfigError(f"unknown teacher transport {kind!r}; expected shm, cuda_ipc or ray")


def make_reader(kind: str) -> SlotReader:
    if kind == "shm":
        return ShmReader()
    if kind == "cuda_ipc":
        return CudaIpcReader()
    if kind == "ray":
        return RayStoreReader()
    raise ConfigError(f"unknown teacher transport {kind!r}; expected shm, cuda_ipc or ray")


__all__ = ["SlotReader", "SlotWriter", "SlotRing", "TeacherLease", "choose_transport",
           "make_writer", "make_reader", "layout_views", "pack_layout"]
