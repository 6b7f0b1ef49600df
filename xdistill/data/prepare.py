"""``xdistill data prepare``: jsonl / parquet / arrow / text / chat files -> arrow IPC shards + index.

Output directory layout::

    DIR/shard-00000.arrow ...   arrow IPC *file* format (memory-mappable), at most ``shard_bytes``
                                of document bytes each (a single larger document gets its own shard)
    DIR/index.json              documents, bytes, shards, sources, schema, skipped-empty count

Every shard has the schema ``text: large_string, messages: list<struct<role, content>>``; a text
document fills ``text`` (``messages`` null), a chat document fills ``messages`` (``text`` null).

Input formats (``--format auto`` picks by suffix): ``jsonl`` (``.jsonl``, ``.ndjson``, ``.json``;
one JSON object per line with the text column or a ``messages`` list), ``parquet``, ``arrow``
(``.arrow``/``.feather``), ``text`` (one document per file: ``.txt``, ``.md`` and anything else)
and ``text-lines`` (one document per line). Directories are expanded to their files, sorted.

Empty documents (no non-whitespace character; a conversation whose contents are all blank) are
skipped and counted. Invalid UTF-8 follows ``invalid_utf8``: ``error`` names the file and
line/row, ``replace`` substitutes U+FFFD and counts the documents it changed.

A text document longer than ``max_doc_bytes`` UTF-8 bytes (default 512 KiB, ``--max-doc-mb``; 0
never splits) is split into pieces of at most that size, each written as its own document (the
packer then ends each with EOS and shuffles them independently; at ~130 K tokens a piece is far
longer than a training window). Each cut is, in this order of preference, after the last blank
line (``\n\n``) in the second half of the limit, else after the last newline there, else before
the last space or tab (it stays with the next word, as BPE tokenizers attach it), else at the last
character boundary; the pieces concatenate to the document byte for byte, and blank pieces are
skipped. Chat documents are never split (each tokenizer renders their messages with its template).
Why: the student tokenizes a document in one call when it has no ``x\ny`` newline to cut at, or
when its tokenizer adds a dummy prefix (:func:`xdistill.data.packing.encode_text`); one 100 MB
document took 13.5 GB and 143 s of silence on the first step. A 4 MB one-line document peaks at
~650 MB whole and ~80 MB in 512 KiB pieces (GPT-2; the same token ids).

Idempotent: the index records a fingerprint of the inputs (path, size, mtime) and options; a rerun
with the same fingerprint and intact shards does nothing. Otherwise everything is written to a
temporary directory and moved into place (shards first, ``index.json`` last, each via rename), so
an interrupted run never leaves a half-written index; the output is byte-identical for identical
inputs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from xdistill.data.chat import as_conversation, is_empty_conversation
from xdistill.data.source import INCOMPLETE, as_binary, decode_utf8
from xdistill.errors import DataError

FORMAT_VERSION = 1
SCHEMA = pa.schema([
    ("text", pa.large_string()),
    ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.large_string())]))),
])
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
FORMATS = ("auto", "jsonl", "parquet", "arrow", "text", "text-lines")
_BATCH_ROWS = 1024
MAX_DOC_BYTES = 512 << 10   # default split size of long text documents (see the docstring)
MIN_DOC_BYTES = 4096        # smallest allowed split size (a cut always finds a character boundary)


def expand_inputs(inputs) -> list[Path]:
    files: list[Path] = []
    for raw in inputs:
        path = Path(raw)
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        elif path.is_file():
            files.append(path)
        else:
            raise DataError(f"input {path} does not exist")
    if not files:
        raise DataError(f"{', '.join(str(i) for i in inputs)}: no input files (an empty "
                        "directory, or only hidden files)")
    return files


def detect_format(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix == ".parquet":
        return "parquet"
    if suffix in (".arrow", ".feather", ".ipc"):
        return "arrow"
    return "text"


# ---------------------------------------------------------------------------- readers
UTF8_HINT = "pass --invalid-utf8 replace to substitute U+FFFD"

_SURROGATE = re.compile("[\ud800-\udfff]")


def _decode(raw: bytes, opts, where: str) -> tuple[str, bool]:
    """(text, whether invalid bytes were replaced) under the invalid_utf8 policy."""
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        return decode_utf8(raw, opts["invalid_utf8"], where, UTF8_HINT), True


def _record_doc(obj, text_column: str, messages_column: str, where: str):
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if text_column in obj and obj[text_column] is not None:
        if not isinstance(obj[text_column], str):
            raise DataError(f"{where}: {text_column!r} must be a string")
        return obj[text_column]
    if messages_column in obj and obj[messages_column] is not None:
        return as_conversation(obj[messages_column], where)
    nulls = [k for k in (text_column, messages_column) if k in obj]
    if nulls:   # the key is there, its value is null
        raise DataError(f"{where}: {' and '.join(repr(k) for k in nulls)} "
                        f"{'is' if len(nulls) == 1 else 'are'} null; give the document's text "
                        f"(or its {messages_column!r} list), or drop the line")
    raise DataError(f"{where}: no {text_column!r} or {messages_column!r} key; keys found: "
                    f"{', '.join(map(str, obj)) or 'none'} (--text-column / --messages-column "
                    "name others)")


_BOM = b"\xef\xbb\xbf"


def _read_jsonl(path, opts):
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            yield len(raw), None
            if lineno == 1 and raw.startswith(_BOM):   # a byte-order mark is not JSON
                raw = raw[len(_BOM):]
            if not raw.strip():
                continue
            where = f"{path} line {lineno}"
            line, replaced = _decode(raw, opts, where)
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})") from None
            yield 0, (_record_doc(obj, opts["text_column"], opts["messages_column"], where), replaced)


def _read_table_batches(path, fmt):
    if fmt == "parquet":
        try:
            pf = pq.ParquetFile(str(path))
            yield pf.schema_arrow.names
            yield from pf.iter_batches(batch_size=_BATCH_ROWS)
        except (pa.ArrowInvalid, OSError) as exc:
            raise DataError(f"corrupt or unreadable parquet file {path}: {exc}") from None
        return
    try:
        with pa.memory_map(str(path), "r") as mm:
            try:
                reader = pa.ipc.open_file(mm)
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            except pa.ArrowInvalid:
                mm.seek(0)
                reader = pa.ipc.open_stream(mm)
                batches = iter(reader)
            yield reader.schema.names
            yield from batches
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"corrupt or unreadable arrow file {path}: {exc}") from None


def _read_table(path, opts, fmt):
    """Rows of an arrow/parquet table: the text column's value where it is not null, else the
    chat column's (a table may hold both, as prepared shards of mixed data do), else empty."""
    batches = _read_table_batches(path, fmt)
    names = next(batches)
    text_col, chat_col = opts["text_column"], opts["messages_column"]
    text_col, chat_col = (c if c in names else None for c in (text_col, chat_col))
    if text_col is None and chat_col is None:
        raise DataError(f"{path} has no text column {opts['text_column']!r} (nor a chat column "
                        f"{opts['messages_column']!r}); columns found: {', '.join(names)}")
    row = 0
    for batch in batches:
        columns = [batch.column(batch.schema.get_field_index(c)) if c else None
                   for c in (text_col, chat_col)]
        yield sum(c.nbytes for c in columns if c is not None), None
        texts, chats = (None if c is None else
                        (as_binary(c, path, text_col) if k == 0 else c).to_pylist()
                        for k, c in enumerate(columns))
        for i in range(batch.num_rows):
            where = f"{path} row {row}"
            row += 1
            if texts is not None and texts[i] is not None:
                yield 0, _decode(texts[i], opts, where)
            elif chats is not None and chats[i] is not None:
                yield 0, (as_conversation(chats[i], where), False)
            else:
                yield 0, ("", False)


