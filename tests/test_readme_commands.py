"""The README's command block ("Then:") runs as written, in a scratch working directory that
looks like the repository root (``configs/`` linked, the user's ``my_corpus.jsonl`` written).

Only the step budget is shortened: ``train.steps=2`` is appended to every training command (a
later override wins). ``make test`` / ``make demo`` are not run here (this *is* ``make test``; the
demo trains for minutes and has its own tests in ``tests/quality``). One torchrun line starts 2
ranks; every command runs with more than one thread and no ``OMP_NUM_THREADS``.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("Then:", 1)[1].split("```", 2)[1]
    lines = []
    for line in block.splitlines():
        line = line.split("  #", 1)[0].strip()
        if line:
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
        argv.append("train.steps=2")
    return argv


def test_readme_commands_run_as_written(tmp_path):
    lines = readme_commands()
    assert any(line.startswith("torchrun ") for line in lines)
    assert sum(" train " in f" {line} " for line in lines) >= 3
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    (tmp_path / "my_corpus.jsonl").write_text("".join(
        json.dumps({"text": f"Document {i}: the quick brown fox, {i * 7} times."}) + "\n"
        for i in range(20)), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "WORLD_SIZE")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(ROOT))
    for line in lines:
        argv = as_argv(line)
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, f"README command failed: {line}\n{proc.stderr[-4000:]}"
    for run in ("offpolicy_tiny_cpu", "tiny_2ranks", "onpolicy_tiny_cpu"):
        metrics = tmp_path / "runs" / run / "metrics.jsonl"
        steps = [json.loads(x).get("step") for x in metrics.read_text().splitlines()]
        assert 2 in steps, (run, steps)
    assert (tmp_path / "proj.npz").is_file() and (tmp_path / "data" / "index.json").is_file()
