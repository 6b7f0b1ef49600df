"""Run one trainer config through the real CLI, watched: progress lines, stall detection, one error.

Every run is a fresh process running the exact command a user types
(``python -m xdistill.cli train offpolicy|onpolicy --config <yaml>``), with ``OMP_NUM_THREADS`` and
``NUMBA_NUM_THREADS`` equal to the config's ``train.num_threads`` and the hub switched off. Its
stdout and stderr go to ``<config>.log``.

While it runs, :func:`watch_process` reads the run's ``metrics.jsonl`` as it grows and prints a
progress line every ``Watch.report_every`` seconds (``step 400/3000 (13%) | 6.1 steps/s | ETA
7m05s``). Nothing kills a run that makes progress, however slow: a run is declared stuck only when
neither its log nor its ``metrics.jsonl`` has grown for ``Watch.stall_s`` seconds; it is then
killed. A run that exits non-zero, stalls, or is cancelled (another run of the same harness
failed) raises :class:`RunFailed`, whose message is one paragraph naming the log file to read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from xdistill.errors import XDistillError


class RunFailed(XDistillError):
    """A watched child run exited non-zero, stalled or was cancelled; the message names its log."""

    def __init__(self, message: str, log_path: Path | None = None, cancelled: bool = False):
        super().__init__(message)
        self.log_path = log_path
        self.cancelled = cancelled


@dataclass(frozen=True)
class Watch:
    """How a child run is watched."""

    # seconds between two progress lines of a running child
    report_every: float = 10.0
    # a child whose log and metrics.jsonl have not grown for this many seconds is killed as stuck
    # (startup, numba compilation and a slow step on a loaded machine all take far less)
    stall_s: float = 600.0
    # seconds between two looks at the child
    poll_s: float = 0.5


def say(text: str) -> None:
    """The default ``log``: print a line and flush it (a piped or ``tee``'d output shows progress
    as it happens, not when a buffer fills)."""
    print(text, flush=True)


def write_config(cfg: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


def child_env(threads: int) -> dict:
    """The environment of a training child: thread pools sized before torch/numba start (numba's
    pool must be small from the start: ``set_num_threads`` only masks threads that keep
    spinning), hub off, no inherited torchrun variables."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), NUMBA_NUM_THREADS=str(threads),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def run_config(cfg: dict, path: Path, *overrides: str, command: str = "offpolicy",
               label: str = "", watch: Watch = Watch(), log=say,
               cancel: threading.Event | None = None) -> Path:
    """Write ``cfg`` to ``path`` and train it with ``xdistill train <command>`` under
    :func:`watch_process`; returns the run's ``metrics.jsonl``. Raises :class:`RunFailed`."""
    write_config(cfg, path)
    train = cfg.get("train", {})
    cmd = [sys.executable, "-m", "xdistill.cli", "train", command, "--config", str(path),
           *overrides]
    metrics = Path(train["out_dir"]) / "metrics.jsonl"
    metrics.unlink(missing_ok=True)  # a fresh run (resume is off): only this run's records count
    watch_process(cmd, path.with_suffix(".log"), label=label or path.parent.name,
                  total_steps=int(train.get("steps") or 0), metrics_path=metrics,
                  env=child_env(int(train.get("num_threads") or 1)), watch=watch, log=log,
                  cancel=cancel)
    return metrics


