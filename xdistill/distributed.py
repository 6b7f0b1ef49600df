"""Process-group setup and small collectives for data-parallel training.

Launch model: ``torchrun`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT``; :func:`init_distributed` reads them and starts a process group (NCCL when CUDA is
available, gloo otherwise). Without those variables it starts nothing and every helper here acts as
the single process of a world of size 1: :func:`all_reduce_sum` returns its input, :func:`barrier`
returns at once. Code therefore never branches on "am I distributed?" itself.

A process that ran a group ends through :func:`leave_process` (the console script does this):
torch keeps the group's backend, and gloo's worker threads, alive after ``destroy_process_group``
for as long as FSDP2's DTensor specs, cached inside torch, hold the device mesh -- here, until the
interpreter's own teardown, which a worker thread can then abort (see :func:`leave_process`).

The device mesh is one-dimensional (``("dp_shard",)``, plain FSDP) or two-dimensional
(``("dp_replicate", "dp_shard")``, HSDP: shard inside a group of ranks, replicate across groups).

Normalising a loss by the *global* valid-token count: each rank computes ``n_local`` valid tokens
over all of its micro-batches, ``n_global = all_reduce_sum(n_local)``, and uses
``loss_local = sum_of_token_losses_local / n_global``. With the gradient reduction set to *sum*
(``StudentConfig.grad_reduce = "sum"``, the default), the summed gradient is exactly the gradient
of ``sum_of_all_token_losses / n_global`` -- the same as one process on the whole global batch.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from xdistill.errors import XDistillError

Number = TypeVar("Number", int, float)

# set by init_distributed when this process starts a process group (read by leave_process's caller)
_STARTED_GROUP = False


@dataclass(frozen=True)
class DistEnv:
    """What :func:`init_distributed` found: this process's place in the job."""

    # global rank (0 when not distributed)
    rank: int
    # number of processes in the job (1 when not distributed)
    world_size: int
    # rank within this node; selects the CUDA device
    local_rank: int
    # device this rank computes on: ``cuda:<local_rank>`` or ``cpu``
    device: torch.device
    # "nccl", "gloo", or None when no process group was started
    backend: str | None

    @property
    def is_main(self) -> bool:
        """True on global rank 0 (the process that logs and writes shared files)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True when a process group is running."""
        return self.backend is not None


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise XDistillError(f"environment variable {name}={raw!r} is not an integer") from None


def init_distributed(backend: str | None = None, timeout_s: float = 1800.0) -> DistEnv:
    """Start the process group from torchrun's environment (idempotent).

    ``backend``: None picks ``nccl`` when CUDA is available and ``gloo`` otherwise. With
    ``WORLD_SIZE`` unset, no process group is started and a world of size 1 is returned. On CUDA the
    current device is set to ``cuda:LOCAL_RANK``.
    """
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise XDistillError(
                f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} CUDA device(s) are visible"
            )
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if dist.is_available() and dist.is_initialized():
        return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, device, dist.get_backend())
    if "WORLD_SIZE" not in os.environ:
        return DistEnv(0, 1, 0, device, None)
    chosen = backend or ("nccl" if use_cuda else "gloo")
    if chosen == "nccl" and not use_cuda:
        raise XDistillError("backend 'nccl' needs CUDA, but no CUDA device is available; use 'gloo'")
    dist.init_process_group(
        backend=chosen,
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=device if chosen == "nccl" else None,
    )
    global _STARTED_GROUP
    _STARTED_GROUP = True
    return DistEnv(rank, world_size, local_rank, device, chosen)


def started_a_process_group() -> bool:
    """True once :func:`init_distributed` started a process group in this process (even after
    :func:`destroy_distributed`)."""
    return _STARTED_GROUP


