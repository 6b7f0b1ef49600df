"""The real-model evidence study (``benchmarks/real/study.py``, PROTOCOL.md) end to end in its
2-step plumbing mode: every stage runs the real trainer on Gemma-3-270M / SmolLM2-135M, and the
confirmatory table is generated from the raw ``results.json`` with both test families. Slow (a
few minutes on 2 cores): the numbers mean nothing at 2 steps, the plumbing does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.real, pytest.mark.integration, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "real" / "study.py"


def test_smoke_study_runs_every_stage_and_generates_the_table(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    # a stage waits for the stages its rule reads, no more: label smoothing needs the CE rate only
    early = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--smoke",
                            "--stage", "smoothing"], capture_output=True, text=True, env=env,
                           timeout=3600)
    assert early.returncode != 0 and "stage 'smoothing' needs ce_lr first" in early.stderr, \
        early.stderr[-3000:]
    out = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--smoke"],
                         capture_output=True, text=True, env=env, timeout=3600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    state = json.loads((tmp_path / "study.json").read_text())
    assert set(state) == {"ce_lr", "teacher", "pkl_lr", "op_lr", "smoothing", "confirm"}
    # amendment 4 (the default): one cosine candidate per (rate, length), the on-policy rate by
    # the teacher's bits per byte on validation samples under a degeneration line
    assert [c["step"] for c in state["teacher"]["checks"]] == [1, 2]
    assert state["teacher"]["rule"] == "cosine" and state["op_lr"]["degeneration_line"] >= 0.02
    assert "teacher_bpb_on_samples" in state["pkl_lr"]["grid"]["0.0001"]
    raw = json.loads((tmp_path / "evidence" / "results.json").read_text())
    assert sorted(raw["runs"]) == sorted(state["confirm"]["arms"])
    assert all("ood" in r["final"] for arm in raw["runs"].values() for r in arm.values())
    text = (tmp_path / "evidence" / "RESULTS.md").read_text()
    assert "| pkl vs ce |" in text and "| pkl vs self_kl |" in text
    assert "twelfth_night" in text and "out-of-domain bpb" in text
    # amendment 1: on-policy arms at 2 x 64 / 32 = 4 steps, the samples judged by the teacher
    assert {"op_k1", "op_k1_byte_mean_clip"} <= set(raw["runs"])
    op = next(iter(raw["runs"]["op_k1"].values()))
    assert op["curve"][-1]["step"] == 4
    samples = [r["samples"] for arm in raw["runs"].values() for r in arm.values()]
    assert all(s["teacher_bpb_on_samples"] > 0 and 0 <= s["repetition"] <= 1 for s in samples)
    assert "| op_k1 vs pkl |" in text and "teacher bpb on samples" in text
    assert "| op_k1 vs ce |" in text  # the on-policy objective, family C
    assert "against CE only and P-KL" in text and text.count("| op_k1 vs pkl |") == 2
    assert raw["meta"]["args"]["confirm_seeds"] == [110]
