"""xdistill/child_signals.py: a child started under ``held()`` that calls
``ignore_stop_signals()`` survives SIGINT and SIGTERM from anyone but its parent (a terminal's
Ctrl-C or ``timeout`` signal the whole group), and still ends on its parent's ``terminate()``."""

from __future__ import annotations

import multiprocessing
import signal
import subprocess
import time

import pytest

from xdistill import child_signals

pytestmark = pytest.mark.integration   # starts processes


def _child(ready) -> None:
    child_signals.ignore_stop_signals()
    ready.set()
    time.sleep(60)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_child_ignores_stop_signals_but_not_its_parents_terminate(method):
    ctx = multiprocessing.get_context(method)
    ready = ctx.Event()
    proc = ctx.Process(target=_child, args=(ready,), daemon=True)
    with child_signals.held():
        proc.start()
    try:
        for sig in ("INT", "TERM"):   # while it starts up (a spawned one imports for a while)
            subprocess.run(["kill", f"-{sig}", str(proc.pid)], check=True)
        assert ready.wait(60)
        for sig in ("INT", "TERM", "INT", "TERM"):   # sent by another process: `kill`
            subprocess.run(["kill", f"-{sig}", str(proc.pid)], check=True)
        time.sleep(0.3)
        assert proc.is_alive()
        proc.terminate()   # SIGTERM from the parent: ends it
        proc.join(10)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()


def test_held_blocks_only_inside_and_the_parent_gets_its_signal_after():
    got = []
    old = signal.signal(signal.SIGUSR1, lambda *a: got.append("usr1"))
    try:
        assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        with child_signals.held():
            assert {signal.SIGINT, signal.SIGTERM} <= signal.pthread_sigmask(signal.SIG_BLOCK, [])
        assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    finally:
        signal.signal(signal.SIGUSR1, old)
