"""The OpenMP wait default (``xdistill/__init__.py``): importing xdistill before torch sets
``GOMP_SPINCOUNT=1000`` unless the environment already chose a wait policy or torch/numba were
imported first (too late then: GNU OpenMP read its variables when it loaded). Fresh interpreters,
since the test session's own environment is fixed (``tests/conftest.py``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = ("import os, sys{pre}; import xdistill; "
         "print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))")


def _env(**extra: str) -> dict[str, str]:
    """This environment without a wait policy (the test session's is fixed), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    return {**env, **extra}


def _run(env_extra: dict[str, str], pre: str = "") -> str:
    env = _env(**env_extra)
    out = subprocess.run([sys.executable, "-c", PROBE.format(pre=pre)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("env_extra, want", [
    ({}, "1000 None"),                                       # the default
    ({"OMP_WAIT_POLICY": "PASSIVE"}, "None PASSIVE"),        # the user's choice wins
    ({"OMP_WAIT_POLICY": "ACTIVE"}, "None ACTIVE"),
    ({"GOMP_SPINCOUNT": "50"}, "50 None"),
])
def test_the_default_spin_count_unless_the_environment_chose(env_extra, want):
    assert _run(env_extra) == want


def test_nothing_is_set_when_torch_was_imported_first():
    assert _run({}, pre="; import torch") == "None None"


def test_a_cli_child_process_inherits_the_default():
    """Teacher subprocesses, loader workers and torchrun ranks are started with this process's
    environment, so they spin the same (and read it before their own torch import)."""
    child = "import os; print(os.environ.get('GOMP_SPINCOUNT'))"
    code = ("import subprocess, sys, xdistill; print(subprocess.run([sys.executable, '-c', "
            f"{child!r}], capture_output=True, text=True).stdout.strip())")
    out = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1000"
