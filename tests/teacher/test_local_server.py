"""The local vLLM server launcher (xdistill/teacher/local_server.py) without vLLM: a server that
cannot start ends in one TeacherError quoting its log; stop() ends the whole process group (also
a worker that outlives its leader) and is safe on an exited server.
(Its success path runs against the real server in tests/teacher/test_served_vllm.py.)"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time

import pytest

from xdistill.errors import TeacherError
from xdistill.teacher.local_server import LocalServer, free_port, start_vllm_server


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_a_server_that_exits_is_one_clear_error(tmp_path):
    with pytest.raises(TeacherError) as err:
        start_vllm_server(tmp_path / "model", log=tmp_path / "serve.log", python=sys.executable,
                          start_timeout_s=60)
    text = str(err.value)
    assert "exited with 1" in text and "No module named" in text and "serve.log" in text


def test_free_port_is_a_loopback_port():
    assert 1024 <= free_port() < 65536


# a leader that exits on SIGTERM at once, and a worker in its group that ignores SIGTERM (as an
# engine process busy in native code may): the worker's pid goes to stdout once both handlers
# are set (the worker says "ready" after ignoring SIGTERM; no sleep stands in for it)
_GROUP = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
worker = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
    "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
assert worker.stdout.readline().strip() == "ready"
print(worker.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for init to reap it: dead
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_stop_ends_a_worker_that_outlives_its_leader(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", _GROUP], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    worker = int(proc.stdout.readline())    # both handlers are set
    server = LocalServer(proc, "http://127.0.0.1:1/v1", tmp_path / "serve.log")
    start = time.monotonic()
    server.stop(grace_s=1.0)
    assert proc.poll() == 0 and time.monotonic() - start < 8
    try:
        deadline = time.monotonic() + 5
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker)
        server.stop()   # already gone: a no-op
    finally:
        if _alive(worker):
            os.kill(worker, 9)
