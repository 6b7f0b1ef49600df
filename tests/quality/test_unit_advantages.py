"""``benchmarks/quality/unit_advantages.py``: its advantages are the loss's (the same baselines and
clamp as :func:`xdistill.losses.onpolicy.sampled_loss` on the same log-ratios), and the answer
bookkeeping and the generated table follow from a record."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from xdistill.losses.onpolicy import Clamps, sampled_loss

_path = Path(__file__).resolve().parents[2] / "benchmarks" / "quality" / "unit_advantages.py"
_spec = importlib.util.spec_from_file_location("quality_unit_advantages", _path)
units = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(units)

# two samples: "12." (gold 12, correct) and "13." (gold 12, wrong); units as (log p, log q)
BATCH = {"texts": ["12.", "13."], "golds": [12, 12],
         "units": [[[-1.0, -0.1], [-0.5, -0.4]], [[-0.7, -9.0], [-0.2, -0.1], [-0.1, -0.3]]]}


@pytest.mark.parametrize("baseline", units.BASELINES)
def test_advantages_are_the_losses(baseline):
    """-d loss / d log p(u) * count = the advantage the loss gives unit u (same-tokenizer units:
    one student token each, in the script's order)."""
    s = torch.tensor([[0.0, -1.0, -0.5, 0.0], [0.0, -0.7, -0.2, -0.1]], dtype=torch.float64)
    t = torch.tensor([[0.0, -0.1, -0.4, 0.0], [0.0, -9.0, -0.1, -0.3]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    s.requires_grad_(True)
    sampled_loss("k1", s, t, mask, clamps=Clamps(None, 2.0, None), num_valid=1,
                 baseline=baseline).loss.backward()
    want = [[-float(s.grad[b, i]) for i in range(1, 4) if mask[b, i]] for b in range(2)]
    got = units.advantages(BATCH, baseline, 2.0)
    assert [len(r) for r in got] == [2, 3]
    for g_row, w_row in zip(got, want):
        assert g_row == pytest.approx(w_row, abs=1e-12)


def test_summary_counts_answers_and_reinforced_wrong_ones():
    s = units.summarise([BATCH], "mean", 2.0)
    r = [0.9, 0.1, -8.3, 0.1, -0.2]
    mean = sum(r) / 5
    assert (s["answers_correct"], s["answers_wrong"]) == (1, 1)
    assert s["baseline"] == pytest.approx(mean)
    assert s["adv_wrong"] == pytest.approx(-2.0)              # clamped
    assert s["adv_correct"] == pytest.approx(2.0)             # 0.9 + 1.48 -> clamped
    assert s["wrong_reinforced"] == 0.0
    assert s["units_per_sample"] == pytest.approx(2.5)
    assert s["adv_other"] == pytest.approx((min(0.1 - mean, 2.0) + min(0.1 - mean, 2.0)
                                            + min(-0.2 - mean, 2.0)) / 3)
    clipped = units.summarise([BATCH], "clipped_mean", 2.0)
    assert clipped["baseline"] == pytest.approx((0.9 + 0.1 - 2.0 + 0.1 - 0.2) / 5)


def test_render_reads_only_the_record():
    rows = [dict(seed=seed, arm=arm, variant=v, baseline=-1.0 * seed, answers_correct=2,
                 answers_wrong=5, adv_correct=2.0, adv_wrong=-1.0, wrong_reinforced=0.2,
                 adv_other=1.0, units_per_sample=3.0)
            for seed in (1, 2) for arm in units.ARMS for v in units.BASELINES]
    text = units.render({"batches": 4, "rows": rows, "command": "python x"})
    assert "Seeds 1, 2: the ninth protocol's CE students (the arms' common start), 4 rollout" in text
    assert "| A | `mean` | 3.00 | -1.50 (-2.00 .. -1.00) | 2.00 (2.00 .. 2.00) |" in text
    assert "correct/wrong: A 4/10, B 4/10, C 4/10" in text


def test_thirteenth_protocol_rows_render_per_teacher_and_by_tokenizer_group():
    """``--protocol v13``: the eight teachers' arms (S1-S4 same-tokenizer, X1-X4 cross), their
    own record and block, and the group table: each measure's mean over a group's teachers and
    seeds under the ``mean`` baseline, and X - S."""
    arms = units.PROTOCOLS["v13"]["arms"]
    assert arms["S3"] == "op_k1_same_mean_clip_t3" and arms["X1"] == "op_k1_byte_mean_clip"
    assert units.record_path("final", "v13").as_posix().endswith(
        "credit24v13/unit_advantages_final.json")
    rows = [dict(seed=seed, arm=arm, variant=v, baseline=0.0, answers_correct=1,
                 answers_wrong=3, adv_correct=2.0 if arm[0] == "S" else 1.0,
                 adv_wrong=-1.0 - int(arm[1]), wrong_reinforced=0.1, adv_other=0.5,
                 units_per_sample=3.0 if arm[0] == "S" else 2.5)
            for seed in (140, 141) for arm in arms for v in units.BASELINES]
    text = units.render({"batches": 2, "rows": rows, "command": "python x", "protocol": "v13",
                         "arms": arms})
    assert "the thirteenth protocol's CE students" in text
    assert "| X4 | `mean` | 2.50 |" in text and "`credit24v13/unit_advantages.json`" in text
    assert "| adv_correct | 2.000 | 1.000 | -1.000 |" in text
    assert "| adv_wrong | -3.500 | -3.500 | +0.000 |" in text          # -(1 + k), k = 1..4
    assert "| units_per_sample | 3.000 | 2.500 | -0.500 |" in text


@pytest.mark.parametrize("arm", ["op_k1_same_mean_clip", "op_k1_byte_mean_clip"])
def test_score_batches_reads_the_units_the_loss_scores(assets, tmp_path, arm):
    """``score_batches`` on a real continuation arm config (tiny prepared task; the weak teacher,
    over the student's tokenizer, stands in for the CE student): one rollout batch, scored as in
    training, yields per sample the (log p, log q) pairs of its units. The capture once patched a
    module the loss no longer called and the script failed only when a user ran it."""
    from quality_helpers import TINY_ARMS
    from toyq.continued import cont_config
    from toyq.runner import write_config

    out = tmp_path / "runs" / arm / "seed0"
    (tmp_path / "runs" / "ce" / "seed0" / "export").mkdir(parents=True)   # the config's CE path
    path = write_config(cont_config(arm, 0, {**assets, "teacher_same_big": assets["teacher_weak"]},
                                    TINY_ARMS, str(out)), tmp_path / f"{arm}.yaml")
    (batch,) = units.score_batches(path, 1, assets["teacher_weak"]["model"])
    assert len(batch["texts"]) == len(batch["golds"]) == len(batch["units"]) > 0
    pairs = [p for row in batch["units"] for p in row]
    assert pairs and all(len(p) == 2 and p[0] <= 0 and p[1] <= 1e-6 for p in pairs), pairs[:5]
