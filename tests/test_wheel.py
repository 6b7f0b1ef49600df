"""A wheel built from the repository installs in a fresh venv and works from another directory.

The venv gets the wheel only (``--no-deps``); its dependencies come from the test venv's
site-packages through a ``.pth`` file, so nothing is downloaded. The commands run from an empty
temporary directory: they must not need the repository checkout (no ``benchmarks/``,
``tests/`` or ``tools/`` import, no path tricks).
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.integration

# code that lived in the package once and is not product: it must not come back into the wheel
NOT_PRODUCT = ("xdistill/align/reference.py", "xdistill/align/reference_dp.py")


def _run(cmd, cwd, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=str(cwd), env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_wheel_installs_and_runs_outside_the_checkout(tmp_path):
    dist = tmp_path / "dist"
    build = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "--wheel-dir", str(dist), str(REPO)], tmp_path)
    assert build.returncode == 0, build.stderr[-3000:]
    wheels = list(dist.glob("xdistill-*.whl"))
    assert len(wheels) == 1, wheels
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert "xdistill/align/api.py" in names, names
    assert not [n for n in names if n in NOT_PRODUCT or "align_reference" in n], names
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    purelib = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        tmp_path).stdout.strip())
    # the dependencies (torch, transformers, ...) of the test venv, not its xdistill
    deps = [p for p in site.getsitepackages() + [sysconfig.get_paths()["purelib"]]
            if Path(p).is_dir()]
    (purelib / "deps.pth").write_text("\n".join(dict.fromkeys(deps)) + "\n")
    inst = _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps",
                 "--no-index", str(wheels[0])], tmp_path)
    assert inst.returncode == 0, inst.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    where = _run([str(py), "-c", "import xdistill; print(xdistill.__file__)"], elsewhere, env)
    assert where.returncode == 0 and str(env_dir) in where.stdout, where.stdout + where.stderr
    exe = env_dir / "bin" / "xdistill"
    helped = _run([str(exe), "train", "offpolicy", "--help"], elsewhere, env)
    assert helped.returncode == 0 and "--config" in helped.stdout, helped.stderr[-2000:]
    demo = _run([str(exe), "demo", "tokenizers"], elsewhere, env)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-3000:]
    assert "gpt2" in demo.stdout
