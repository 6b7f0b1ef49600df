"""dtype ``auto`` (xdistill/precision.py): bfloat16 where the device has fast bf16 matrix units.

What the CPU offers is mocked here (``cpu_bf16_units``, ``cuda_bf16_supported``,
``bf16_matmul_speedup``): AMX present, AVX512-BF16 only (bf16 slower or faster by measurement),
neither, and a CUDA device with and without native bf16. The teacher and the
student resolve ``auto`` through it; an explicit dtype always wins; the environment override that
``tests/conftest.py`` sets is unset in these tests.
"""

from __future__ import annotations

import logging

import pytest
import torch

from xdistill import precision
from xdistill.errors import ConfigError
from xdistill.student.config import StudentConfig

UNITS = {"amx": {"amx": True, "avx512_bf16": True},
         "avx512_bf16": {"amx": False, "avx512_bf16": True},
         "none": {"amx": False, "avx512_bf16": False}}


@pytest.fixture
def cpu_units(monkeypatch):
    """``cpu_units("amx" | "avx512_bf16" | "none")`` makes torch appear to report those units."""
    monkeypatch.delenv(precision.ENV_OVERRIDE, raising=False)
    monkeypatch.setattr(precision, "_LOGGED", set())

    def set_units(name: str) -> None:
        monkeypatch.setattr(precision, "cpu_bf16_units", lambda: dict(UNITS[name]))
    return set_units


@pytest.mark.parametrize("units, speedup, want", [
    ("amx", 0.5, torch.bfloat16), ("avx512_bf16", 0.62, torch.float32),
    ("avx512_bf16", 4.4, torch.bfloat16), ("none", 9.0, torch.float32)])
def test_auto_on_cpu_follows_the_reported_units(cpu_units, monkeypatch, units, speedup, want):
    """AMX: bf16; neither unit: float32; AVX512-BF16 alone: what the matmul probe measures
    (0.62x on a Xeon VM, 4.4x on an AMD EPYC VM); the probe is asked only in that case."""
    cpu_units(units)
    asked = []
    monkeypatch.setattr(precision, "bf16_matmul_speedup", lambda: asked.append(1) or speedup)
    assert precision.resolve_compute_dtype("auto", "cpu", "x") == want
    fast, reason = precision.fast_bf16("cpu")
    assert fast == (want == torch.bfloat16)
    assert ("AMX" in reason) and (units != "avx512_bf16" or "AVX512-BF16" in reason)
    assert bool(asked) == (units == "avx512_bf16")
    if asked:
        assert f"{speedup:.2f}x float32" in reason


def test_the_matmul_probe_measures_once_per_process(monkeypatch):
    monkeypatch.setattr(precision, "_SPEEDUP", [])
    first = precision.bf16_matmul_speedup()
    assert 0 < first < float("inf") and precision.bf16_matmul_speedup() == first
    assert precision._SPEEDUP == [first]


def test_the_matmul_probe_runs_on_one_thread_and_restores_the_count(monkeypatch):
    """Busy cores made a 2-thread probe read 1.5x on a 4x CPU (auto flipped to float32): the
    probe times single-threaded matmuls, then gives the process its thread count back."""
    monkeypatch.setattr(precision, "_SPEEDUP", [])
    seen, real_mm = [], torch.mm
    monkeypatch.setattr(torch, "mm", lambda x, y: seen.append(torch.get_num_threads())
                        or real_mm(x, y))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        precision.bf16_matmul_speedup()
        assert seen and set(seen) == {1} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("supported, want", [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_on_cuda(cpu_units, monkeypatch, supported, want):
    cpu_units("none")
    monkeypatch.setattr(precision, "cuda_bf16_supported", lambda: supported)
    assert precision.resolve_compute_dtype("auto", "cuda:0", "x") == want
    cpu_units("amx")  # the CPU's units do not matter for a CUDA device
    assert precision.resolve_compute_dtype("auto", "cuda", "x") == want


@pytest.mark.parametrize("units", ["amx", "none"])
def test_explicit_dtype_always_wins(cpu_units, units):
    cpu_units(units)
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16),
                        ("float16", torch.float16)):
        assert precision.resolve_compute_dtype(name, "cpu", "x") == dtype


