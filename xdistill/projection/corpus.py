"""The corpus method: co-occurrence of student and teacher tokens that start the same aligned chunk.

Each text of the corpus is tokenized by both tokenizers (no special tokens) and aligned by
:func:`xdistill.align.align_batch` into chunks of identical bytes. For every valid chunk ``k`` the
first student token ``s`` and the first teacher token ``t`` of the chunk form one observation; the
counts ``n(s, t)`` are accumulated as int64 keys ``s * Vt + t`` (merged with ``np.unique`` every few
million observations, so memory follows the number of *distinct* pairs) and normalised to
``P(t | s) = n(s, t) / sum_t' n(s, t')``. Pairs seen fewer than ``min_count`` times are dropped.

Corpus paths: a folder written by ``xdistill data prepare`` (its ``index.json`` lists the arrow
shards; text documents give their ``text``, chat documents each message's ``content``), or files:
``.arrow`` (Arrow IPC file or stream, e.g. a ``datasets`` shard), ``.parquet``, ``.jsonl`` (one
JSON object per line), with a string column/field ``text``; any other extension is read as UTF-8
plain text split into paragraphs at blank lines (long paragraphs cut at line boundaries near
4,000 characters). pyarrow is imported only for arrow/parquet files. :func:`resolve_corpus_files`
checks the paths up front, so a wrong one fails before any slow work.

Legend: ``B`` batch, ``Ts``/``Tt`` tokens, ``C`` chunks, ``N`` observations.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm import tqdm

from xdistill.align import align_batch
from xdistill.errors import ProjectionError

_PARAGRAPH_CHARS = 4000
_COMPACT_AT = 4_000_000


def _text_paragraphs(path: Path) -> Iterator[str]:
    try:
        raw = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ProjectionError(f"corpus file {path}: not UTF-8 text ({exc})") from exc
    for para in raw.split("\n\n"):
        while len(para) > _PARAGRAPH_CHARS:
            cut = para.rfind("\n", 0, _PARAGRAPH_CHARS)
            cut = cut if cut > 0 else _PARAGRAPH_CHARS
            yield para[:cut]
            para = para[cut:]
        if para.strip():
            yield para


def _jsonl_texts(path: Path) -> Iterator[str]:
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ProjectionError(f"corpus file {path} line {lineno}: not UTF-8 text "
                                      f"({exc})") from exc
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ProjectionError(f"corpus file {path} line {lineno}: invalid JSON ({exc})") from exc
            text = obj.get("text") if isinstance(obj, dict) else None
            if not isinstance(text, str):
                raise ProjectionError(f"corpus file {path} line {lineno}: no string field 'text'")
            yield text


def _arrow_texts(path: Path) -> Iterator[str]:
    # deferred: pyarrow (only corpus files need it; projection/ is numpy+scipy)
    import pyarrow as pa
    # deferred: pyarrow (only corpus files need it; projection/ is numpy+scipy)
    import pyarrow.ipc as ipc
    # deferred: pyarrow (only corpus files need it; projection/ is numpy+scipy)
    import pyarrow.parquet as pq

    try:
        if path.suffix == ".parquet":
            parquet = pq.ParquetFile(path)
            names = parquet.schema_arrow.names
            if "text" not in names:
                raise ProjectionError(f"corpus file {path}: no column 'text' (columns: {names})")
            batches = parquet.iter_batches(columns=[c for c in ("text", "messages") if c in names])
        else:
            try:
                reader = ipc.open_file(pa.memory_map(str(path)))
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            except pa.ArrowInvalid:
                batches = iter(ipc.open_stream(pa.memory_map(str(path))))
        for batch in batches:
            if "text" not in batch.schema.names:
                raise ProjectionError(f"corpus file {path}: no column 'text' (columns: {batch.schema.names})")
            chats = batch.column("messages").to_pylist() if "messages" in batch.schema.names \
                else [None] * batch.num_rows
            for text, chat in zip(batch.column("text").to_pylist(), chats):
                if isinstance(text, str):
                    yield text
                elif chat:                       # a prepared chat document: its contents
                    yield from (m["content"] for m in chat
                                if isinstance(m, dict) and isinstance(m.get("content"), str))
    except (pa.ArrowInvalid, OSError) as exc:
        raise ProjectionError(f"corpus file {path}: cannot read as arrow/parquet ({exc})") from exc


def resolve_corpus_files(paths) -> list[Path]:
    """The files behind corpus paths: a prepared data folder (``index.json``) becomes its shards.
    Raises :class:`ProjectionError` naming the first path that does not exist or is a folder
    without ``index.json``."""
    files: list[Path] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            index = path / "index.json"
            if not index.is_file():
                raise ProjectionError(f"corpus path {path} is a folder without index.json (expected "
                                      "an `xdistill data prepare` output folder or corpus files)")
            try:
                shards = [path / s["file"] for s in json.loads(index.read_text())["shards"]]
            except (ValueError, KeyError, TypeError) as exc:
                raise ProjectionError(f"corpus folder {path}: corrupt index.json ({exc!r})") from None
            missing = [str(s) for s in shards if not s.is_file()]
            if missing:
                raise ProjectionError(f"corpus folder {path}: shard {missing[0]} listed in "
                                      "index.json does not exist")
            files += shards
        elif path.is_file():
            files.append(path)
        else:
            raise ProjectionError(f"corpus path {path} does not exist")
    return files


def iter_corpus_texts(files, max_texts: int = 0) -> Iterator[str]:
    """Texts of the corpus paths in order (at most ``max_texts`` when > 0)."""
    n = 0
    for path in resolve_corpus_files(files):
        if path.suffix in (".arrow", ".parquet"):
            texts = _arrow_texts(path)
        elif path.suffix == ".jsonl":
            texts = _jsonl_texts(path)
        else:
            texts = _text_paragraphs(path)
        for text in texts:
            yield text
            n += 1
            if max_texts and n >= max_texts:
                return


def _pad(encs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Right-padded ids ``[B, T]``, lengths ``[B]`` and per-token phantom bytes ``[B, T]`` (every
    dummy-prefix space, also those legacy SentencePiece puts after in-text special tokens)."""
    len_B = np.array([len(e.ids) for e in encs], dtype=np.int64)
    ids_BT = np.zeros((len(encs), max(1, int(len_B.max(initial=0)))), dtype=np.int64)
    phantom_BT = np.zeros_like(ids_BT)
    for b, e in enumerate(encs):
        ids_BT[b, :len_B[b]] = e.ids
        phantom_BT[b, :len_B[b]] = e.phantom_bytes_T()
    return ids_BT, len_B, phantom_BT


