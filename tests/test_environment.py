"""The dev/CI venv must hold the CPU torch wheel, never a CUDA build (pyproject pins)."""

import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def test_torch_is_cpu_build():
    assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build"


def test_check_env_script_passes():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "check_env.py")],
                         capture_output=True, text=True, check=True)
    assert "CPU build" in out.stdout


def test_hub_is_offline_in_tests():
    assert os.environ.get("HF_HUB_OFFLINE") == "1"


def test_ci_runs_make_test():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
