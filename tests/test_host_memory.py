"""Host memory reuse (xdistill/host_memory.py): glibc keeps freed large blocks for the next step.

The policy is process-wide, so each check runs in a fresh subprocess: there, 10 rounds of
allocating and filling a 113 MiB and a 128 MiB tensor page-fault ~600k times under ``system``
and not at all under ``reuse`` (counts from getrusage, not timings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from xdistill import host_memory
from xdistill.errors import ConfigError

PROBE = """
import json, resource, sys, torch
from xdistill.host_memory import apply_host_allocator
chosen = apply_host_allocator(sys.argv[1], sys.argv[2])
def rounds():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        a = torch.zeros(49152, 576); a.add_(1.0); del a
        b = torch.empty(128, 262144); b.fill_(1.0); del b
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
rounds()
print(json.dumps({"chosen": chosen, "faults": rounds()}))
"""


# one malloc'd block above 2 GiB (the on-policy teacher's full logits for 32 rollouts are 2.9 GB),
# written and freed 3 times; plain malloc, so that only the trim threshold decides (torch's
# 64-byte-aligned blocks add glibc's memalign fragmentation, module doc of host_memory)
BIG = """
import ctypes, json, resource
from xdistill.host_memory import apply_host_allocator
chosen = apply_host_allocator("reuse", "cpu")
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
n = 2304 << 20
faults = []
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(ctypes.c_size_t(n))
    ctypes.memset(p, 1, n)
    libc.free(ctypes.c_void_p(p))
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"chosen": chosen, "faults": faults}))
"""


def _probe(policy: str, device: str = "cpu", *, code: str = PROBE) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="2")
    out = subprocess.run([sys.executable, "-c", code, policy, device],
                         env=env, check=True,
                         capture_output=True, text=True, timeout=300).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_reuse_stops_the_page_faults_of_fresh_large_blocks():
    system, reuse = _probe("system"), _probe("reuse")
    assert system["chosen"] == "system" and reuse["chosen"] == "reuse"
    # 10 x 241 MiB of fresh pages: 600k faults of 4 KiB (fewer with transparent huge pages)
    assert system["faults"] > 5_000
    assert reuse["faults"] < system["faults"] / 20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_reuse_keeps_a_freed_block_larger_than_2_gib():
    """A 2.25 GiB block freed at the top of the heap stays for the next round: a trim threshold
    of 2 GiB (the largest positive value mallopt takes) gave it back every time, and each round
    page-faulted all 590k pages in again."""
    reuse = _probe("reuse", code=BIG)
    assert reuse["chosen"] == "reuse"
    assert reuse["faults"][0] > 500_000, reuse   # the first round touches fresh pages
    assert max(reuse["faults"][1:]) < 5_000, reuse


def test_auto_is_reuse_on_cpu_and_system_on_cuda():
    assert host_memory.resolve_policy("auto", "cpu") == "reuse"
    assert host_memory.resolve_policy("auto", "cuda:0") == "system"
    assert host_memory.resolve_policy("system", "cpu") == "system"
    with pytest.raises(ConfigError, match="train.host_allocator: 'fast' is not one of"):
        host_memory.resolve_policy("fast", "cpu")
    assert _probe("auto", "cuda")["chosen"] == "system"


def test_another_c_library_is_left_alone(monkeypatch):
    monkeypatch.setattr(host_memory, "_APPLIED", [])
    monkeypatch.setattr(host_memory, "_glibc", lambda: None)
    assert host_memory.apply_host_allocator("reuse") == "unsupported"
    assert host_memory.apply_host_allocator("system") == "unsupported"  # once per process


def test_the_trainer_hands_its_choice_to_teacher_workers(monkeypatch):
    from xdistill.train.core import set_host_allocator
    from xdistill.train.config import OffPolicyConfig

    monkeypatch.setattr(host_memory, "_APPLIED", ["system"])  # leave this process alone
    monkeypatch.setenv(host_memory.HOST_ALLOCATOR_ENV, "unset")  # restored afterwards
    cfg = OffPolicyConfig()
    cfg.train.host_allocator = "system"
    set_host_allocator(cfg, "cpu")
    assert os.environ[host_memory.HOST_ALLOCATOR_ENV] == "system"
