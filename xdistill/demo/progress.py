"""Progress lines and stage errors of ``xdistill demo distill``.

Each piece of work runs inside :meth:`Progress.stage`: a line when it starts and when it ends (with
its time), and in between, from a background thread, a line whenever none was printed for
``every`` seconds -- even while one long step, a model load or the projection build is running:
``[teacher] step 7/20 | 6.9 s/step | ETA 90 s | 52 s elapsed``. An exception inside a stage
becomes :class:`DemoFailed` naming the stage (the CLI prints it as one line and exits 2); the
traceback goes to ``<out>/error.log`` when a log path is given.
"""

from __future__ import annotations

import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

from xdistill.errors import XDistillError


class DemoFailed(XDistillError):
    """A stage of the demo failed; the message names the stage and the cause."""


def say(msg: str) -> None:
    print(msg, flush=True)


def format_duration(seconds: float) -> str:
    """``4 s``, ``1 min 05 s``, ``1 h 02 min``."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class Progress:
    """Stages with a progress line at least every ``every`` seconds (module doc); ``times`` holds
    each finished stage's seconds by name."""

    def __init__(self, log=say, every: float = 10.0, error_log: Path | None = None):
        self.log, self.every, self.error_log = log, every, error_log
        self.times: dict[str, float] = {}
        self._lock = threading.Lock()
        self._name = ""
        self._unit = "step"
        self._done = self._total = 0
        self._t0 = self._last = time.perf_counter()

    def line(self, msg: str) -> None:
        """Print ``msg`` now (it counts as a progress line)."""
        with self._lock:
            self._last = time.perf_counter()
        self.log(msg)

    def advance(self, done: int | None = None) -> None:
        """One more unit of the current stage done (or ``done`` units in all)."""
        with self._lock:
            self._done = self._done + 1 if done is None else done

    def status(self) -> str:
        """The current stage's progress: units done, rate, ETA, elapsed."""
        with self._lock:
            name, unit, done, total = self._name, self._unit, self._done, self._total
            elapsed = time.perf_counter() - self._t0
        parts = []
        if total:
            parts.append(f"{unit} {done}/{total}")
            if done:
                rate = elapsed / done
                parts += [f"{rate:.1f} s/{unit}", f"ETA {rate * (total - done):.0f} s"]
            else:
                parts.append(f"first {unit} running")
        else:
            parts.append("working")
        parts.append(f"{elapsed:.0f} s elapsed")
        return f"[{name}] " + " | ".join(parts)

    @contextmanager
    def stage(self, name: str, total: int = 0, unit: str = "step", what: str = ""):
        """Run the body as stage ``name`` of ``total`` ``unit``s (0: no count); ``what`` is
        printed with its start line. Failures become :class:`DemoFailed` naming the stage."""
        with self._lock:
            self._name, self._unit, self._done, self._total = name, unit, 0, total
            self._t0 = time.perf_counter()
        if what:
            self.line(f"[{name}] {what}")
        stop = threading.Event()
        ticker = threading.Thread(target=self._tick, args=(stop,), daemon=True)
        ticker.start()
        try:
            yield self
        except DemoFailed:
            raise
        except Exception as exc:
            raise DemoFailed(self._failure(name, exc)) from exc
        finally:
            stop.set()
            ticker.join()
        self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - self._t0
        self.line(f"[{name}] done in {format_duration(time.perf_counter() - self._t0)}")

    def _tick(self, stop: threading.Event) -> None:
        while not stop.wait(min(1.0, self.every / 4)):
            with self._lock:
                due = time.perf_counter() - self._last >= self.every
            if due:
                self.line(self.status())

    def _failure(self, name: str, exc: Exception) -> str:
        cause = str(exc) if isinstance(exc, XDistillError) else f"{type(exc).__name__}: {exc}"
        msg = f"demo stage '{name}' failed: {cause}"
        if self.error_log is not None:
            try:
                self.error_log.parent.mkdir(parents=True, exist_ok=True)
                self.error_log.write_text("".join(traceback.format_exception(exc)))
                msg += f" (traceback: {self.error_log})"
            except OSError:
                pass
        return msg
