"""The off-policy trainer on one CUDA GPU (skipped without one; run by ``tools/gpu_check.py``).

The tiny 2-teacher config of ``tests/train/conftest.py`` (a cross-tokenizer pkl teacher and a
same-tokenizer forward-KL teacher) with the student and both teachers on ``cuda``:

* a run killed after its step-3 checkpoint and resumed ends where the uninterrupted run ends;
* teachers in subprocesses (outputs over CUDA IPC) train as in-process teachers do;
* FSDP2 over NCCL with one rank (``torchrun``) and bf16 mixed precision: the loss falls, every
  metric is finite and the export holds float32 master weights.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

_here = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("train_conftest_gpu", _here / "conftest.py")
helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helpers)

pytestmark = [pytest.mark.gpu, pytest.mark.integration]


def _cuda_config(assets: dict, out: Path, placement: str) -> dict:
    cfg = helpers.base_config(assets, out)
    cfg["train"]["device"] = "cuda"
    for t in cfg["teachers"]:
        t["worker"].update(device="cuda", placement=placement)
    cfg["checkpoint"].update(every=3, export_hf=True)
    return cfg


def _train(tmp: Path, name: str, cfg: dict, expect_rc: int = 0, torchrun: bool = False):
    path = helpers.write_config(tmp / f"{name}.yaml", cfg)
    args = ["train", "offpolicy", "--config", str(path)]
    if torchrun:
        from distributed_helpers import free_port

        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
               "--master_port", str(free_port()), "-m", "xdistill.cli", *args]
        proc = subprocess.run(cmd, env=helpers._env(), cwd=str(helpers.REPO),
                              capture_output=True, text=True, timeout=300)
    else:
        proc = helpers.run_cli(args)
    assert proc.returncode == expect_rc, f"rc {proc.returncode}\n{proc.stderr[-6000:]}"
    return proc


_weights, _records = helpers.exported_weights, helpers.train_records


def test_cuda_run_kill_and_resume(tmp_path, tiny_assets):
    full = _cuda_config(tiny_assets, tmp_path / "full", "inprocess")
    _train(tmp_path, "full", full)
    recs = _records(tmp_path / "full")
    assert [r["step"] for r in recs] == list(range(1, 7))
    assert all(math.isfinite(r[k]) for r in recs for k in ("loss", "cross/loss", "same/loss"))
    assert recs[-1]["loss"] < recs[0]["loss"]
    cut = json.loads(json.dumps(full))
    cut["train"].update(out_dir=str(tmp_path / "cut"), stop_after=3)
    _train(tmp_path, "cut", cut, expect_rc=3)
    cut["train"]["stop_after"] = 0
    assert "resumed from" in _train(tmp_path, "cut", cut).stderr
    wa, wb = _weights(tmp_path / "full"), _weights(tmp_path / "cut")
    # CUDA kernels may reduce in another order after a restart: fp32 tolerance, not bitwise
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-5, atol=1e-6)
    for a, b in zip(recs, _records(tmp_path / "cut")):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5), a["step"]


def test_cuda_ipc_teachers_in_the_trainer(tmp_path, tiny_assets):
    """Both teachers in subprocesses on the GPU: their outputs reach the student over CUDA IPC,
    and the run trains as the in-process one does (same losses within bf16-free fp32 noise)."""
    cfg = _cuda_config(tiny_assets, tmp_path / "ipc", "subprocess")
    cfg["checkpoint"].update(every=0, export_hf=False)
    ref = _cuda_config(tiny_assets, tmp_path / "ref", "inprocess")
    ref["checkpoint"].update(every=0, export_hf=False)
    proc = _train(tmp_path, "ipc", cfg)
    assert "cuda_ipc" in proc.stderr, proc.stderr[-3000:]
    _train(tmp_path, "ref", ref)
    for a, b in zip(_records(tmp_path / "ref"), _records(tmp_path / "ipc")):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4), a["step"]


def test_fsdp2_nccl_one_rank_bf16_compute(tmp_path, tiny_assets):
    cfg = _cuda_config(tiny_assets, tmp_path / "nccl", "inprocess")
    cfg["student"].update(param_dtype="bfloat16", reduce_dtype="float32")
    cfg["train"]["steps"] = 8
    _train(tmp_path, "nccl", cfg, torchrun=True)
    recs = _records(tmp_path / "nccl")
    assert len(recs) == 8 and all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"])
                                  for r in recs)
    assert recs[-1]["loss"] < recs[0]["loss"]
    assert all(w.dtype == torch.float32 for w in _weights(tmp_path / "nccl").values())
