"""Exact resume with torchdata's StatefulDataLoader; rank x worker sharding covers the data once."""

from __future__ import annotations

import pytest
import torch

from xdistill.data.config import DataConfig
from xdistill.data.loader import build_loader


def _loader(path, tok, rank, workers, epochs):
    cfg = DataConfig(paths=[str(path)], seq_len=48, batch_size=3, num_workers=workers, seed=7,
                     epochs=epochs)
    return build_loader(cfg, tok, rank=rank, world_size=2)


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_resume_yields_exactly_the_remaining_batches(corpus_dir, tiny_tok, workers):
    path, _ = corpus_dir
    for rank in (0, 1):
        full = [b.input_ids_BTs for b in _loader(path, tiny_tok, rank, workers, epochs=2)]
        assert len(full) > 10
        k = 7  # crosses the end of the first epoch in some workers
        first = _loader(path, tiny_tok, rank, workers, epochs=2)
        it = iter(first)
        head = [next(it).input_ids_BTs for _ in range(k)]
        state = first.state_dict()
        del it, first
        resumed = _loader(path, tiny_tok, rank, workers, epochs=2)
        resumed.load_state_dict(state)
        tail = [b.input_ids_BTs for b in resumed]
        assert len(head) + len(tail) == len(full)
        for got, want in zip(head + tail, full):
            assert torch.equal(got, want)


def test_ranks_and_workers_partition_each_epoch(corpus_dir, tiny_tok):
    path, docs = corpus_dir
    seen = []
    for rank in (0, 1):
        loader = _loader(path, tiny_tok, rank, workers=2, epochs=1)
        ds = loader.dataset
        for w in range(2):
            for epoch in (0, 1):
                seen.append((epoch, rank, w, ds.order(epoch, rank * 2 + w, 4)))
    for epoch in (0, 1):
        parts = [o for e, _, _, o in seen if e == epoch]
        merged = sorted(int(i) for o in parts for i in o)
        assert merged == list(range(len(docs)))  # disjoint and complete
    # and the text that actually comes out of the loaders covers every document once
    text = []
    for rank in (0, 1):
        for batch in _loader(path, tiny_tok, rank, workers=2, epochs=1):
            for row, mask in zip(batch.input_ids_BTs, batch.attention_mask_BTs):
                text.append(tiny_tok.table.concat(row[mask].tolist()))
    joined = b"".join(text)
    assert len(joined) == sum(len(d.encode()) for d in docs)  # nothing lost, nothing repeated
    assert sorted(joined) == sorted(b"".join(d.encode() for d in docs))
    counts = [joined.count(f"doc{i} ".encode()) for i in range(len(docs))]
    assert max(counts) == 1 and sum(counts) >= len(docs) - 8  # a window edge may cut a "docN "


def test_resume_refuses_another_layout(corpus_dir, tiny_tok):
    from xdistill.errors import DataError

    path, _ = corpus_dir
    first = _loader(path, tiny_tok, 0, 0, epochs=1)
    it = iter(first)
    next(it)
    state = first.state_dict()
    del it
    other = _loader(path, tiny_tok, 1, 0, epochs=1)  # another rank: another document split
    with pytest.raises(DataError, match="cannot resume"):
        other.load_state_dict(state)
        next(iter(other))


def test_worker_start_method_auto_spawns_only_with_cuda_state(monkeypatch):
    """``data.multiprocessing_context: auto`` forks on a CPU-only process and spawns once the
    process holds CUDA state (a CUDA student or teacher was built before the loader)."""
    import torch

    from xdistill.data.config import DataConfig
    from xdistill.data.loader import worker_start_method

    assert DataConfig().multiprocessing_context == "auto"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert worker_start_method("auto") == "fork"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # no GPU here: simulated
    assert worker_start_method("auto") == "spawn"
    assert worker_start_method("fork") == "fork" and worker_start_method("forkserver") == "forkserver"


def test_resume_refuses_a_changed_shuffle_or_tokenizer(tiny_tok, get_tokenizer):
    """A saved position is a (document, student-token offset) in one order of documents: resumed
    under another shuffle or student tokenizer it points elsewhere, and is refused naming the
    setting (another window length is supported: the data continues at the next unread token). A
    layout saved before these entries existed still loads."""
    from xdistill.data.dataset import PackedDataset
    from xdistill.errors import DataError

    docs = [f"doc{i} " * 20 for i in range(30)]
    first = PackedDataset(docs, tiny_tok, 32, seed=3)
    it = iter(first)
    next(it)
    state = first.state_dict()
    with pytest.raises(DataError, match="saved with shuffle = True"):
        PackedDataset(docs, tiny_tok, 32, seed=3, shuffle=False).load_state_dict(state)
    PackedDataset(docs, tiny_tok, 48, seed=3).load_state_dict(state)   # another window length
    gpt2 = get_tokenizer("gpt2")
    saved = PackedDataset(docs, gpt2, 32, seed=3, add_bos=False)
    with pytest.raises(DataError, match="saved with the student tokenizer"):
        PackedDataset(docs, get_tokenizer("qwen2"), 32, seed=3, add_bos=False).load_state_dict(
            saved.state_dict())
    old = dict(state, layout=state["layout"][:4])      # written before shuffle etc. were saved
    again = PackedDataset(docs, tiny_tok, 32, seed=3)
    again.load_state_dict(old)
    assert next(iter(again)).segments[0].doc == next(it).segments[0].doc


def test_a_position_saved_before_specials_as_text_existed_resumes_only_without_it(tiny_tok):
    """A checkpoint written before ``data.specials_as_text`` existed read special-token strings
    in text as special tokens (the setting's ``false``). Its layout lacks the entry; resumed under
    the new default (``true``) the same position could mean other tokens, so it is refused
    naming the key and the value to set; with ``data.specials_as_text: false`` it continues
    exactly."""
    from xdistill.data.dataset import PackedDataset
    from xdistill.errors import DataError

    docs = [f"doc{i} <|endoftext|> " * 10 for i in range(30)]
    first = PackedDataset(docs, tiny_tok, 32, seed=3, specials_as_text=False)
    it = iter(first)
    next(it)
    state = first.state_dict()
    old = dict(state, layout=state["layout"][:-1])     # as written before the key existed
    with pytest.raises(DataError, match="data.specials_as_text = False, the run now has True"):
        PackedDataset(docs, tiny_tok, 32, seed=3).load_state_dict(old)
    again = PackedDataset(docs, tiny_tok, 32, seed=3, specials_as_text=False)
    again.load_state_dict(old)
    assert next(iter(again)).segments[0].doc == next(it).segments[0].doc