def _read_text(path, opts, per_line: bool):
    raw = Path(path).read_bytes()
    yield len(raw), None
    if raw.startswith(_BOM):        # a byte-order mark is not the document's text
        raw = raw[len(_BOM):]
    pieces = raw.split(b"\n") if per_line else [raw]
    for lineno, piece in enumerate(pieces, 1):
        if per_line and piece.endswith(b"\r"):
            piece = piece[:-1]
        where = f"{path} line {lineno}" if per_line else str(path)
        yield 0, _decode(piece, opts, where)


def read_documents(path: Path, fmt: str, opts):
    """Yield ``(bytes_read, None)`` progress ticks and ``(0, (doc, replaced))`` documents."""
    if fmt == "jsonl":
        return _read_jsonl(path, opts)
    if fmt in ("parquet", "arrow"):
        return _read_table(path, opts, fmt)
    if fmt in ("text", "text-lines"):
        return _read_text(path, opts, per_line=fmt == "text-lines")
    raise DataError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")


# ---------------------------------------------------------------------------- writer
class _ShardWriter:
    """Writes rows into ``shard-NNNNN.arrow`` files of at most ``shard_bytes`` document bytes."""

    def __init__(self, out_dir: Path, shard_bytes: int):
        self.out_dir, self.shard_bytes = out_dir, shard_bytes
        self.shards: list[dict] = []
        self._writer = None
        self._rows: list[tuple] = []
        self._cur = None

    def add(self, doc, n_bytes: int) -> None:
        if self._cur is not None and self._cur["bytes"] and self._cur["bytes"] + n_bytes > self.shard_bytes:
            self._close_shard()
        if self._cur is None:
            name = f"shard-{len(self.shards):05d}.arrow"
            self._cur = {"file": name, "documents": 0, "bytes": 0}
            self._writer = pa.ipc.new_file(str(self.out_dir / name), SCHEMA)
        self._rows.append(doc)
        self._cur["documents"] += 1
        self._cur["bytes"] += n_bytes
        if len(self._rows) >= _BATCH_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        texts = [d if isinstance(d, str) else None for d in self._rows]
        msgs = [None if isinstance(d, str) else [{"role": r, "content": c} for r, c in d]
                for d in self._rows]
        self._writer.write_batch(pa.record_batch([pa.array(texts, SCHEMA.field("text").type),
                                                  pa.array(msgs, SCHEMA.field("messages").type)],
                                                 schema=SCHEMA))
        self._rows = []

    def _close_shard(self) -> None:
        self._flush()
        self._writer.close()
        self._cur["file_bytes"] = (self.out_dir / self._cur["file"]).stat().st_size
        self.shards.append(self._cur)
        self._cur, self._writer = None, None

    def close(self) -> list[dict]:
        if self._cur is not None:
            self._close_shard()
        return self.shards