def test_choice_and_reason_logged_once(cpu_units, caplog):
    cpu_units("amx")
    logger = logging.getLogger("xdistill")  # init_logging() may have stopped propagation
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="xdistill"):
            for _ in range(3):
                precision.resolve_compute_dtype("auto", "cpu", "teacher 'g'")
    finally:
        logger.removeHandler(caplog.handler)
    records = {id(r): r for r in caplog.records}.values()  # seen once or twice (propagation)
    lines = [r.getMessage() for r in records if "dtype auto" in r.getMessage()]
    assert lines == ["teacher 'g': dtype auto -> bfloat16 on cpu (CPU with AMX-BF16 tiles "
                     "(torch/oneDNN report AMX))"]


def test_environment_override(cpu_units, monkeypatch):
    cpu_units("amx")
    monkeypatch.setenv(precision.ENV_OVERRIDE, "float32")
    assert precision.resolve_compute_dtype("auto", "cpu", "x") == torch.float32
    assert precision.resolve_compute_dtype("bfloat16", "cpu", "x") == torch.bfloat16
    monkeypatch.setenv(precision.ENV_OVERRIDE, "fp8")
    with pytest.raises(ConfigError, match=precision.ENV_OVERRIDE):
        precision.resolve_compute_dtype("auto", "cpu", "x")


def test_this_machines_units_are_read_from_torch():
    units = precision.cpu_bf16_units()
    assert set(units) == {"amx", "avx512_bf16"} and all(isinstance(v, bool) for v in units.values())


@pytest.mark.parametrize("units, compute", [("amx", torch.bfloat16), ("none", torch.float32)])
def test_student_compute_dtypes(cpu_units, units, compute):
    """param_dtype auto: bf16 compute with float32 master weights and float32 reduction on a
    device with bf16 units, plain float32 elsewhere; explicit values as before."""
    cpu_units(units)
    assert StudentConfig().compute_dtypes("cpu") == (compute, torch.float32)
    assert StudentConfig(param_dtype="").compute_dtypes("cpu") == (torch.float32, torch.float32)
    assert StudentConfig(param_dtype="bfloat16").compute_dtypes("cpu") == (torch.bfloat16,) * 2
    assert StudentConfig(param_dtype="bfloat16", reduce_dtype="float32").compute_dtypes("cpu") \
        == (torch.bfloat16, torch.float32)
    # bf16 master weights: auto never widens them
    assert StudentConfig(dtype="bfloat16").compute_dtypes("cpu") == (torch.bfloat16,) * 2


@pytest.mark.parametrize("units, weights", [("amx", torch.bfloat16), ("avx512_bf16", torch.float32)])
def test_teacher_auto_weights_and_float32_logits(cpu_units, monkeypatch, tmp_path, units, weights):
    """A teacher saved in float32 loads as bfloat16 under auto on a CPU with AMX (float32
    otherwise), and its full logits are float32 either way, close to the float32 model's."""
    from xdistill.student.model import build_causal_lm
    from xdistill.teacher import TeacherConfig, TeacherRequest, TeacherWorker

    cpu_units(units)
    monkeypatch.setattr(precision, "bf16_matmul_speedup", lambda: 0.62)  # as on the Xeon VM
    model = build_causal_lm("llama", dict(vocab_size=200, hidden_size=16, intermediate_size=32,
                                          num_hidden_layers=1, num_attention_heads=2,
                                          num_key_value_heads=1), seed=0)
    model.save_pretrained(str(tmp_path / "t"))
    worker = TeacherWorker(TeacherConfig(name="t", model=str(tmp_path / "t")))
    assert next(worker.model.parameters()).dtype == weights and worker.split is not None
    ids = torch.randint(0, 200, (2, 9), generator=torch.Generator().manual_seed(0))
    out = worker.forward(TeacherRequest(0, ids, torch.ones_like(ids, dtype=torch.bool)))
    assert out.logits_BTtV.dtype == torch.float32
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    tol = 1e-5 if weights == torch.float32 else 5e-2
    torch.testing.assert_close(out.logits_BTtV, ref, rtol=tol, atol=tol)
