"""Transport pieces in one process: slot layout, shm segments (growth, handle once, cleanup),
the slot ring and leases, the automatic choice.

Legend: B batch, Tt teacher tokens, V vocabulary, K top-k, N flat bytes.
"""

from __future__ import annotations

import os

import pytest
import torch

from teacher_fakes import shm_files
from xdistill.errors import ConfigError, TeacherError
from xdistill.teacher.transport import (SlotRing, TeacherLease, choose_transport, layout_views,
                                        pack_layout)
from xdistill.teacher.transport.ray_store import RayStoreReader, RayStoreWriter
from xdistill.teacher.transport.shm import ShmReader, ShmWriter


def _spec(B, Tt, V=10, K=3):
    return {"logits_BTtV": ((B, Tt, V), torch.bfloat16), "topk_idx_BTtK": ((B, Tt, K), torch.int64),
            "tail_logmass_BTt": ((B, Tt), torch.float32)}


def test_layout_is_aligned_and_disjoint():
    layout, nbytes = pack_layout(_spec(2, 3))
    offsets = [off for *_, off in layout]
    assert all(off % 64 == 0 for off in offsets) and nbytes >= offsets[-1] + 2 * 3 * 4
    buf_N = torch.zeros(nbytes, dtype=torch.uint8)
    views = layout_views(buf_N, layout)
    for i, t in enumerate(views.values()):
        t.fill_(i + 1)
    for i, t in enumerate(views.values()):
        assert torch.all(t == i + 1)


def test_shm_roundtrip_growth_handle_once_and_cleanup():
    writer, reader = ShmWriter(2), ShmReader()
    out = writer.prepare(0, _spec(2, 3))
    out["topk_idx_BTtK"].copy_(torch.arange(18).view(2, 3, 3))
    meta = writer.publish(0)
    assert "path" in meta  # first publish of a generation carries the handle
    got = reader.read(0, meta)
    assert torch.equal(got["topk_idx_BTtK"], torch.arange(18).view(2, 3, 3))
    got["tail_logmass_BTt"].fill_(7.0)  # same memory on both sides
    assert torch.all(out["tail_logmass_BTt"] == 7.0)

    out = writer.prepare(0, _spec(1, 2))  # smaller batch: same segment, no new handle
    meta2 = writer.publish(0)
    assert "path" not in meta2 and meta2["gen"] == meta["gen"]
    assert reader.read(0, meta2)["logits_BTtV"].shape == (1, 2, 10)

    out = writer.prepare(0, _spec(4, 16))  # larger batch: grown, new generation announced
    out["topk_idx_BTtK"].fill_(5)
    meta3 = writer.publish(0)
    assert meta3["gen"] != meta["gen"] and "path" in meta3
    assert not os.path.exists(meta["path"])  # old generation unlinked
    assert torch.all(reader.read(0, meta3)["topk_idx_BTtK"] == 5)
    assert len(shm_files(os.getpid())) == 1
    writer.close()
    reader.close()
    assert shm_files(os.getpid()) == []


def test_shm_reader_rejects_unannounced_generation():
    with pytest.raises(TeacherError, match="without its handle"):
        ShmReader().read(0, {"gen": 3, "layout": []})


def test_forget_worker_unlinks_its_segments():
    writer = ShmWriter(2)
    writer.prepare(0, _spec(1, 1))
    writer.prepare(1, _spec(1, 1))
    assert len(shm_files(os.getpid())) == 2
    ShmReader().forget_worker(os.getpid())
    assert shm_files(os.getpid()) == []


def test_ray_store_halves_roundtrip_bf16():
    writer, reader = RayStoreWriter(2, "cpu"), RayStoreReader()
    out = writer.prepare(1, _spec(2, 3))
    out["logits_BTtV"].copy_(torch.linspace(-3, 3, 60).view(2, 3, 10))
    got = reader.read(1, writer.publish(1))
    assert got["logits_BTtV"].dtype == torch.bfloat16
    assert torch.equal(got["logits_BTtV"], out["logits_BTtV"])


def test_ring_and_lease():
    ring = SlotRing(2, "t")
    a, b = ring.acquire(), ring.acquire()
    with pytest.raises(TeacherError, match="all output slots are held"):
        ring.acquire()
    released = []
    with TeacherLease(object(), lambda: (released.append(a), ring.release(a))):
        pass
    assert released == [a] and ring.acquire() == a
    ring.release(b)
    with pytest.raises(TeacherError, match="released twice"):
        ring.release(b)


def test_choose_transport():
    assert choose_transport("auto", "inprocess", "cuda") == "inprocess"
    assert choose_transport("auto", "subprocess", "cpu") == "shm"
    assert choose_transport("auto", "subprocess", "cuda:1") == "cuda_ipc"
    assert choose_transport("auto", "ray", "cuda:0", same_node=False) == "ray"
    assert choose_transport("ray", "ray", "cpu") == "ray"
    with pytest.raises(ConfigError, match="node-local"):
        choose_transport("shm", "ray", "cpu", same_node=False)
    with pytest.raises(ConfigError, match="CUDA teacher device"):
        choose_transport("cuda_ipc", "subprocess", "cpu")