def _first_with_text(ids_BT, ph_BT, lengths_V, b_N, start_N, end_N) -> np.ndarray:
    """Each chunk's first token that holds text bytes: a SentencePiece ``▁`` made only of its
    dummy-prefix space (before digits, CJK, a special token's text) is passed over while the
    chunk has a later token."""
    pos = start_N.copy()
    while True:
        empty = lengths_V[ids_BT[b_N, pos]] - ph_BT[b_N, pos] <= 0
        move = empty & (pos + 1 < end_N)
        if not move.any():
            return pos
        pos = pos + move


def chunk_start_pairs(student, teacher, texts: list[str]) -> np.ndarray:
    """Keys ``s * Vt + t`` of the first student/teacher token with text bytes of every valid
    aligned chunk (phantom-only tokens are skipped, :func:`_first_with_text`)."""
    s_ids, s_len, s_ph = _pad(student.encode_batch(texts, add_special_tokens=False))
    t_ids, t_len, t_ph = _pad(teacher.encode_batch(texts, add_special_tokens=False))
    res = align_batch(s_ids, s_len, t_ids, t_len, student.table, teacher.table,
                      s_phantom_BTs=s_ph, t_phantom_BTt=t_ph)
    b_N, c_N = np.nonzero(res.chunk_valid_BC)
    s_pos = _first_with_text(s_ids, s_ph, student.table.lengths_V, b_N,
                             res.chunk_s_start_BC[b_N, c_N], res.chunk_s_end_BC[b_N, c_N])
    t_pos = _first_with_text(t_ids, t_ph, teacher.table.lengths_V, b_N,
                             res.chunk_t_start_BC[b_N, c_N], res.chunk_t_end_BC[b_N, c_N])
    s_first, t_first = s_ids[b_N, s_pos], t_ids[b_N, t_pos]
    return s_first.astype(np.int64) * int(teacher.vocab_size) + t_first.astype(np.int64)


def _merge(keys: np.ndarray, counts: np.ndarray, new: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    all_keys = np.concatenate([keys] + new)
    all_counts = np.concatenate([counts] + [np.ones(x.size, np.int64) for x in new])
    uniq, inv = np.unique(all_keys, return_inverse=True)
    return uniq, np.bincount(inv.ravel(), weights=all_counts, minlength=uniq.size).astype(np.int64)


def corpus_counts(student, teacher, files, *, max_texts: int = 0, batch_size: int = 256,
                  progress: bool = False) -> tuple[np.ndarray, np.ndarray, int]:
    """Distinct keys ``s * Vt + t``, their counts, and the number of texts read."""
    keys = np.zeros(0, np.int64)
    counts = np.zeros(0, np.int64)
    pending: list[np.ndarray] = []
    n_pending = n_texts = 0
    batch: list[str] = []
    bar = tqdm(desc="corpus", unit="text", disable=not progress, leave=False)
    for text in iter_corpus_texts(files, max_texts):
        batch.append(text)
        if len(batch) == batch_size:
            pending.append(chunk_start_pairs(student, teacher, batch))
            n_pending += pending[-1].size
            n_texts += len(batch)
            bar.update(len(batch))
            batch = []
            if n_pending >= _COMPACT_AT:
                keys, counts = _merge(keys, counts, pending)
                pending, n_pending = [], 0
    if batch:
        pending.append(chunk_start_pairs(student, teacher, batch))
        n_texts += len(batch)
        bar.update(len(batch))
    bar.close()
    keys, counts = _merge(keys, counts, pending)
    return keys, counts, n_texts


def corpus_triplets(student, teacher, files, *, max_texts: int = 0, min_count: int = 1,
                    batch_size: int = 256, progress: bool = False):
    """``(s_N, t_N, P(t|s)_N)`` from chunk-start co-occurrence counts over ``files``."""
    keys, counts, n_texts = corpus_counts(student, teacher, files, max_texts=max_texts,
                                          batch_size=batch_size, progress=progress)
    if n_texts == 0:
        raise ProjectionError(f"corpus {list(map(str, files))} holds no text")
    keep = counts >= max(1, min_count)
    keys, counts = keys[keep], counts[keep]
    vt = int(teacher.vocab_size)
    rows, cols = keys // vt, keys % vt
    sums = np.bincount(rows, weights=counts, minlength=int(student.vocab_size))
    return rows, cols, counts / sums[rows]
