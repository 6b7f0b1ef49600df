"""xdistill.distributed without a process group (the 2-rank collectives are checked in
test_fsdp.py::test_collectives_on_two_ranks)."""

from __future__ import annotations

import pytest
import torch

from xdistill import distributed as xdist
from xdistill.errors import XDistillError


def test_single_process_world(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    env = xdist.init_distributed()
    assert (env.rank, env.world_size, env.local_rank, env.backend) == (0, 1, 0, None)
    assert env.is_main and not env.distributed and env.device == torch.device("cpu")
    assert not xdist.is_distributed() and xdist.get_rank() == 0 and xdist.get_world_size() == 1
    assert xdist.is_main_process() and xdist.build_device_mesh(env) is None
    xdist.barrier()
    xdist.destroy_distributed()


def test_reductions_are_identities_without_a_group():
    assert xdist.all_reduce_sum(7) == 7 and isinstance(xdist.all_reduce_sum(7), int)
    assert xdist.all_reduce_sum(2.5) == 2.5 and xdist.all_reduce_max(3) == 3
    assert xdist.all_reduce_mean(4) == 4.0
    x = torch.tensor([1.0, 2.0])
    assert torch.equal(xdist.all_reduce_sum(x), x)
    assert xdist.broadcast_object({"a": 1}) == {"a": 1}


@pytest.mark.parametrize("bad", [True, "3", [1]])
def test_reductions_reject_other_types(bad):
    with pytest.raises(TypeError, match="all-reduce"):
        xdist.all_reduce_sum(bad)


def test_bad_environment_is_named(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "x")
    with pytest.raises(XDistillError, match="LOCAL_RANK"):
        xdist.init_distributed()


def test_nccl_without_cuda_is_a_clear_error(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("CUDA is present")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(XDistillError, match="nccl"):
        xdist.init_distributed(backend="nccl")
