"""Host memory reuse: freed large blocks stay in the process for the next step (glibc).

A training step on CPU allocates and frees the same large tensors every step: the teacher's
logit blocks (128 x 262k float32 = 128 MiB), the tied embedding's dense gradient (49k x 576 =
113 MiB), the loss's chunk buffers. glibc serves every block above 32 MiB with a fresh ``mmap``
and returns it with ``munmap`` when freed, so each step first-touches (page-faults) all of them
again; on the 2-core development VM that fault time exceeded the arithmetic of the ops that wrote
the buffers (``benchmarks/results/train_step.md``: ``exp`` into a fresh 155 MB buffer 136 ms vs
38 ms into a reused one; 10 x (113 MiB + 128 MiB) allocate-and-fill: 0.72 s with 604k faults vs
0.20 s with none).

:func:`apply_host_allocator` with ``"reuse"`` tells glibc (``mallopt``) to serve large blocks
from its heap (``M_MMAP_MAX = 0``) and never to give freed heap memory back (``M_TRIM_THRESHOLD``
= -1, which mallopt(3) documents as disabling trimming): the next step reuses the same pages. An
earlier threshold of 2 GiB (the largest positive value ``mallopt`` takes) still returned any free
top of the heap above 2 GiB: the on-policy teacher's full logits for 32 rollouts (32 x 88 x 262k
float32, 2.9 GB) were then page-faulted in again every step: 5.3-6.9 s instead of 3.1 s for
the teacher phase.
The cost: the process's resident memory stays at its peak instead of shrinking between steps (the
peak itself is what it was). ``"system"`` leaves glibc's
defaults; ``"auto"`` is ``reuse`` for a CPU run and ``system`` on CUDA, where the large tensors
live on the device. Other C libraries (musl, macOS) are left alone with one log line. The
setting is process-wide, made once by the trainer's processes and the teacher worker processes,
and never by library code (``losses/`` only keeps its temporaries small).

Known limit (glibc before 2.38; measured on 2.36): torch allocates 64-byte-aligned blocks
(``posix_memalign``), for which glibc asks its heap for the size plus 96 bytes. A freed block
whose neighbour is still in use is then too small for the next block of the same size, which
comes from fresh heap: a loop that allocates, fills and frees one 256 MiB tensor grows resident
memory by 256 MiB per round under ``reuse`` (not under ``system``). A training step frees many
blocks together, which merge; in a batch-32 on-policy run of the real pair the peak resident
memory was 11,867 MB after step 2 and 11,868 MB after step 3, and a real-pair multi-teacher
run's (off-policy, 4 x 64 tokens) resident memory was 5,666 MB at step 10 and 5,695 MB at step
38. The 96 spare bytes are freed
into glibc's per-thread cache, which never merges them back: with that cache off
(``GLIBC_TUNABLES=glibc.malloc.tcache_count=0`` in the environment of the process, read at its
start) the same loop's resident memory stays flat, measured. If resident memory grows step after
step (``rss_mb`` in ``metrics.jsonl``), start the run with that variable or set
``train.host_allocator: system``.
"""

from __future__ import annotations

import ctypes
import ctypes.util

from xdistill.errors import ConfigError
from xdistill.log import get_logger, rank

log = get_logger("host_memory")

POLICIES = ("auto", "reuse", "system")
# the trainer's choice, handed to the teacher worker processes it starts
HOST_ALLOCATOR_ENV = "XDISTILL_HOST_ALLOCATOR"
M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_MAX = -4
KEEP_BYTES = -1  # mallopt(3): M_TRIM_THRESHOLD -1 disables trimming completely
_APPLIED: list[str] = []  # the policy this process applied (once)


def resolve_policy(policy: str, device: str) -> str:
    """``auto`` -> ``reuse`` on a CPU device, ``system`` on CUDA; the others as they are."""
    if policy not in POLICIES:
        raise ConfigError(f"train.host_allocator: {policy!r} is not one of {', '.join(POLICIES)}")
    if policy == "auto":
        return "system" if str(device).startswith("cuda") else "reuse"
    return policy


def _glibc():
    """glibc's handle, or None on another C library."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version") else None


def apply_host_allocator(policy: str, device: str = "cpu") -> str:
    """Apply ``policy`` (module doc) to this process once; returns what was applied:
    ``"reuse"``, ``"system"`` or ``"unsupported"`` (not glibc). A second call is a no-op that
    returns the first call's result."""
    if _APPLIED:
        return _APPLIED[0]
    chosen = resolve_policy(policy, device)
    if chosen == "reuse":
        libc = _glibc()
        if libc is None:
            chosen = "unsupported"
            log.info("host allocator: not glibc, left as it is (train.host_allocator=%s)", policy)
        else:
            ok = libc.mallopt(M_TRIM_THRESHOLD, KEEP_BYTES) == 1
            ok = libc.mallopt(M_MMAP_MAX, 0) == 1 and ok
            if not ok:
                chosen = "unsupported"
            if rank() == 0:
                log.info("host allocator: %s (train.host_allocator=%s): freed blocks are %s",
                         chosen, policy, "kept for reuse" if ok else "handled as before "
                         "(mallopt refused)")
    _APPLIED.append(chosen)
    return chosen
