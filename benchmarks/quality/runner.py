"""Run one trainer config through the real CLI: ``xdistill train offpolicy --config <yaml>``.

A fresh process per run (the exact command a user types), with ``OMP_NUM_THREADS`` matching the
config's ``train.num_threads`` and the hub switched off. Failing runs raise with the tail of the
run's output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml


def write_config(cfg: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


def run_config(cfg: dict, path: Path, *overrides: str, timeout: float = 3600,
               command: str = "offpolicy") -> Path:
    """Write ``cfg`` to ``path`` and train it with ``xdistill train <command>``; returns the
    run's ``metrics.jsonl``."""
    write_config(cfg, path)
    threads = str(cfg.get("train", {}).get("num_threads") or 1)
    # NUMBA_NUM_THREADS: numba's pool must be small from the start (set_num_threads only masks
    # threads that still spin between parallel regions); several runs share the cores
    env = dict(os.environ, OMP_NUM_THREADS=threads, NUMBA_NUM_THREADS=threads, HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "xdistill.cli", "train", command, "--config", str(path),
           *overrides]
    log_path = path.with_suffix(".log")
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise RuntimeError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}); log {log_path}:\n"
                           f"{tail}")
    return Path(cfg["train"]["out_dir"]) / "metrics.jsonl"
