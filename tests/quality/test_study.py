"""The issue-24 study driver (``benchmarks/quality/study.py``): its fixed choice rules and the
stage order. The stages themselves run the harness (``tests/quality`` covers it)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_path = Path(__file__).resolve().parents[2] / "benchmarks" / "quality" / "study.py"
_spec = importlib.util.spec_from_file_location("quality_study", _path)
study = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(study)


def test_warm_start_is_the_first_checkpoint_at_the_threshold():
    curve = [[100, 0.0], [200, 0.31], [300, 0.29], [400, 0.5]]
    assert study.warm_steps(curve, 0.30) == 200
    assert study.warm_steps(curve, 0.45) == 400
    with pytest.raises(SystemExit, match="never reached"):
        study.warm_steps(curve, 0.9)


def test_lr_choice_best_mean_and_ties_to_the_smaller_rate():
    table = {"1e-05": {"mean": 0.40}, "0.0001": {"mean": 0.45}, "0.001": {"mean": 0.45}}
    assert study.choose_lr(table) == pytest.approx(1e-4)
    table["0.001"]["mean"] = 0.46
    assert study.choose_lr(table) == pytest.approx(1e-3)


def test_rank_orders_by_accuracy_and_marks_collapse():
    runs = [{"arm": a, "seed": s, "accuracy": acc, "format_rate": fmt}
            for a, acc, fmt in (("op_k1", 0.5, 0.95), ("op_bpm", 0.6, 0.99), ("op_k3", 0.7, 0.5))
            for s in (0, 1)]
    runs.append({"arm": "op_dpca", "seed": 0, "error": "failed"})
    rows = study.rank(runs, ("op_k1", "op_k3", "op_bpm", "op_dpca"))
    assert [r["arm"] for r in rows] == ["op_k3", "op_bpm", "op_k1"]
    assert [r["collapsed"] for r in rows] == [True, False, False]


def test_byte_credit_arms_share_their_kinds_control():
    assert study.control_arm("op_k1") == "op_k1_same"
    assert study.control_arm("op_dpca_byte") == "op_dpca_same"


def test_a_stage_needs_the_stages_before_it(tmp_path, capsys):
    with pytest.raises(SystemExit, match="needs warm, lr first"):
        study.main(["--out", str(tmp_path), "--stage", "screen"])
    (tmp_path / "study.json").write_text(json.dumps({"warm": {"steps": 10}}))
    with pytest.raises(SystemExit, match="needs lr first"):
        study.main(["--out", str(tmp_path), "--stage", "screen"])
