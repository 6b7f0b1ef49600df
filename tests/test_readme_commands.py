"""The README's shell commands run as written, in a scratch working directory that looks like the
repository root (``configs/`` linked, the user's ``my_corpus.jsonl`` written).

Every fenced block of the README is scanned; a line whose first word is ``xdistill``, ``python`` or
``torchrun`` is run, in README order. Not run, on purpose: ``make test`` (this test is part of it;
it is also the install step: venv, package, assets) and ``make demo`` (too long: minutes of
training; the demo's code has its own tests in ``tests/demo`` and ``tests/test_cli.py``).

Only the step budget is shortened: ``train.steps=2`` is appended to each training command, all of
which already show dotted overrides in the README (a later override wins). One torchrun line
starts 2 ranks; every command runs with more than one thread and no ``OMP_NUM_THREADS``. The
off-policy run's console must show its evaluation line (``eval step 2 | eval/...``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


RUN = ("xdistill", "python", "torchrun")
NOT_RUN = {"make test": "this test is part of it (and it is the install step)",
           "make demo": "minutes of training; tested in tests/demo and tests/test_cli.py"}


def readme_commands() -> list[str]:
    lines = []
    for block in fenced_blocks(ROOT / "README.md"):
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            if line.split()[0] == "make":
                assert line in NOT_RUN, f"a README make command this test does not know: {line}"
            elif line.split()[0] in RUN:
                lines.append(line)
    return lines


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_argv(line: str) -> list[str]:
    argv = shlex.split(line)
    if argv[0] == "xdistill":
        argv = [sys.executable, "-m", "xdistill"] + argv[1:]
    elif argv[0] == "python":
        argv = [sys.executable] + argv[1:]
    elif argv[0] == "torchrun":
        argv = [sys.executable, "-m", "torch.distributed.run", "--master_port", str(_port())] \
            + argv[1:]
    if "train" in argv and ("offpolicy" in argv or "onpolicy" in argv):
        assert any("=" in a and "." in a.split("=")[0] for a in argv), \
            f"a README training command without overrides (train.steps=2 would be new): {line}"
        argv.append("train.steps=2")
    return argv


def fenced_blocks(path: Path, lang: str = "") -> list[str]:
    """The fenced code blocks of a markdown file (only those opened with ```<lang> if given)."""
    blocks = []
    for block in path.read_text(encoding="utf-8").split("```")[1::2]:
        first, _, body = block.partition("\n")
        if not lang or first.strip() == lang:
            blocks.append(body)
    return blocks


def scratch_root(tmp_path: Path) -> dict:
    """``tmp_path`` made to look like the repository root (``configs/`` linked); returns the
    environment the documented commands run with (repository first on ``PYTHONPATH``, no hub, no
    ``OMP_NUM_THREADS``)."""
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "WORLD_SIZE")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join(
                   filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])))
    return env


def test_readme_commands_run_as_written(tmp_path):
    lines = readme_commands()
    assert any(line.startswith("torchrun ") for line in lines)
    assert sum(" train " in f" {line} " for line in lines) >= 3
    env = scratch_root(tmp_path)
    (tmp_path / "my_corpus.jsonl").write_text("".join(
        json.dumps({"text": f"Document {i}: the quick brown fox, {i * 7} times."}) + "\n"
        for i in range(20)), encoding="utf-8")
    took, output = {}, {}
    for line in lines:
        argv = as_argv(line)
        t0 = time.perf_counter()
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=900)
        took[line], output[line] = round(time.perf_counter() - t0, 1), proc.stdout + proc.stderr
        assert proc.returncode == 0, f"README command failed: {line}\n{proc.stderr[-4000:]}"
    print("README command seconds:", json.dumps(took, indent=1))
    offpolicy = next(line for line in lines if line.startswith("xdistill train offpolicy"))
    assert re.search(r"eval step 2 \| eval/\w+ [0-9.]+", output[offpolicy]), output[offpolicy][-3000:]
    for run in ("offpolicy_tiny_cpu", "tiny_2ranks", "onpolicy_tiny_cpu"):
        metrics = tmp_path / "runs" / run / "metrics.jsonl"
        steps = [json.loads(x).get("step") for x in metrics.read_text().splitlines()]
        assert 2 in steps, (run, steps)
    assert (tmp_path / "proj.npz").is_file() and (tmp_path / "data" / "index.json").is_file()
