"""``benchmarks/quality/stop_units.py`` (an exploratory diagnostic): the stop-fraction trajectory
read from a run's metrics, the per-finish split of the units' log-ratios and advantages (the
same advantages as ``unit_advantages.advantages``), and the block rendered from a record only."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_dir = Path(__file__).resolve().parents[2] / "benchmarks" / "quality"


def _load(monkeypatch):
    monkeypatch.syspath_prepend(str(_dir))          # as when the script runs: its folder
    spec = importlib.util.spec_from_file_location("quality_stop_units", _dir / "stop_units.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# "12." stopped (correct), "13. Q" ran to the length limit (wrong), "x" is not well-formed;
# units as (log p, log q)
BATCH = {"texts": ["12.", "13. Q", "x"], "golds": [12, 12, 12], "finish": ["stop", "length", "stop"],
         "units": [[[-1.0, -0.1], [-0.5, -0.4]], [[-0.7, -9.0], [-0.2, -0.1], [-0.1, -3.1]],
                   [[-1.0, -1.0], [-1.0, -1.0]]]}


def test_by_finish_splits_answers_and_other_units(monkeypatch):
    su = _load(monkeypatch)
    out = su.by_finish([BATCH], 2.0)
    assert out["stop"]["n"] == 1 and out["length"]["n"] == 1      # "x" is not an answer
    assert out["stop"]["answer_r"] == pytest.approx(0.9)
    assert out["length"]["answer_r"] == pytest.approx(-8.3)
    assert out["stop"]["rest_r"] == pytest.approx(0.1)
    assert out["length"]["rest_r"] == pytest.approx(0.1 - 3.0)
    adv = su.ua.advantages(BATCH, "mean", 2.0)               # baseline over all 7 units
    assert out["stop"]["rest_adv"] == pytest.approx(adv[0][1])
    assert out["length"]["rest_adv"] == pytest.approx((adv[1][1] + adv[1][2]) / 2)


def test_trajectory_takes_the_first_logged_step_at_or_after_each(monkeypatch, tmp_path):
    su = _load(monkeypatch)
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (
        {"step": 10, "stop_fraction": 0.3}, {"step": 20, "stop_fraction": 0.1},
        {"step": 40, "stop_fraction": 0.0}, {"step": 40, "eval/accuracy": 0.5})) + "\n")
    got = su.trajectory(path)
    assert got == {"10": 0.3, "20": 0.1, "30": 0.0}          # nothing logged at or after 50


def test_render_reads_only_the_record(monkeypatch):
    su = _load(monkeypatch)
    rows = [{"seed": seed, "arm": arm, "trajectory": {"10": 0.3, "2000": 0.1 * seed},
             "start": {"stop": {"n": 4, "answer_r": 1.0, "rest_r": -0.5, "rest_adv": 1.5},
                       "length": {"n": 6, "answer_r": -3.0, "rest_r": -4.0, "rest_adv": 0.5}}}
            for seed in (1, 2) for arm in su.ARMS]
    text = su.render({"batches": 3, "rows": rows, "arms": su.ARMS, "command": "python x"})
    assert "| S1 | 0.30 | - | - | - | - | - | 0.15 |" in text
    assert "| X4 | stop | 8 | 1.00 | -0.50 | 1.50 |" in text
    assert "| X4 | length | 12 | -3.00 | -4.00 | 0.50 |" in text
    assert "Seeds 1, 2." in text and "command: `python x`" in text


def test_the_sixteenth_protocol_has_its_own_record_and_block(monkeypatch, tmp_path):
    su = _load(monkeypatch)
    assert su.record_path("v13") == su.RECORD
    assert su.record_path("v16").parent.name == "credit24v16"
    assert su.ua.PROTOCOLS["v16"]["arms"] == su.ARMS
    rows = [{"seed": 170, "arm": arm, "trajectory": {}, "start": {}} for arm in su.ARMS]
    text = su.render({"batches": 1, "rows": rows, "arms": su.ARMS, "command": "c",
                      "protocol": "v16"})
    assert "`credit24v16/stop_units.json`" in text
    assert "`credit24v13/stop_units.json`" in su.render({"batches": 1, "rows": rows,
                                                         "arms": su.ARMS, "command": "c"})


def test_the_record_names_the_call_it_was_made_by(monkeypatch):
    """Called from a driver (``main(argv)``), the record's command is that call's, not the
    driver's command line."""
    su = _load(monkeypatch)
    monkeypatch.setitem(su.ua.PROTOCOLS, "v16", {**su.ua.PROTOCOLS["v16"], "arms": {}})
    made = {}
    monkeypatch.setattr(su, "record_and_report",
                        lambda record, measure, *a: made.update(record=measure()) or "")
    monkeypatch.setattr(su.sys, "argv", ["study_v16.py", "--jobs", "2"])
    assert su.main(["--protocol", "v16", "--runs", "runs/q24v16"]) == 0
    assert made["record"]["command"] == ("python benchmarks/quality/stop_units.py --protocol v16 "
                                         "--runs runs/q24v16")
    assert made["record"]["protocol"] == "v16" and made["record"]["rows"] == []
