"""The teacher output cache (rows seen again are copied, not recomputed) and the teacher's
attention implementation switch, on tiny real checkpoints.

Legend: B batch, Tt teacher tokens, V teacher vocabulary, Vs student vocabulary, K top-k.
"""

from __future__ import annotations

import logging

import pytest
import torch

from teacher_fakes import random_batch, random_projection, reference_logits
from xdistill.errors import ConfigError, XDistillError
from xdistill.teacher import TeacherConfig, TeacherRequest, TeacherWorker
from xdistill.teacher.cache import OutputCache, contiguous_runs, row_keys

V = 1000


def _count_forwards(worker) -> list[int]:
    """Rows the worker's model is run on, one entry per forward call."""
    rows: list[int] = []
    inner = worker.split.decoder if worker.split is not None else worker.model
    original = inner.forward

    def counted(*args, **kw):
        ids = kw.get("input_ids", args[0] if args else None)
        rows.append(int(ids.shape[0]))
        return original(*args, **kw)

    inner.forward = counted
    return rows


def _pad(ids, mask, Tt):
    """The same rows right-padded to ``Tt`` positions."""
    extra = Tt - ids.shape[1]
    return (torch.nn.functional.pad(ids, (0, extra)),
            torch.nn.functional.pad(mask, (0, extra), value=False))


@pytest.mark.parametrize("kind", ["logits", "topk", "projected"])
def test_cached_rows_equal_fresh_ones_and_skip_the_model(tiny_models, kind):
    ids, mask = random_batch(V, B=5, Tt=10, seed=3)
    proj = random_projection(300, V) if kind == "projected" else None
    cfg = dict(name="t", model=tiny_models["llama"], micro_batch_size=2, output=kind, top_k=7)
    plain = TeacherWorker(TeacherConfig(**cfg), proj)
    cached = TeacherWorker(TeacherConfig(cache_mb=64, **cfg), proj)
    calls = _count_forwards(cached)

    first = cached.forward(TeacherRequest(0, ids, mask))
    assert sum(calls) == 5 and len(cached.cache) == 5 and cached.cache.hits == 0
    # epoch 2: rows 4, 1, 0 again (other order, longer padding) and one new row
    new_ids, new_mask = random_batch(V, B=1, Tt=10, seed=99)
    order = [4, 1, 0]
    ids2, mask2 = _pad(torch.cat([ids[order], new_ids]), torch.cat([mask[order], new_mask]), 13)
    calls.clear()
    second = cached.forward(TeacherRequest(1, ids2, mask2))
    assert calls == [1], "only the new row may run the model"
    assert cached.cache.hits == 3 and cached.cache.misses == 6 and len(cached.cache) == 6
    fresh = plain.forward(TeacherRequest(1, ids2, mask2))
    for name, t in fresh.tensors().items():
        got = second.tensors()[name]
        assert got.shape == t.shape
        real = mask2.reshape(mask2.shape + (1,) * (t.dim() - 2)).expand_as(t)
        if t.dtype.is_floating_point:
            torch.testing.assert_close(got[real], t[real], rtol=1e-5, atol=1e-5)
            assert torch.isfinite(got).all(), f"{name}: padding positions must stay finite"
        else:
            assert torch.equal(got[real], t[real])
    # cached rows are those of the first computation
    for dst, src in zip(range(3), order):
        L = int(mask[src].sum())
        for name, t in first.tensors().items():
            assert torch.equal(second.tensors()[name][dst, :L], t[src, :L])
    if kind == "logits":
        ref = reference_logits(tiny_models["llama"], ids2, mask2)
        real = mask2[:, :, None].expand_as(ref)
        torch.testing.assert_close(second.logits_BTtV[real], ref[real], rtol=1e-5, atol=1e-5)


def test_budget_keeps_the_first_rows_and_says_when_full(tiny_models, caplog):
    ids, mask = random_batch(V, B=4, Tt=10, seed=5)
    row_mb = 10 * (V + 1) * 4 / 2**20  # one full-length logits row (+ token log-probs)
    worker = TeacherWorker(TeacherConfig(name="t", model=tiny_models["llama"],
                                         cache_mb=2.5 * row_mb))
    with caplog.at_level(logging.INFO, logger="xdistill"):
        worker.forward(TeacherRequest(0, ids, mask))
    # rows 0, 1, 2 (10 + 7 + 4 tokens) fit; row 3 (10 more) would pass the budget: not kept
    assert len(worker.cache) == 3 and worker.cache.bytes <= worker.cache.budget
    assert any("output cache full" in r.getMessage() for r in caplog.records)
    calls = _count_forwards(worker)
    worker.forward(TeacherRequest(1, ids, mask))
    assert calls == [1] and worker.cache.hits == 3
    assert "3 hits / 8 rows (38%), 3 rows kept" in worker.cache.summary()


def test_row_keys_contiguous_runs_and_config_checks():
    ids = torch.tensor([[5, 6, 7, 0, 0], [5, 6, 7, 8, 0], [0, 0, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    k0, k1, k2 = row_keys(ids, mask)
    assert k0[1] == 3 and k1[1] == 4 and k0[0] != k1[0]
    assert row_keys(*_pad(ids, mask, 9))[0] == k0, "trailing padding must not change the key"
    assert k2 is None
    cache = OutputCache(1.0)
    assert cache.lookup([None, k0]) == [False, False] and cache.misses == 2
    assert contiguous_runs([0, 1, 2, 5, 7, 8]) == [slice(0, 3), slice(5, 6), slice(7, 9)]
    assert contiguous_runs([]) == []
    with pytest.raises(ConfigError, match="cache_mb must be >= 0"):
        TeacherConfig(name="t", cache_mb=-1).validate()


def test_attn_implementation_eager_matches_sdpa(tiny_models):
    ids, mask = random_batch(V, B=3, Tt=9, seed=7)
    outs = {}
    for impl in ("eager", "sdpa"):
        w = TeacherWorker(TeacherConfig(name=impl, model=tiny_models["llama"],
                                        attn_implementation=impl))
        assert w.model.config._attn_implementation == impl
        outs[impl] = w.forward(TeacherRequest(0, ids, mask)).logits_BTtV
    real = mask[:, :, None].expand_as(outs["eager"])
    torch.testing.assert_close(outs["eager"][real], outs["sdpa"][real], rtol=1e-5, atol=1e-5)
    with pytest.raises(XDistillError, match="cannot load a causal LM"):
        TeacherWorker(TeacherConfig(name="t", model=tiny_models["llama"],
                                    attn_implementation="no_such_attention"))
