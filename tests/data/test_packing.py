"""Packing: windows reproduce every document exactly, split long ones, respect characters."""

from __future__ import annotations

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


def test_shuffle_is_seeded_and_changes_per_epoch(corpus_dir, tiny_tok):
    path, _ = corpus_dir
    src = DocumentSource(path)
    a = PackedDataset(src, tiny_tok, 64, seed=1)
    b = PackedDataset(src, tiny_tok, 64, seed=1)
    c = PackedDataset(src, tiny_tok, 64, seed=2)
    assert np.array_equal(a.order(0, 0, 1), b.order(0, 0, 1))
    assert not np.array_equal(a.order(0, 0, 1), a.order(1, 0, 1))
    assert not np.array_equal(a.order(0, 0, 1), c.order(0, 0, 1))
