"""Packing: windows reproduce every document exactly, split long ones, respect characters."""

from __future__ import annotations

import pytest
import numpy as np

from xdistill.data.dataset import PackedDataset
from xdistill.data.source import DocumentSource


def _doc_bytes_from_windows(windows) -> dict[int, bytes]:
    out: dict[int, list] = {}
    for w in windows:
        for seg in w.segments:
            out.setdefault(seg.doc, []).append((seg.byte_start, seg.byte_end, seg.text.encode()))
    docs = {}
    for doc, parts in out.items():
        parts.sort()
        pos = 0
        for a, b, raw in parts:
            assert a == pos, f"doc {doc}: gap or overlap at byte {pos} (next piece starts at {a})"
            assert len(raw) == b - a
            pos = b
        docs[doc] = b"".join(raw for _, _, raw in parts)
    return docs


def test_windows_cover_every_document_exactly_once(corpus_dir, tiny_tok):
    path, docs = corpus_dir
    ds = PackedDataset(DocumentSource(path), tiny_tok, 64, seed=3, epochs=1)
    windows = list(ds)
    assert all(w.n_tokens <= 64 for w in windows)
    # packed densely; a window ends early only where a split would cut a character
    assert np.mean([w.n_tokens for w in windows[:-1]]) > 0.95 * 64
    got = _doc_bytes_from_windows(windows)
    assert sorted(got) == list(range(len(docs)))
    for i, doc in enumerate(docs):
        assert got[i] == doc.encode()
    # one EOS separator per document
    assert sum(seg.eos for w in windows for seg in w.segments) == len(docs)


def test_long_document_split_at_student_token_boundaries(tiny_tok):
    doc = "naïve café 東京 🙂🙃 " * 200
    ds = PackedDataset([doc], tiny_tok, 50, shuffle=False, epochs=1)
    windows = list(ds)
    assert len(windows) > 10
    ids = np.concatenate([s.ids_T for w in windows for s in w.segments])
    assert np.array_equal(ids, tiny_tok.encode(doc).ids)  # same tokens as the whole document
    for w in windows:
        for seg in w.segments:
            seg.text.encode("utf-8")  # every piece is whole characters
            assert "\ufffd" not in seg.text
            assert tiny_tok.table.concat(seg.ids_T) == seg.text.encode()


def test_bos_reserves_one_token(tiny_tok):
    ds = PackedDataset(["a b c d e f g h i j k l m n o p q r s t u v w x y z " * 5], tiny_tok, 16,
                       shuffle=False, epochs=1, add_bos=True)
    windows = list(ds)
    assert all(w.bos and w.n_tokens <= 16 for w in windows)
    assert windows[0].n_tokens == 16


def test_empty_documents_skipped_and_counted(tiny_tok):
    ds = PackedDataset(["one doc", "", "   \n", "two doc", [], [("user", " ")]], tiny_tok, 32,
                       shuffle=False, epochs=1)
    windows = list(ds)
    assert sorted({s.doc for w in windows for s in w.segments}) == [0, 3]
    assert ds.state_dict()["skipped_empty"] == 4


def test_a_shard_of_only_empty_documents_is_an_error_not_an_endless_loop(tiny_tok, tmp_path):
    """With epochs=None (what trainers use) a shard whose documents are all empty (e.g. the text
    column is null on every row, the text is in another column) spun through epochs for ever."""
    import threading

    import pyarrow as pa
    import pyarrow.parquet as pq

    from xdistill.errors import DataError

    pq.write_table(pa.table({"text": pa.array([None] * 4, pa.string()), "body": list("abcd")}),
                   tmp_path / "null_text.parquet")
    ds = PackedDataset(DocumentSource(tmp_path / "null_text.parquet"), tiny_tok, 16, epochs=None)
    got = []
    thread = threading.Thread(target=lambda: got.append(_first_or_error(ds)), daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "next() still spinning over empty epochs"
    assert isinstance(got[0], DataError)
    assert "all 4 documents of data shard 0" in str(got[0]) and "null_text.parquet" in str(got[0])
    # finite epochs: a dataset of empty documents simply has no window (not an error)
    assert list(PackedDataset(["", " "], tiny_tok, 16, epochs=2)) == []


def _first_or_error(ds):
    try:
        return next(iter(ds))
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return exc


def test_shuffle_is_seeded_and_changes_per_epoch(corpus_dir, tiny_tok):
    path, _ = corpus_dir
    src = DocumentSource(path)
    a = PackedDataset(src, tiny_tok, 64, seed=1)
    b = PackedDataset(src, tiny_tok, 64, seed=1)
    c = PackedDataset(src, tiny_tok, 64, seed=2)
    assert np.array_equal(a.order(0, 0, 1), b.order(0, 0, 1))
    assert not np.array_equal(a.order(0, 0, 1), a.order(1, 0, 1))
    assert not np.array_equal(a.order(0, 0, 1), c.order(0, 0, 1))


@pytest.mark.parametrize("name", ["gpt2", "qwen2", "llama3", "mistral", "phi3", "bert"])
def test_long_documents_are_tokenized_in_pieces_with_identical_results(name):
    """A long text is encoded piece by piece (bounded memory); ids and byte offsets equal the
    whole-text encoding for every family (tokenizers that add a dummy prefix to every call, or
    drop bytes, get the whole text)."""
    import random

    import numpy as np

    from xdistill.data.packing import _pieces, encode_text
    from xdistill.tokenization import load_tokenizer

    rng = random.Random(0)
    words = ["the", "quick", "naïve", "東京", "🙂", "  spaces", "tabs\t", "x=1;", "12345", "\n",
             "\n\n", "Hello,"]
    text = "".join(rng.choice(words) + rng.choice([" ", "", "\n"]) for _ in range(6000))
    assert len(_pieces(text, 2000)) > 5 and "".join(_pieces(text, 2000)) == text
    tok = load_tokenizer(name)
    whole = tok.encode(text)
    ids, starts, ends, phantom = encode_text(tok, text, size=2000)
    assert np.array_equal(ids, whole.ids) and np.array_equal(starts, whole.starts)
    assert np.array_equal(ends, whole.ends) and np.array_equal(phantom, whole.phantom_T)


def test_a_long_document_costs_bounded_memory(tmp_path):
    """Peak RSS growth (VmHWM, in a fresh process) of packing one 8 MB document: the whole-text
    encode with offsets takes several times what the piecewise path does."""
    import json as _json
    import subprocess
    import sys

    code = """
import json, sys
from xdistill.data.packing import encode_document
from xdistill.metrics import peak_rss_mb
from xdistill.tokenization import load_tokenizer
tok = load_tokenizer("gpt2")
text = ("All the world's a stage, and all the men and women merely players.\\n" * 120000)
tok.encode("warm up")
before = peak_rss_mb()
enc = encode_document(tok, 0, text) if sys.argv[1] == "pieces" else tok.encode(text)
print(json.dumps({"growth": peak_rss_mb() - before}))
"""
    out = {}
    for mode in ("pieces", "whole"):
        proc = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True,
                              timeout=600, env={**__import__("os").environ,
                                                "HF_HUB_OFFLINE": "1"})
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[mode] = _json.loads(proc.stdout.strip().splitlines()[-1])["growth"]
    assert out["pieces"] * 2 < out["whole"], out
