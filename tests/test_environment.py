"""The dev/CI venv must hold the CPU torch wheel, never a CUDA build (pyproject pins)."""

import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def test_torch_is_cpu_build_unless_a_gpu_is_here():
    if torch.cuda.is_available():
        assert torch.version.cuda is not None  # a GPU machine runs its CUDA build
    else:
        assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build"


def test_check_env_script_passes():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "check_env.py")],
                         capture_output=True, text=True, check=True)
    assert " OK" in out.stdout


def test_check_env_accepts_a_cuda_build_with_a_gpu(monkeypatch, capsys):
    """The check only fails a CUDA build on a machine without a GPU (mocked: no GPU here)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_env", ROOT / "tools" / "check_env.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod.torch.version, "cuda", "12.8")
    monkeypatch.delenv("XDISTILL_ALLOW_CUDA", raising=False)
    monkeypatch.setattr(mod.torch.cuda, "is_available", lambda: False)
    assert mod.main() == 1 and "no GPU is usable" in capsys.readouterr().err
    monkeypatch.setattr(mod.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(mod.torch.cuda, "device_count", lambda: 2)
    assert mod.main() == 0 and "2 GPU(s) OK" in capsys.readouterr().out


def test_hub_is_offline_in_tests():
    assert os.environ.get("HF_HUB_OFFLINE") == "1"


def test_ci_runs_make_test():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
