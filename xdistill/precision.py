"""Compute dtype ``auto``: bfloat16 where the device has fast bf16 matrix units, float32 elsewhere.

:func:`resolve_compute_dtype` turns a config's ``"auto"`` into a torch dtype for one device and
logs the choice and its reason once per process (an explicit dtype never comes here):

* CUDA: bfloat16 when ``torch.cuda.is_bf16_supported()`` (Ampere and newer), else float32;
* CPU: bfloat16 when torch reports **AMX** tiles (``torch.cpu._is_amx_tile_supported()``: Intel
  Sapphire Rapids and newer, with the OS's permission to use them), else float32. AVX512-BF16
  alone is *not* enough. Measured with 2 threads, one process (``benchmarks/RESULTS.md``,
  "dtype auto"): a 1024^3 matmul in bfloat16 vs float32 ran 5.7x faster on a Xeon with AMX
  (1,504 vs 265 GFLOP/s; Gemma-3-270M-shaped forward 2.6x), 0.62x on a Xeon VM with AVX512-BF16
  but no AMX (oneDNN's ``avx512_core_bf16`` kernel, 167 vs 271 GFLOP/s; the real-pair step was
  slower in bf16 there), and 0.22x with oneDNN held to AVX512 without bf16 instructions.

What the CPU offers is read from torch (:func:`cpu_bf16_units`), never from a model or CPU name;
tests replace :func:`cpu_bf16_units` / :func:`cuda_bf16_supported` to check both outcomes.

The environment variable ``XDISTILL_AUTO_DTYPE`` (``float32`` or ``bfloat16``) overrides the
detection for every ``auto`` in the process and the processes it starts (an explicit dtype in a
config still wins). ``tests/conftest.py`` sets it to ``float32`` so that tests comparing runs at
float32 tolerances mean the same on every CPU; the tests of ``auto`` itself unset it.
"""

from __future__ import annotations

import os

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


def cuda_bf16_supported() -> bool:
    """Whether the current CUDA device computes bf16 natively (Ampere and newer)."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


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
        return False, ("CPU with AVX512-BF16 but no AMX: bf16 matmuls measured slower than "
                       "float32 there")
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
