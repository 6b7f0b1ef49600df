"""CI-sized quality harness: prepare -> teachers (CE-only trainer runs) -> arms -> scores -> report.

A few steps each, tiny models, a 10x10 addition table: this checks the harness path end to end
(tokenizer invariants, teacher training through ``xdistill train offpolicy``, projections, the
generated arm configs for every loss family, greedy scoring, bits per byte, the report), not
quality. The real numbers come from ``python -m benchmarks.quality.run``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.quality import task  # noqa: E402
from benchmarks.quality.arms import ARMS, ArmSettings, arm_config  # noqa: E402
from benchmarks.quality.prepare import PrepConfig  # noqa: E402

TINY_TASK = task.TaskConfig(max_operand=9, n_heldout=20, passes=2, text_fraction=0.2)
TINY_PREP = PrepConfig(task=TINY_TASK, big_layers=1, big_hidden=32, big_steps=4, weak_layers=1,
                       weak_hidden=32, weak_steps=3, batch=8, seq_len=32)
TINY_ARMS = ArmSettings(steps=3, batch=8, seq_len=32, layers=1, hidden=32, eval_batches=1)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from benchmarks.quality.prepare import prepare_all

    return prepare_all(tmp_path_factory.mktemp("quality_prep"), TINY_PREP, log=lambda *_: None)


def test_task_is_deterministic_and_heldout_is_disjoint():
    tr1, held1 = task.split_pairs(TINY_TASK)
    tr2, held2 = task.split_pairs(TINY_TASK)
    assert (tr1 == tr2).all() and (held1 == held2).all()
    assert not {tuple(p) for p in tr1.tolist()} & {tuple(p) for p in held1.tolist()}
    assert len(tr1) + len(held1) == 100
    docs = task.documents(tr1, ["some text"], TINY_TASK, salt=3)
    assert docs == task.documents(tr1, ["some text"], TINY_TASK, salt=3)
    held_lines = {task.problem(a, b) for a, b in held1.tolist()}
    assert not any(line in held_lines for d in docs for line in d.split("\n"))


def test_every_arm_config_is_valid(assets, tmp_path):
    from xdistill.config import load_config
    from xdistill.train.config import OffPolicyConfig, validate_offpolicy
    from xdistill.train.setup import build_plan

    from benchmarks.quality.runner import write_config

    from xdistill.train.onpolicy_config import OnPolicyConfig, validate_onpolicy

    for arm in ARMS:
        path = write_config(arm_config(arm, 0, assets, TINY_ARMS, str(tmp_path / arm)),
                            tmp_path / f"{arm}.yaml")
        if arm == "onpolicy":
            cfg = validate_onpolicy(load_config(OnPolicyConfig, str(path)))
            assert cfg.loss.offpolicy_lambda == 0.5 and cfg.teachers[0].loss.kind == "k1"
            continue
        cfg = validate_offpolicy(load_config(OffPolicyConfig, str(path)))
        plan = build_plan(cfg)  # tokenizers, projection pairs, loss kinds vs tokenizer pairs
        assert len(plan.loss_specs) == len(cfg.teachers)


def test_harness_end_to_end(assets, tmp_path):
    from xdistill.tokenization import load_tokenizer

    from benchmarks.quality.harness import run_harness, uncommon_answer_fraction
    from benchmarks.quality.report import plot_curves, plot_summary, render

    assert load_tokenizer(assets["tok_student"]).family == "byte_bpe"
    assert load_tokenizer(assets["tok_teacher"]).family == "spm"
    for name in ("teacher_big", "teacher_weak"):
        assert 0.0 <= assets[name]["accuracy"] <= 1.0 and math.isfinite(assets[name]["bpb"])
    arms = ["ce", "multi", "onpolicy"]
    result = run_harness(assets, arms, [0], TINY_ARMS, tmp_path, log=lambda *_: None, jobs=2)
    assert set(result["summary"]) == set(arms)
    for r in result["runs"]:
        run_dir = tmp_path / "runs" / r["arm"] / "seed0"
        assert (run_dir / "export" / "config.json").exists()
        metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert metrics[-1]["step"] == TINY_ARMS.steps
        assert r["n"] == TINY_TASK.n_heldout and 0.0 <= r["accuracy"] <= 1.0
        assert math.isfinite(r["bpb"]) and r["bpb"] > 0
    metrics = [json.loads(x) for x in
               (tmp_path / "runs" / "multi" / "seed0" / "metrics.jsonl").read_text().splitlines()]
    teacher_terms = [k for k in metrics[0] if k.endswith("/loss")]  # "multi": both teachers
    assert {"cross/loss", "weak/loss"} <= set(teacher_terms)
    # answers are numbers 0..18: all but the one-digit ones are uncommon for GOLD
    assert 0.4 < uncommon_answer_fraction(assets) < 1.0
    md = render(result, {"note": "smoke"})
    assert "| ce |" in md and "| multi |" in md and "| onpolicy |" in md
    assert plot_summary(result["summary"], tmp_path / "a.png").stat().st_size > 0
    assert plot_curves(tmp_path, arms, 0, tmp_path / "c.png").stat().st_size > 0
    # a second call reuses every finished run
    again = run_harness(assets, arms, [0], TINY_ARMS, tmp_path, log=lambda *_: None)
    assert again["runs"] == result["runs"]


def test_demo_arms_need_only_the_cross_teacher(assets, tmp_path):
    """`xdistill demo distill` prepares only teacher_big: its arms must not touch teacher_weak."""
    from xdistill.demo.distill import DEMO_ARMS

    only_big = {k: v for k, v in assets.items() if k != "teacher_weak"}
    for arm in (*DEMO_ARMS, "onpolicy"):
        cfg = arm_config(arm, 0, only_big, TINY_ARMS, str(tmp_path / arm))
        assert all(t["worker"]["model"] == assets["teacher_big"]["model"] for t in cfg["teachers"])
    with pytest.raises(KeyError):
        arm_config("same_kd", 0, only_big, TINY_ARMS, str(tmp_path / "same_kd"))