def leave_process(code: int) -> NoReturn:
    """End a process that ran a process group, its work done and its group destroyed: flush the
    logging handlers and the standard streams, then ``os._exit(code)``, skipping the interpreter's
    teardown.

    Why: ``destroy_process_group`` does not end gloo's worker threads while anything still holds
    the group, and after an FSDP2 run torch's own DTensor caches hold the device mesh, which holds
    the group (measured with torch 2.13: the mesh and three gloo threads outlive the call and a
    garbage collection). The interpreter's teardown then runs beside those threads; a worker that
    drops the last reference to a tensor with a Python object needs the GIL, which a finalising
    interpreter refuses by ending the thread, and C++ aborts the process (``terminate called
    without an active exception``: seen once in a full test run under load, after training had
    finished, and not in 57 repeated two-rank runs since; seen again, under load, in the FSDP
    tests' torchrun helper, which now leaves the same way; pytorch#179291 describes the
    mechanism). Everything a run writes is closed before
    this is called: checkpoints and exports are synchronous, metrics and trackers are closed by the
    trainer, teacher and loader workers are stopped by its ``close``."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # closed or broken pipe: nothing left to save
            pass
    os._exit(code)


def is_distributed() -> bool:
    """True when a process group is running."""
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    """Global rank, 0 without a process group."""
    return dist.get_rank() if is_distributed() else 0


def get_world_size() -> int:
    """World size, 1 without a process group."""
    return dist.get_world_size() if is_distributed() else 1


def get_local_rank() -> int:
    """Rank within the node (``LOCAL_RANK``), 0 when unset."""
    return _env_int("LOCAL_RANK", 0)


def is_main_process() -> bool:
    """True on global rank 0."""
    return get_rank() == 0


def comm_device() -> torch.device:
    """Device tensors must live on for collectives: CUDA for NCCL, CPU for gloo or no group."""
    if is_distributed() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def barrier() -> None:
    """Wait for every rank (no-op without a process group)."""
    if is_distributed():
        if dist.get_backend() == "nccl":
            dist.barrier(device_ids=[torch.cuda.current_device()])
        else:
            dist.barrier()


def destroy_distributed() -> None:
    """Wait for every rank, then tear the process group down (no-op without one). The barrier
    keeps a fast rank from closing its connections while a peer still finishes a collective
    (gloo aborts the peer then)."""
    if is_distributed():
        barrier()
        dist.destroy_process_group()


def _all_reduce(value: Any, op: dist.ReduceOp) -> Any:
    if isinstance(value, torch.Tensor):
        if not is_distributed():
            return value
        buf = value.detach().to(comm_device(), copy=True)
        dist.all_reduce(buf, op=op)
        return buf.to(value.device)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"all-reduce takes an int, a float or a tensor, not {type(value).__name__}")
    if not is_distributed():
        return value
    dtype = torch.int64 if isinstance(value, int) else torch.float64
    buf = torch.tensor([value], dtype=dtype, device=comm_device())
    dist.all_reduce(buf, op=op)
    return type(value)(buf.item())


def all_reduce_sum(value: Number | torch.Tensor) -> Number | torch.Tensor:
    """Sum over all ranks. Python ints stay exact (int64); floats use float64; a tensor comes back
    as a new tensor on its own device and dtype (the input is not modified). Identity without a
    process group."""
    return _all_reduce(value, dist.ReduceOp.SUM)


def all_reduce_max(value: Number | torch.Tensor) -> Number | torch.Tensor:
    """Maximum over all ranks (same conventions as :func:`all_reduce_sum`)."""
    return _all_reduce(value, dist.ReduceOp.MAX)


def all_reduce_mean(value: float | torch.Tensor) -> float | torch.Tensor:
    """Mean over all ranks (sum divided by the world size); ints become floats."""
    if isinstance(value, torch.Tensor):
        return all_reduce_sum(value) / get_world_size()
    return float(all_reduce_sum(float(value))) / get_world_size()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Send a picklable object from ``src`` to every rank (identity without a process group)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, device=comm_device())
    return box[0]


def build_device_mesh(env: DistEnv | None = None, dp_replicate: int = 1):
    """Device mesh for FSDP2; None when no process group runs (single process, nothing to shard).

    ``dp_replicate == 1``: 1-D mesh ``("dp_shard",)`` over all ranks (FSDP). ``dp_replicate > 1``:
    2-D mesh ``("dp_replicate", "dp_shard")`` of shape ``(dp_replicate, world // dp_replicate)``
    (HSDP: parameters sharded within a row, replicated across rows; rows are usually nodes).
    """
    if not is_distributed():
        return None
    world = get_world_size()
    if dp_replicate < 1 or world % dp_replicate != 0:
        raise XDistillError(
            f"dp_replicate={dp_replicate} must be >= 1 and divide the world size {world}"
        )
    device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
    if dp_replicate == 1:
        return init_device_mesh(device_type, (world,), mesh_dim_names=("dp_shard",))
    return init_device_mesh(
        device_type, (dp_replicate, world // dp_replicate), mesh_dim_names=("dp_replicate", "dp_shard")
    )
