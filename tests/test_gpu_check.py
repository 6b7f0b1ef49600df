"""``tools/gpu_check.py``: the bundle for a bare GPU machine is built and small enough to travel,
and the whole check runs on CPU (``--dry-run``) from that bundle, so the script cannot rot
between the rare sessions that are lent a GPU."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_check", REPO / "tools" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("OMP_NUM_THREADS", None)  # as a user runs it: torch picks its threads
    return subprocess.run([sys.executable, str(REPO / "tools" / "gpu_check.py"), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.integration
def test_prepare_then_dry_run_from_the_bundle(tmp_path):
    bundle, out = tmp_path / "bundle", tmp_path / "out"
    proc = _run(["--prepare", str(bundle)], timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    manifest = json.loads((bundle / "MANIFEST.json").read_text())
    assert manifest["bundle_mb"] + manifest["tree_mb"] < gpu_check.BUNDLE_LIMIT_MB
    wheels = sorted(p.name for p in (bundle / "wheels").glob("*.whl"))
    assert [w.split("-")[0] for w in wheels] == sorted(w.split("==")[0] for w in gpu_check.WHEELS)
    with tarfile.open(bundle / "assets.tar.gz") as tar:
        names = set(tar.getnames())
    for tok in gpu_check.TOKENIZERS:
        assert f"tokenizers/{tok}/tokenizer.json" in names
    assert any(n.startswith("corpus/shakespeare/") and n.endswith(".txt") for n in names)
    assert (bundle / "proj_llama3_qwen2.npz").is_file()
    for m in gpu_check.CPU_MODELS:      # the cpu part's configs and tokenizers, no weights
        assert f"models/{m}/config.json" in names and f"models/{m}/tokenizer.json" in names
    assert not any(n.endswith(".safetensors") for n in names)
    assert (bundle / gpu_check.CPU_PROJECTION).is_file()

    proc = _run(["--dry-run", "--bundle", str(bundle), "--out", str(out)], timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    res = json.loads((out / "gpu_check.json").read_text())
    assert res["dry_run"] and set(res["parts"]) == {"env", "tests", "step"}
    assert all(p["rc"] == 0 and not p["timed_out"] for p in res["parts"].values())
    assert res["parts"]["env"]["report"]["torchdata"].startswith("0.11")
    collected = (out / "tests.log").read_text()
    for name in ("test_two_process_handoff_is_bitwise_equal_to_inprocess[logits]",
                 "test_cuda_ipc_slot_reuse_stress", "test_cuda_run_kill_and_resume",
                 "test_cuda_ipc_teachers_in_the_trainer", "test_fsdp2_nccl_one_rank_bf16_compute"):
        assert name in collected, name
    variants = {v["variant"]: v for v in res["parts"]["step"]["variants"]}
    assert set(variants) == {"logits", "topk"}
    for v in variants.values():
        assert v["tokens"] > 0 and v["step_s"] > 0 and all(map(math.isfinite, v["losses"]))
        assert set(v["split"]) == set(gpu_check_step_phases())
    md = (out / "gpu_check.md").read_text()
    assert "dry run on CPU" in md and "| logits |" in md and "| topk |" in md
    assert "[gpu_check] step: running" in proc.stdout or "step|" in proc.stdout  # progress shown


def gpu_check_step_phases():
    spec = importlib.util.spec_from_file_location("gpu_step", REPO / "benchmarks" / "gpu_step.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.PHASES


def test_killed_pytest_is_summarised_from_its_verbose_log(tmp_path):
    (tmp_path / "tests.log").write_text(
        "tests/a.py::test_one PASSED [ 33%]\n"
        "tests/a.py::test_two FAILED [ 66%]\n"
        "tests/b.py::test_three \n")
    s = gpu_check.junit_summary(tmp_path / "junit.xml")  # not written: the run was killed
    assert (s["passed"], s["failed"], s["skipped"]) == (1, 1, 0)
    assert s["failures"][0]["test"] == "tests/a.py::test_two"
    assert s["unfinished"] == "tests/b.py::test_three"


def test_bundle_missing_is_a_clear_error(tmp_path):
    proc = _run(["--dry-run", "--bundle", str(tmp_path / "nope"), "--out", str(tmp_path / "o")],
                timeout=120)
    assert proc.returncode != 0
    assert "--prepare" in proc.stderr and "nope" in proc.stderr


@pytest.mark.slow
def test_cpu_part_dry_run_times_float32_and_auto(tmp_path):
    """``--parts cpu,profile``: the real-pair step on the host CPU with random-init real shapes
    (tiny batch in a dry run), float32 and auto with the teacher's support output, under the
    default OpenMP wait and never spinning, side by side; then the profile of float32 and
    auto."""
    out = tmp_path / "out"
    proc = _run(["--dry-run", "--parts", "env,cpu,profile", "--out", str(out)], timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    md = (out / "cpu_step.md").read_text()
    for variant in ("support", "support_auto", "support@passive", "support_auto@passive"):
        assert f"| {variant} |" in md
    assert "random-initialised" in md
    prof = (out / "profile_step.md").read_text()
    assert "## float32:" in prof and "## auto:" in prof and "| aten::" in prof
    assert "cpu_model" in json.loads((out / "gpu_check.json").read_text())["parts"]["env"]["report"]
