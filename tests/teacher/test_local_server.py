"""The local vLLM server launcher (xdistill/teacher/local_server.py) without vLLM: a server that
cannot start ends in one TeacherError quoting its log, and stop() is safe on an exited server.
(Its success path runs against the real server in tests/teacher/test_served_vllm.py.)"""

from __future__ import annotations

import importlib.util
import sys

import pytest

from xdistill.errors import TeacherError
from xdistill.teacher.local_server import free_port, start_vllm_server


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_a_server_that_exits_is_one_clear_error(tmp_path):
    with pytest.raises(TeacherError) as err:
        start_vllm_server(tmp_path / "model", log=tmp_path / "serve.log", python=sys.executable,
                          start_timeout_s=60)
    text = str(err.value)
    assert "exited with 1" in text and "No module named" in text and "serve.log" in text


def test_free_port_is_a_loopback_port():
    assert 1024 <= free_port() < 65536
