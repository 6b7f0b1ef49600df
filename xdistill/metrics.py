"""Per-step metrics: one console line and one JSON object per line in ``metrics.jsonl``.

``MetricsWriter(path)`` appends records ``{"step": ..., "time": ..., **metrics}``; values that are
tensors or numpy scalars are converted to Python numbers; non-finite floats are written as
``null`` so the file stays valid JSON. Only rank 0 writes (``enabled=False`` elsewhere).
``read_metrics(path)`` reads the records back (used by ``xdistill plot`` and tests).
"""

from __future__ import annotations

import json
import math
import os
import resource
import time
from pathlib import Path
from typing import Any

from xdistill.config import read_utf8
from xdistill.errors import XDistillError
from xdistill.log import get_logger


def json_safe(value: Any) -> Any:
    """``value`` as metrics.jsonl writes it: tensors and numpy numbers as Python numbers or
    lists, NaN and infinities as ``None`` (strict JSON), dict keys as text."""
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def format_metrics(step: int, metrics: dict[str, Any], keys: list[str] | None = None, *,
                   evaluation: bool = False) -> str:
    """Compact console line: ``step 12 | loss 2.3456 | tok/s 1234 ...``: the ``keys`` the record
    has (all of its keys when it has none of them); an ``evaluation`` record's line is
    ``eval step 12 | ...`` with all of its keys."""
    parts = [f"eval step {step}" if evaluation else f"step {step}"]
    chosen = [] if evaluation else [k for k in keys or [] if k in metrics]
    for key in chosen or list(metrics):
        value = _console_value(metrics[key])
        if isinstance(value, float) and not math.isfinite(value):
            text = str(value)                          # nan, inf, -inf (metrics.jsonl: null)
        elif isinstance(value, float):
            text = f"{value:.4g}"
            if "e+" in text:                           # 9999.7 rounds to 1e+04: write 10000
                text = f"{value:.0f}"
        else:
            text = str(value)
        parts.append(f"{key} {text}")
    return " | ".join(parts)


def _console_value(value: Any) -> Any:
    """A scalar tensor or numpy number as a Python number (non-finite kept), else ``json_safe``."""
    if hasattr(value, "item") and not isinstance(value, (int, float)):
        try:
            value = value.item()
        except (ValueError, RuntimeError):             # not a one-element tensor / array
            pass
    if isinstance(value, float) and not math.isfinite(value):
        return value
    return json_safe(value)


class MetricsWriter:
    """Append-only ``metrics.jsonl`` writer with an optional console echo."""

    def __init__(self, path: str | Path | None, enabled: bool = True, echo: bool = True,
                 console_keys: list[str] | None = None):
        self.path = Path(path) if path is not None else None
        self.enabled = enabled
        self.echo = echo
        self.console_keys = console_keys
        self._file = None
        if self.enabled and self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")

    def write(self, step: int, metrics: dict[str, Any], *, evaluation: bool = False
              ) -> dict[str, Any]:
        """Append one record (``evaluation``: an evaluation's figures, echoed as such)."""
        record = {"step": int(step), "time": time.time(), **json_safe(dict(metrics))}
        if not self.enabled:
            return record
        if self._file is not None:
            self._file.write(json.dumps(record, sort_keys=False) + "\n")
            self._file.flush()
        if self.echo:
            get_logger("metrics").info(format_metrics(step, metrics, self.console_keys,
                                                      evaluation=evaluation))
        return record

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Records of a ``metrics.jsonl`` file: JSON objects with an integer ``step``; anything else
    (a malformed line, another kind of JSON, a record without a step, text that is not UTF-8)
    is an error naming the line."""
    path = Path(path)
    if path.is_dir() and (path / "metrics.jsonl").is_file():
        path = path / "metrics.jsonl"          # a run folder stands for its metrics
    if path.is_dir():
        raise XDistillError(f"metrics file {str(path)!r} is a folder without a metrics.jsonl; "
                            "expected a metrics.jsonl file or a run folder")
    if not path.is_file():
        raise XDistillError(f"metrics file {str(path)!r} does not exist")
    text = read_utf8(path, XDistillError, "is this a metrics.jsonl file?")
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise XDistillError(f"{path}:{number}: not a JSON record ({exc.msg})") from None
        step = record.get("step") if isinstance(record, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            raise XDistillError(f"{path}:{number}: expected a JSON object with an integer "
                                f"'step', got {line.strip()[:80]!r}")
        records.append(record)
    return records


def _proc_status_mb(field: str) -> float | None:
    """A ``kB`` field of ``/proc/self/status`` in MiB; None where ``/proc`` is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def peak_rss_mb() -> float:
    """This process's peak resident set size in MiB (``VmHWM``).

    Not ``getrusage().ru_maxrss``: Linux carries the parent's peak across ``fork`` + ``exec``, so a
    child started from a large process (pytest late in a suite) reports the parent's figure.
    Falls back to ``ru_maxrss`` where ``/proc`` is missing.
    """
    peak = _proc_status_mb("VmHWM")
    if peak is not None:
        return peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float | None:
    """This process's resident set size now, in MiB (``VmRSS``); None where ``/proc`` is
    missing (no portable current figure: ``ru_maxrss`` is the peak)."""
    return _proc_status_mb("VmRSS")


def drop_records_after(path: str | Path, step: int) -> int:
    """Remove the records of steps after ``step`` from a JSON-lines file (atomically); returns how
    many were dropped. A run resumed from the checkpoint of ``step`` replays the steps after it:
    without this, ``metrics.jsonl`` and ``samples_rank*.jsonl`` would hold them twice. The
    dropped records are appended to ``<name>.abandoned`` beside it (a resume from an older
    checkpoint by mistake loses no record; its later checkpoints are set aside the same way);
    a torn last line of a killed run is discarded."""
    path = Path(path)
    if not path.is_file():
        return 0
    keep, aside, dropped = [], [], 0
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        try:
            record_step = json.loads(line).get("step")
        except (ValueError, AttributeError):
            record_step = None   # a torn last line of a killed run
            if not line.endswith("\n"):
                dropped += 1
                continue
        if isinstance(record_step, int) and record_step > step:
            dropped += 1
            aside.append(line if line.endswith("\n") else line + "\n")
        else:
            keep.append(line if line.endswith("\n") else line + "\n")
    if aside:
        with open(path.with_name(path.name + ".abandoned"), "a", encoding="utf-8") as fh:
            fh.write("".join(aside))
    if dropped:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(keep), encoding="utf-8")
        os.replace(tmp, path)
    return dropped
