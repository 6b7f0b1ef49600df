"""The shipped real-pair recipe as a user runs it: the commands in the header of
``configs/offpolicy_real_cpu.yaml``, copied as written (data prepare, projection build, train),
in a scratch working directory, with only ``train.steps`` shortened (2 steps; a real step is ~5 s).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from xdistill.assets import asset_dir
from xdistill.metrics import read_metrics

pytestmark = [pytest.mark.real, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "offpolicy_real_cpu.yaml"


def header_commands() -> list[list[str]]:
    out = []
    for line in CONFIG.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if text.startswith("xdistill "):
            text = text.replace("~/.cache/xdistill/assets", str(asset_dir()))
            out.append(shlex.split(text))
    return out


def test_real_config_header_commands_run_as_written(tmp_path):
    cmds = header_commands()
    assert [c[:2] for c in cmds] == [["xdistill", "data"], ["xdistill", "projection"],
                                     ["xdistill", "train"]], cmds
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=os.pathsep.join(
                   filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])))
    for cmd in cmds:
        cmd = [sys.executable, "-m", "xdistill"] + cmd[1:]
        if cmd[4:6] == ["offpolicy", "--config"]:
            cmd[6] = str(REPO / cmd[6])           # the repo's config, run from another directory
            cmd += ["train.steps=2", "checkpoint.every=0"]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, f"{shlex.join(cmd)}\n{proc.stderr[-4000:]}"
    run = tmp_path / "runs" / "real_cpu" / "run"
    records = [r for r in read_metrics(run / "metrics.jsonl") if "gemma/loss" in r]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["loss"] is not None and r["gemma/loss"] > 0 for r in records)
    assert (run / "export" / "config.json").exists()
