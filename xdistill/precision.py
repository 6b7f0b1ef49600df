"""Compute dtype ``auto``: bfloat16 where the device has fast bf16 matrix units, float32 elsewhere.

:func:`resolve_compute_dtype` turns a config's ``"auto"`` into a torch dtype for one device and
logs the choice and its reason once per process (an explicit dtype never comes here):

* CUDA: bfloat16 when ``torch.cuda.is_bf16_supported()`` (Ampere and newer), else float32;
* CPU: bfloat16 when torch reports **AMX** tiles (``torch.cpu._is_amx_tile_supported()``: Intel
  Sapphire Rapids and newer, with the OS's permission to use them); float32 without AMX and
  without AVX512-BF16. With AVX512-BF16 but no AMX the instruction set does not decide, so a
  probe measures it (:func:`bf16_matmul_speedup`, ~50 ms, once per process, one thread so that
  busy cores do not move it): bfloat16 when a bf16 matmul runs at least ``BF16_MIN_SPEEDUP``
  times as fast as float32 here. Measured
  (``benchmarks/RESULTS.md``, "dtype auto"): a 1024^3 matmul in bfloat16 vs float32 ran 5.7x
  faster on a Xeon with AMX (1,504 vs 265 GFLOP/s; Gemma-3-270M-shaped forward 2.6x), 0.62x on a
  Xeon VM with AVX512-BF16 but no AMX (oneDNN's ``avx512_core_bf16`` kernel, 167 vs 271 GFLOP/s;
  the real-pair step was slower in bf16 there), 4.4x on an AMD EPYC VM with AVX512-BF16 and no
  AMX (1 thread, 440 vs 99 GFLOP/s; Gemma's head shape 4.1x), and 0.22x with oneDNN held to
  AVX512 without bf16 instructions.

What the CPU offers is read from torch (:func:`cpu_bf16_units`), never from a model or CPU name;
tests replace :func:`cpu_bf16_units` / :func:`cuda_bf16_supported` to check both outcomes.

The environment variable ``XDISTILL_AUTO_DTYPE`` (``float32`` or ``bfloat16``) overrides the
detection for every ``auto`` in the process and the processes it starts (an explicit dtype in a
config still wins). ``tests/conftest.py`` sets it to ``float32`` so that tests comparing runs at
float32 tolerances mean the same on every CPU; the tests of ``auto`` itself unset it.
"""

from __future__ import annotations

import os
import time

import torch

from xdistill.errors import ConfigError
from xdistill.log import get_logger, rank

log = get_logger("precision")
_LOGGED: set[tuple[str, str, str]] = set()
ENV_OVERRIDE = "XDISTILL_AUTO_DTYPE"
_OVERRIDES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def cpu_bf16_units() -> dict[str, bool]:
    """The bf16 matrix units torch (and its oneDNN) can use on this CPU: ``{"amx": ...,
    "avx512_bf16": ...}`` (False where this torch build cannot tell)."""
    cpu = getattr(torch, "cpu", None)

    def ask(name: str) -> bool:
        fn = getattr(cpu, name, None)
        try:
            return bool(fn()) if fn is not None else False
        except Exception:  # noqa: BLE001 - an unsupported query means "no"
            return False

    return {"amx": ask("_is_amx_tile_supported"), "avx512_bf16": ask("_is_avx512_bf16_supported")}


# a bf16 matmul at least this many times as fast as float32 makes a CPU without AMX "fast"
BF16_MIN_SPEEDUP = 1.5
_SPEEDUP: list[float] = []


def bf16_matmul_speedup() -> float:
    """float32 time / bfloat16 time of a 256x512 @ 512x1024 matmul on this CPU (the best of 9
    interleaved runs each, after a warm-up), measured once per process (~50 ms) on **one
    thread**: the ratio is the instruction set's, and a multi-threaded matmul on cores shared
    with other work waits for its slowest thread (2 threads beside two busy processes measured
    1.5-3.8x on a CPU whose single-thread ratio is 3.6-4.0x, so a run once chose float32)."""
    if not _SPEEDUP:
        gen = torch.Generator().manual_seed(0)
        a, b = torch.randn(256, 512, generator=gen), torch.randn(512, 1024, generator=gen)
        pairs = {torch.float32: (a, b), torch.bfloat16: (a.bfloat16(), b.bfloat16())}
        best = {dt: float("inf") for dt in pairs}
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for rep in range(10):
                for dt, (x, y) in pairs.items():
                    t = time.perf_counter()
                    torch.mm(x, y)
                    if rep:                   # the first round warms the kernels up
                        best[dt] = min(best[dt], time.perf_counter() - t)
        finally:
            torch.set_num_threads(threads)
        _SPEEDUP.append(best[torch.float32] / max(best[torch.bfloat16], 1e-9))
    return _SPEEDUP[0]


def cuda_bf16_supported() -> bool:
    """Whether the current CUDA device computes bf16 natively (Ampere and newer; torch's own
    check also counts the emulation pre-Ampere GPUs run unless told not to)."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def fast_bf16(device: torch.device | str) -> tuple[bool, str]:
    """(whether ``device`` has fast bf16 matrix units, the reason in words)."""
    device = torch.device(device)
    if device.type == "cuda":
        if cuda_bf16_supported():
            return True, "CUDA device with native bf16"
        return False, "CUDA device without native bf16 (pre-Ampere)"
    if device.type != "cpu":
        return False, f"{device.type} device: bf16 speed unknown"
    units = cpu_bf16_units()
    if units["amx"]:
        return True, "CPU with AMX-BF16 tiles (torch/oneDNN report AMX)"
    if units["avx512_bf16"]:
        speedup = bf16_matmul_speedup()
        what = f"CPU with AVX512-BF16, no AMX: a bf16 matmul measured {speedup:.2f}x float32 here"
        return speedup >= BF16_MIN_SPEEDUP, f"{what} (bf16 from {BF16_MIN_SPEEDUP}x)"
    return False, "CPU without bf16 matrix units (no AMX, no AVX512-BF16)"


def resolve_compute_dtype(name: str, device: torch.device | str, what: str) -> torch.dtype:
    """``name`` (``"auto"``, ``"float32"``, ``"bfloat16"``, ``"float16"``) as a torch dtype on
    ``device``; ``"auto"`` picks bfloat16 where :func:`fast_bf16` says so, else float32, and logs
    ``what`` got which dtype and why, once per process."""
    if name != "auto":
        return {"float32": torch.float32, "bfloat16": torch.bfloat16,
                "float16": torch.float16}[name]
    forced = os.environ.get(ENV_OVERRIDE, "")
    if forced:
        if forced not in _OVERRIDES:
            raise ConfigError(f"environment variable {ENV_OVERRIDE}={forced!r}: expected one of "
                              f"{', '.join(_OVERRIDES)} (or unset for the detection)")
        dtype, reason = _OVERRIDES[forced], f"{ENV_OVERRIDE}={forced}"
    else:
        fast, reason = fast_bf16(device)
        dtype = torch.bfloat16 if fast else torch.float32
    key = (what, str(torch.device(device)), str(dtype))
    if key not in _LOGGED and rank() == 0:
        _LOGGED.add(key)
        log.info("%s: dtype auto -> %s on %s (%s)", what, str(dtype).removeprefix("torch."),
                 torch.device(device), reason)
    return dtype