def _doc_bytes(doc, where: str, policy: str):
    """(document with encodable text, its UTF-8 byte count, whether lone surrogates were
    replaced): under ``replace`` each becomes U+FFFD, as invalid UTF-8 bytes do."""
    texts = [doc] if isinstance(doc, str) else [c for _, c in doc]
    try:
        return doc, sum(len(t.encode("utf-8")) for t in texts), False
    except UnicodeEncodeError:
        if policy != "replace":
            raise DataError(f"{where}: text is not valid Unicode (lone surrogate); "
                            f"{UTF8_HINT}") from None
        fix = lambda t: _SURROGATE.sub("\ufffd", t)  # noqa: E731
        doc = fix(doc) if isinstance(doc, str) else tuple((r, fix(c)) for r, c in doc)
        return _doc_bytes(doc, where, "error")[:2] + (True,)


def split_long_text(text: str, max_bytes: int) -> list[str]:
    """``text`` cut into pieces of at most ``max_bytes`` UTF-8 bytes at the boundaries the module
    docstring lists; ``[text]`` when it fits. ``max_bytes >= MIN_DOC_BYTES``."""
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return [text]
    pieces, start = [], 0
    while len(raw) - start > max_bytes:
        cut = _cut(raw, start + max_bytes // 2, start + max_bytes)
        pieces.append(raw[start:cut].decode("utf-8"))
        start = cut
    pieces.append(raw[start:].decode("utf-8"))
    return pieces


def _cut(raw: bytes, lo: int, hi: int) -> int:
    """Cut position in ``(lo, hi]``: blank line, newline, before a space/tab, character boundary."""
    for sep in (b"\n\n", b"\n"):
        i = raw.rfind(sep, lo, hi)
        if i >= 0:
            return i + len(sep)
    i = max(raw.rfind(b" ", lo + 1, hi), raw.rfind(b"\t", lo + 1, hi))
    if i > lo:
        return i
    cut = hi
    while (raw[cut] & 0xC0) == 0x80:   # a UTF-8 continuation byte: move to its lead byte
        cut -= 1
    return cut


def fingerprint_inputs(files: list[Path], options: dict) -> str:
    entries = []
    for path in files:
        st = path.stat()
        entries.append([str(path.resolve()), st.st_size, st.st_mtime_ns])
    payload = json.dumps({"version": FORMAT_VERSION, "files": entries, "options": options},
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def _up_to_date(out: Path, fingerprint: str) -> dict | None:
    try:
        index = json.loads((out / "index.json").read_text())
    except (OSError, ValueError):
        return None
    if index.get("fingerprint") != fingerprint:
        return None
    for shard in index.get("shards", []):
        path = out / shard["file"]
        if not path.is_file() or path.stat().st_size != shard.get("file_bytes"):
            return None
    return index


def _add_document(writer: _ShardWriter, doc, src: dict, totals: dict, opts: dict) -> bool:
    """Write one non-empty document, split into pieces when it is a long text (see above);
    True when lone surrogates in it were replaced."""
    doc, n_bytes, fixed = _doc_bytes(doc, f"{src['path']} document {src['documents'] + 1}",
                                     opts["invalid_utf8"])
    limit = opts["max_doc_bytes"]
    pieces = split_long_text(doc, limit) if isinstance(doc, str) and limit and n_bytes > limit \
        else [doc]
    if len(pieces) > 1:
        src["split_documents"] += 1
    for piece in pieces:
        if len(pieces) > 1 and not piece.strip():
            src["skipped_empty"] += 1
            continue
        size = n_bytes if len(pieces) == 1 else len(piece.encode("utf-8"))
        src["documents_from_splits"] += len(pieces) > 1
        writer.add(piece, size)
        src["documents"] += 1
        src["bytes"] += size
        totals["text" if isinstance(piece, str) else "chat"] += 1
    return fixed


def _convert(files, fmt, tmp: Path, opts: dict, shard_bytes: int, progress: bool) -> dict:
    writer = _ShardWriter(tmp, shard_bytes)
    sources, totals = [], {"documents": 0, "bytes": 0, "text": 0, "chat": 0, "skipped": 0,
                           "replaced": 0, "split": 0, "pieces": 0}
    total_size = sum(p.stat().st_size for p in files)
    with tqdm(total=total_size, unit="B", unit_scale=True, desc="prepare", disable=not progress) as bar:
        for path in files:
            file_fmt = detect_format(path, fmt)
            src = {"path": str(path), "format": file_fmt, "documents": 0, "bytes": 0,
                   "skipped_empty": 0, "split_documents": 0, "documents_from_splits": 0}
            for ticks, item in read_documents(path, file_fmt, opts):
                bar.update(ticks)
                if item is None:
                    continue
                doc, replaced = item
                if (not doc.strip()) if isinstance(doc, str) else is_empty_conversation(doc):
                    src["skipped_empty"] += 1
                    continue
                fixed = _add_document(writer, doc, src, totals, opts)
                totals["replaced"] += int(replaced or fixed)
            sources.append(src)
            totals["documents"] += src["documents"]
            totals["bytes"] += src["bytes"]
            totals["skipped"] += src["skipped_empty"]
            totals["split"] += src["split_documents"]
            totals["pieces"] += src["documents_from_splits"]
    return {
        "format_version": FORMAT_VERSION,
        "documents": totals["documents"], "bytes": totals["bytes"],
        "text_documents": totals["text"], "chat_documents": totals["chat"],
        "skipped_empty": totals["skipped"], "replaced_invalid_utf8": totals["replaced"],
        "split_documents": totals["split"], "documents_from_splits": totals["pieces"],
        "max_doc_bytes": opts["max_doc_bytes"],
        "schema": {f.name: str(f.type) for f in SCHEMA},
        "shards": writer.close(), "sources": sources,
    }


def _install(tmp: Path, out: Path, index: dict, replace_file: bool = False) -> None:
    """Move the new shards in, then write the index. The old index is first replaced by an
    *incomplete* marker, so an interrupted install leaves a folder that every reader refuses
    (and the next run prepares again), never old and new shards under the old index."""
    if replace_file:               # --overwrite of a file: replaced once the data is ready
        out.unlink()
        out.mkdir()
    try:
        old = json.loads((out / "index.json").read_text()).get("shards", [])
    except (OSError, ValueError, AttributeError):
        old = []
    marker = tmp / "incomplete.json"
    marker.write_text(json.dumps({INCOMPLETE: True}) + "\n")
    os.replace(marker, out / "index.json")
    for shard in index["shards"]:
        os.replace(tmp / shard["file"], out / shard["file"])
    keep = {s["file"] for s in index["shards"]}
    for shard in old:
        if shard.get("file") not in keep and (out / shard["file"]).is_file():
            (out / shard["file"]).unlink()
    tmp_index = tmp / "index.json"
    tmp_index.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    os.replace(tmp_index, out / "index.json")


def _resolved(paths) -> list[str]:
    return [str(Path(p).resolve()) for p in paths]


def _check_output(out: Path, inputs, files: list[Path], overwrite: bool) -> bool:
    """An existing file, or a dataset prepared from other inputs, is replaced only with
    ``overwrite``; otherwise a DataError says what is there. (The same inputs, however spelt,
    changed, with files added to an input folder or with other options, are prepared again in
    place.) Returns whether ``out`` is a file to replace (after the conversion succeeds)."""
    if out.exists() and not out.is_dir():
        if not overwrite:
            raise DataError(f"output {out} exists and is not a directory; choose another output "
                            "directory (-o), or pass --overwrite to replace the file")
        return True
    try:
        index = json.loads((out / "index.json").read_text())
        sources = [s.get("path") for s in index.get("sources", [])]
    except (OSError, ValueError, AttributeError):
        return False
    if index.get(INCOMPLETE):      # an interrupted prepare: finish the job
        return False
    same = index.get("inputs") == _resolved(inputs) if "inputs" in index else \
        _resolved(sources) == _resolved(files)
    if not overwrite and not same:
        shown = ", ".join(map(str, sources[:3])) + (", ..." if len(sources) > 3 else "")
        raise DataError(f"output {out} already holds a dataset prepared from other inputs "
                        f"({index.get('documents', '?')} documents from {shown or '?'}); choose "
                        "another output directory (-o), or pass --overwrite to replace it")


def prepare(inputs, out_dir, *, text_column: str = "text", messages_column: str = "messages",
            fmt: str = "auto", invalid_utf8: str = "error", shard_bytes: int = 256 << 20,
            max_doc_bytes: int = MAX_DOC_BYTES, progress: bool = True,
            overwrite: bool = False) -> tuple[dict, bool]:
    """Convert ``inputs`` into shards under ``out_dir``; returns ``(index, wrote)``.

    ``wrote`` is False when the output was already up to date (nothing was touched). An output
    that is a file, or a dataset prepared from other inputs or options, is an error unless
    ``overwrite``.
    """
    if fmt not in FORMATS:
        raise DataError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    if invalid_utf8 not in ("error", "replace"):
        raise DataError(f"invalid_utf8 must be 'error' or 'replace', got {invalid_utf8!r}")
    if shard_bytes <= 0:
        raise DataError(f"shard_bytes must be positive, got {shard_bytes}")
    if max_doc_bytes != 0 and max_doc_bytes < MIN_DOC_BYTES:
        raise DataError(f"max_doc_bytes must be 0 (never split) or at least {MIN_DOC_BYTES}, "
                        f"got {max_doc_bytes}")
    files = expand_inputs(inputs)
    opts = {"text_column": text_column, "messages_column": messages_column,
            "invalid_utf8": invalid_utf8, "max_doc_bytes": max_doc_bytes}
    options = dict(opts, format=fmt, shard_bytes=shard_bytes)
    fingerprint = fingerprint_inputs(files, options)
    out = Path(out_dir)
    current = _up_to_date(out, fingerprint) if out.is_dir() else None
    if current is not None:
        return current, False
    replace_file = _check_output(out, inputs, files, overwrite)
    home = out.parent if replace_file else out      # the new shards are written next to it
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create output directory {home}: {exc.strerror or exc}") from None
    tmp = Path(tempfile.mkdtemp(prefix=".prepare-", dir=home))
    try:
        index = _convert(files, fmt, tmp, opts, shard_bytes, progress)
        if index["documents"] == 0:
            names = ", ".join(str(f) for f in files) or ", ".join(str(i) for i in inputs)
            raise DataError(f"{names}: no documents to write ({index['skipped_empty']} empty "
                            f"row(s) skipped); check the file and --text-column "
                            f"{text_column!r} / --messages-column {messages_column!r}")
        index["fingerprint"] = fingerprint
        index["options"] = options
        index["inputs"] = _resolved(inputs)
        _install(tmp, out, index, replace_file)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return index, True
