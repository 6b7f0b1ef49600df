"""The watched child runs of the quality harness: progress lines from a growing metrics.jsonl,
one clear error (naming the log) for a child that exits non-zero, stall detection by lack of
output (no wall-clock limit on a child that makes progress), cancellation, and the same through
the real entry script (``benchmarks/quality/run.py --short`` with a tiny stall limit)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from toyq.runner import RunFailed, Watch, format_duration, last_error_line, watch_process

pytestmark = pytest.mark.integration  # starts processes

FAST = Watch(report_every=0.3, stall_s=3.0, poll_s=0.05)
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "quality" / "run.py"


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_progress_lines_read_the_growing_metrics(tmp_path):
    """A child writing a record every 0.1 s (10 steps each, like a trainer's log_every) is
    reported with step/total, steps per second and an ETA, and is never stopped for its
    duration (4 s, longer than the stall limit of 2 s: it keeps writing; the limit leaves a
    loaded machine time to start the child)."""
    metrics = tmp_path / "metrics.jsonl"
    code = (f"import json, time\n"
            f"f = open({str(metrics)!r}, 'a')\n"
            f"for k in range(1, 41):\n"
            f"    time.sleep(0.1)\n"
            f"    f.write(json.dumps({{'step': 10 * k, 'time': time.time()}}) + '\\n')\n"
            f"    f.flush()\n")
    lines = []
    watch_process(_py(code), tmp_path / "run.log", label="arm seed 0", total_steps=400,
                  metrics_path=metrics, watch=Watch(report_every=0.3, stall_s=2.0, poll_s=0.05),
                  log=lines.append)
    assert len(lines) >= 2 and all(x.startswith("[arm seed 0] ") for x in lines)
    stepped = [x for x in lines if "step " in x]
    assert stepped, lines
    last = stepped[-1]
    assert "/400 (" in last and "steps/s" in last and "ETA" in last and "elapsed" in last
    rate = float(last.split(" steps/s")[0].split("| ")[-1])
    assert 5 < rate < 150  # 10 steps per ~0.1 s (a loaded machine stretches the sleeps)


def test_failing_child_is_one_error_naming_the_log(tmp_path):
    code = ("import sys\n"
            "print('step 1 | loss 3.0')\n"
            "raise ValueError('bad value in row 7')\n")
    log = tmp_path / "run.log"
    with pytest.raises(RunFailed) as info:
        watch_process(_py(code), log, label="ce seed 0", watch=FAST, log=lambda *_: None)
    msg = str(info.value)
    assert msg.startswith("ce seed 0: `")
    assert "failed (exit 1): ValueError: bad value in row 7" in msg
    assert msg.endswith(f"Read the log: {log}") and "Traceback" in log.read_text()
    assert "Traceback" not in msg and info.value.log_path == log


def test_stalled_child_is_killed_with_one_message(tmp_path):
    """No output for longer than stall_s: killed (its pid is gone), one message that names the
    log, the metrics file and where the run was."""
    pid_file = tmp_path / "pid"
    code = (f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
            "time.sleep(60)\n")
    t0 = time.monotonic()
    with pytest.raises(RunFailed) as info:
        watch_process(_py(code), tmp_path / "run.log", label="teacher_big", total_steps=3000,
                      metrics_path=tmp_path / "metrics.jsonl",
                      watch=Watch(report_every=10, stall_s=1.0, poll_s=0.05), log=lambda *_: None)
    assert time.monotonic() - t0 < 20
    msg = str(info.value)
    assert msg.startswith("teacher_big: stuck, killed: no new output in ")
    assert "for 1s (at startup, before step 1)" in msg and "--stall-s" in msg
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_cancel_stops_a_running_child(tmp_path):
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    with pytest.raises(RunFailed) as info:
        watch_process(_py("import time; time.sleep(60)"), tmp_path / "run.log", label="alm seed 0",
                      watch=Watch(stall_s=60, poll_s=0.05), log=lambda *_: None, cancel=cancel)
    assert info.value.cancelled and "cancelled" in str(info.value)


def test_last_error_line_and_durations(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("step 1\nxdistill: error: data.paths: no such file 'x'\n")
    assert last_error_line(log) == "xdistill: error: data.paths: no such file 'x'"
    log.write_text('Traceback (most recent call last):\n  File "a.py", line 1\n    x()\n'
                   "RuntimeError: boom\n")
    assert last_error_line(log) == "RuntimeError: boom"
    assert last_error_line(tmp_path / "missing.log") == "(no log)"
    assert [format_duration(s) for s in (4.4, 65, 3725)] == ["4s", "1m05s", "1h02m"]


def test_short_run_stall_is_one_error_line(tmp_path):
    """The real entry script, run by its path from a directory that is not the checkout (the
    script's folder makes ``toyq`` importable, no path setup), with a tiny stall limit: the
    teacher's trainer child (silent while it imports torch) is detected as stuck; the script
    prints one ``error:`` message naming the log, no traceback, exit code 1."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--short", "--out", "short", "--cache",
                           str(tmp_path / "cache"), "--stall-s", "0.2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "stuck, killed" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and "Read the log: " in proc.stderr
    assert "[prepare] teacher_big: training 3000 steps" in proc.stdout


def test_a_finished_run_linked_from_another_study_is_the_same_run(tmp_path):
    """check_same_config compares existing paths after resolving links: a run folder linked
    into another study (its CE warm start linked too) is reused; a different warm start or
    another setting is still an error."""
    import yaml

    from toyq.harness import check_same_config

    old_ce, other_ce = tmp_path / "v11" / "ce" / "export", tmp_path / "other" / "export"
    old_ce.mkdir(parents=True)
    other_ce.mkdir(parents=True)
    run = tmp_path / "v11" / "arm" / "seed1"
    run.mkdir(parents=True)
    cfg = {"student": {"path": str(old_ce)}, "optim": {"lr": 1e-3},
           "train": {"steps": 5, "out_dir": str(run)}}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "v12" / "ce").mkdir(parents=True)
    (tmp_path / "v12" / "ce" / "export").symlink_to(old_ce, target_is_directory=True)
    (tmp_path / "v12" / "arm").mkdir()
    (tmp_path / "v12" / "arm" / "seed1").symlink_to(run, target_is_directory=True)
    linked = tmp_path / "v12" / "arm" / "seed1"
    check_same_config(linked, {**cfg, "student": {"path": str(tmp_path / "v12" / "ce" /
                                                              "export")},
                               "train": {"steps": 5, "out_dir": str(linked)}})
    for bad in ({**cfg, "student": {"path": str(other_ce)}}, {**cfg, "optim": {"lr": 2e-3}}):
        with pytest.raises(RuntimeError, match="another config"):
            check_same_config(linked, bad)
