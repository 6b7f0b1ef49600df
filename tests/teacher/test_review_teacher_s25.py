"""Review s25 (teacher placement found while checking the GPU recipe's header against its
values): each test failed on the reviewed code."""

from __future__ import annotations

import torch

from xdistill.teacher import TeacherConfig
from xdistill.teacher.client import make_client


def test_a_subprocess_teachers_bare_cuda_is_the_ranks_current_gpu(monkeypatch):
    """Under torchrun each rank sets its own current GPU; a subprocess teacher with
    ``device: cuda`` must land there too, not on the child's default ``cuda:0`` (all eight
    ranks' teachers on GPU 0). This machine has no GPU: ``torch.cuda.is_available`` and
    ``current_device`` are mocked, and no process is started (the client is only built)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    sub = make_client(TeacherConfig(name="t", placement="subprocess", device="cuda"))
    assert sub.config.device == "cuda:3"
    explicit = make_client(TeacherConfig(name="t", placement="subprocess", device="cuda:1"))
    assert explicit.config.device == "cuda:1"            # an explicit index is kept
    inproc = make_client(TeacherConfig(name="t", placement="inprocess", device="cuda"))
    assert inproc.config.device == "cuda"                # in-process "cuda" is already the rank's