def watch_process(cmd: list[str], log_path: Path, *, label: str, total_steps: int = 0,
                  metrics_path: Path | None = None, env: dict | None = None,
                  watch: Watch = Watch(), log=say,
                  cancel: threading.Event | None = None) -> None:
    """Run ``cmd`` (output to ``log_path``) until it exits, printing progress; see the module doc.
    Raises :class:`RunFailed` on a non-zero exit, a stall, or ``cancel`` being set."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tracker = _Progress(metrics_path, total_steps)
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        try:
            _wait(proc, log_path, tracker, label, watch, log, cancel)
        finally:
            if proc.poll() is None:  # stalled, cancelled, or the caller was interrupted
                _kill(proc)
    if proc.returncode != 0:
        raise RunFailed(f"{label}: `{_short(cmd)}` failed (exit {proc.returncode}): "
                        f"{last_error_line(log_path)}\nRead the log: {log_path}", log_path)


def _wait(proc, log_path: Path, tracker: _Progress, label: str, watch: Watch, log, cancel):
    t0 = last_report = last_growth = time.monotonic()
    sizes = None
    while proc.poll() is None:
        time.sleep(watch.poll_s)
        now = time.monotonic()
        new_sizes = (_size(log_path), _size(tracker.path))
        if new_sizes != sizes:
            sizes, last_growth = new_sizes, now
        tracker.update()
        if cancel is not None and cancel.is_set():
            raise RunFailed(f"{label}: cancelled (another run failed); log: {log_path}",
                            log_path, cancelled=True)
        if now - last_growth > watch.stall_s:
            _kill(proc)
            raise RunFailed(f"{label}: stuck, killed: no new output in {log_path} or "
                            f"{tracker.path} for {watch.stall_s:.0f}s (at {tracker.where()}). "
                            f"Read the log: {log_path}. A machine this loaded may need a longer "
                            f"stall limit (--stall-s).", log_path)
        if now - last_report >= watch.report_every:
            last_report = now
            log(f"[{label}] {tracker.line(now - t0)}")
    tracker.update()


def _kill(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else -1
    except OSError:
        return -1


def _short(cmd: list[str]) -> str:
    """``xdistill train offpolicy --config X`` for ``python -m xdistill.cli train ...``."""
    if len(cmd) > 2 and cmd[1:3] == ["-m", "xdistill.cli"]:
        return " ".join(["xdistill", *cmd[3:]])
    return " ".join(cmd)


def last_error_line(log_path: Path) -> str:
    """The line that says what went wrong: the last ``xdistill: error:`` line, else the last
    exception line of a traceback, else the last non-empty line of the log."""
    try:
        lines = [x.strip() for x in log_path.read_text(encoding="utf-8", errors="replace")
                 .splitlines() if x.strip()]
    except OSError:
        return "(no log)"
    for line in reversed(lines):
        if line.startswith("xdistill: error:"):
            return line
    if any(x.startswith("Traceback") for x in lines):
        for line in reversed(lines):
            if not line.startswith(("File ", "^", "~", "Traceback", "During handling")):
                return line
    return lines[-1] if lines else "(empty log)"


def format_duration(seconds: float) -> str:
    """``45s``, ``7m05s``, ``1h02m``."""
    s = int(round(max(seconds, 0)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class _Progress:
    """The run's ``metrics.jsonl`` read as it grows: steps, and the step rate over the last
    records (the trainer writes one record every ``train.log_every`` steps)."""

    def __init__(self, path: Path | None, total: int):
        self.path, self.total = path, total
        self._offset, self._points = 0, []  # [(wall time, step)] of the records seen

    def update(self) -> None:
        if self.path is None or not self.path.exists():
            return
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # only complete lines
        self._offset += end
        for raw in data[:end].splitlines():
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            if "step" in rec and "time" in rec:
                self._points.append((float(rec["time"]), int(rec["step"])))

    def where(self) -> str:
        return f"step {self._points[-1][1]}" if self._points else "startup, before step 1"

    def rate(self) -> float | None:
        """Steps per second over the records of the last ~60 s (at least the last two)."""
        pts = self._points
        if len(pts) < 2:
            return None
        t_end = pts[-1][0]
        first = next((p for p in pts if p[0] >= t_end - 60), pts[-2])
        if first == pts[-1]:
            first = pts[-2]
        dt, ds = pts[-1][0] - first[0], pts[-1][1] - first[1]
        return ds / dt if dt > 0 and ds > 0 else None

    def line(self, elapsed: float) -> str:
        if not self._points:
            return f"starting ({format_duration(elapsed)} elapsed)"
        step = self._points[-1][1]
        share = f" ({step / self.total:.0%})" if self.total else ""
        parts = [f"step {step}/{self.total}{share}"]
        rate = self.rate()
        if rate:
            parts.append(f"{rate:.1f} steps/s")
            if self.total:
                parts.append(f"ETA {format_duration((self.total - step) / rate)}")
        parts.append(f"{format_duration(elapsed)} elapsed")
        return " | ".join(parts)
