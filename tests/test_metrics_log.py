"""metrics.jsonl writer/reader and logging helpers."""

import json
import math

import pytest
import torch

from xdistill.errors import XDistillError
from xdistill.log import warn_once
from xdistill.metrics import MetricsWriter, format_metrics, read_metrics


def test_metrics_roundtrip(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    with MetricsWriter(path, echo=False) as writer:
        writer.write(1, {"loss": torch.tensor(2.5), "bad": math.nan, "per_teacher": {"a": 0.5}})
        writer.write(2, {"loss": 2.0})
    records = read_metrics(path)
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["loss"] == 2.5 and records[0]["bad"] is None
    assert records[0]["per_teacher"] == {"a": 0.5}
    for line in path.read_text().splitlines():
        json.loads(line)


def test_disabled_writer_writes_nothing(tmp_path):
    MetricsWriter(tmp_path / "m.jsonl", enabled=False).write(1, {"loss": 1.0})
    assert not (tmp_path / "m.jsonl").exists()


def test_read_metrics_errors(tmp_path):
    with pytest.raises(XDistillError, match="does not exist"):
        read_metrics(tmp_path / "none.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1}\nnot json\n')
    with pytest.raises(XDistillError, match="bad.jsonl:2"):
        read_metrics(bad)


def test_format_metrics():
    line = format_metrics(3, {"loss": 1.23456, "tok/s": 123456.0})
    assert line == "step 3 | loss 1.235 | tok/s 123456"


def test_eval_console_line_shows_the_eval_metrics():
    """An eval record has none of the training console keys: its line once said only 'step N'.
    The writer is told what the record is (no guessing from key prefixes)."""
    record = {"eval/loss": 2.5, "eval/bpb": 1.25, "eval/tokens": 512}
    line = format_metrics(20, record, keys=["loss", "lr"], evaluation=True)
    assert line == "eval step 20 | eval/loss 2.5 | eval/bpb 1.25 | eval/tokens 512"
    assert format_metrics(3, {"loss": 1.0, "lr": 0.1, "x": 2}, keys=["loss"]) == "step 3 | loss 1"
    assert format_metrics(3, {"loss": 1.0, "x": 2}, keys=["loss"], evaluation=True) == (
        "eval step 3 | loss 1 | x 2")


def test_writer_echoes_an_evaluation_record_as_such(tmp_path, monkeypatch):
    lines = []

    class Console:
        def info(self, line):
            lines.append(line)

    monkeypatch.setattr("xdistill.metrics.get_logger", lambda name: Console())
    with MetricsWriter(tmp_path / "m.jsonl", console_keys=["loss"]) as writer:
        writer.write(2, {"loss": 1.5, "lr": 0.1})
        writer.write(2, {"eval/loss": 2.5}, evaluation=True)
    assert lines == ["step 2 | loss 1.5", "eval step 2 | eval/loss 2.5"]
    assert [r.get("eval/loss") for r in read_metrics(tmp_path / "m.jsonl")] == [None, 2.5]


def test_warn_once(caplog):
    import logging

    logger = logging.getLogger("xdistill.test_warn_once")
    logger.propagate = True
    with caplog.at_level(logging.WARNING, logger="xdistill.test_warn_once"):
        warn_once("careful", logger)
        warn_once("careful", logger)
    assert [r.message for r in caplog.records].count("careful") == 1


def test_console_log_follows_a_swapped_stderr(monkeypatch):
    """The console handler writes to the current sys.stderr: lines reach a stream swapped in
    after init_logging (a test's capture), and a closed earlier stream is never written."""
    import io
    import logging

    from xdistill import log

    logger = logging.getLogger("xdistill")
    saved = list(logger.handlers)
    monkeypatch.setattr(log, "_CONFIGURED", False)
    first = io.StringIO()
    monkeypatch.setattr("sys.stderr", first)
    try:
        for h in saved:
            logger.removeHandler(h)
        log.init_logging()
        first.close()
        second = io.StringIO()
        monkeypatch.setattr("sys.stderr", second)
        log.get_logger().info("reaches the new stream")
        assert "reaches the new stream" in second.getvalue()
    finally:
        for h in list(logger.handlers):
            logger.removeHandler(h)
        for h in saved:
            logger.addHandler(h)
