"""Document sources: memory-mapped arrow shards (and parquet files) with random access by index.

A :class:`DocumentSource` opens

* a directory written by ``xdistill data prepare`` (``index.json`` + ``shard-*.arrow``),
* a directory of ``.arrow`` / ``.feather`` / ``.ipc`` / ``.parquet`` files (e.g. a Hugging Face
  ``datasets`` split saved with ``save_to_disk``), or
* single such files,

and exposes ``len(source)`` documents; ``source.get(i)`` returns a ``str`` (text document) or a
tuple of ``(role, content)`` pairs (chat document). Arrow files (IPC file or stream format) are
memory-mapped: opening a shard reads only its metadata and a document's bytes are touched only when
it is read. Parquet files cannot be memory-mapped column-wise: their text column is decoded into
memory (convert large parquet corpora with ``xdistill data prepare``).

The text column may be ``string``/``large_string`` or ``binary``; bytes are decoded as UTF-8 with
the ``invalid_utf8`` policy (``"error"``: a :class:`DataError` naming the file and row;
``"replace"``: U+FFFD). A chat column is ``list<struct<role, content>>``. Rows where the chosen
column is null are empty documents (the packer skips and counts them).

The source is picklable: opened memory maps are dropped on pickling and reopened lazily, so
DataLoader workers started with ``spawn`` map the files themselves instead of copying them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from xdistill.data.chat import as_conversation
from xdistill.errors import DataError

ARROW_SUFFIXES = (".arrow", ".feather", ".ipc")
PARQUET_SUFFIXES = (".parquet",)
INDEX_NAME = "index.json"
# the key of the index `data prepare` writes while it moves shards in (an interrupted one leaves it)
INCOMPLETE = "incomplete"


# suffixes of the raw input formats `xdistill data prepare` reads (not arrow shards)
_RAW_SUFFIXES = (".jsonl", ".ndjson", ".json", ".txt", ".md", ".csv")

def check_complete(folder: Path, index) -> None:
    """DataError when ``index`` (of ``folder``) is the marker an interrupted prepare left."""
    if isinstance(index, dict) and index.get(INCOMPLETE):
        raise DataError(f"{folder}: an `xdistill data prepare` into it stopped before it "
                        "finished (index.json marks it incomplete); run it again")


def decode_utf8(raw: bytes, policy: str, where: str,
                hint: str = "set data.invalid_utf8=replace to substitute U+FFFD") -> str:
    """Decode ``raw`` as UTF-8 under ``policy`` ("error" | "replace"); errors name ``where`` and
    end with ``hint`` (the option that changes the policy where the caller reads it)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if policy == "replace":
            return raw.decode("utf-8", errors="replace")
        raise DataError(f"{where}: invalid UTF-8 at byte {exc.start} ({hint})") from None


CORRUPT_HINT = ("the shard is corrupt: prepare the data again (`xdistill data info --verify` "
                "reports the first bad row)")


def _offsets_ok(arr, start: int, stop: int, limit: int | None = None) -> bool:
    """Whether the offsets of rows ``start..stop-1`` of a binary/string/list array ``arr`` are
    ordered and inside its data (``limit``: the child's length for a list). Arrow reads them
    unchecked: a corrupt offset made a loader worker abort (``std::length_error``)."""
    t = arr.type
    large = pa.types.is_large_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_list(t)
    buffers = arr.buffers()
    if limit is None:
        limit = buffers[2].size if len(buffers) > 2 and buffers[2] is not None else 0
    offs = np.frombuffer(buffers[1], dtype=np.int64 if large else np.int32)
    window = offs[arr.offset + start: arr.offset + stop + 1]
    return (len(window) == stop - start + 1 and int(window[0]) >= 0
            and int(window[-1]) <= limit and bool(np.all(np.diff(window) >= 0)))


def _chat_row_ok(chunk, j: int) -> bool:
    """The offsets a chat row's ``as_py()`` follows: the list, then each string field."""
    values = chunk.values
    if not _offsets_ok(chunk, j, j + 1, len(values)):
        return False
    large = pa.types.is_large_list(chunk.type)   # polars writes large_list by default
    offs = np.frombuffer(chunk.buffers()[1], dtype=np.int64 if large else np.int32)
    lo, hi = int(offs[chunk.offset + j]), int(offs[chunk.offset + j + 1])
    return all(_offsets_ok(values.field(k), values.offset + lo, values.offset + hi)
               for k in range(values.type.num_fields)
               if pa.types.is_binary(values.type.field(k).type)
               or pa.types.is_string(values.type.field(k).type)
               or pa.types.is_large_string(values.type.field(k).type)
               or pa.types.is_large_binary(values.type.field(k).type))


def _open_arrow(path: Path) -> pa.Table:
    if not path.is_file():
        raise DataError(f"missing shard {path}")
    try:
        mm = pa.memory_map(str(path), "r")
        try:
            table = pa.ipc.open_file(mm).read_all()
        except pa.ArrowInvalid:
            mm.seek(0)
            table = pa.ipc.open_stream(mm).read_all()
        table.validate()   # buffer sizes against lengths (cheap; row offsets: see _offsets_ok)
        return table
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        raw = Path(path).suffix.lower() in _RAW_SUFFIXES
        hint = (f"; {Path(path).suffix} is an input format: prepare it first (xdistill data "
                f"prepare {path} -o DIR) and give DIR" if raw else "")
        raise DataError(f"corrupt or unreadable arrow shard {path}: {exc}{hint}") from None


def _open_parquet(path: Path, columns: list[str] | None) -> pa.Table:
    if not path.is_file():
        raise DataError(f"missing shard {path}")
    try:
        return pq.read_table(str(path), columns=columns, memory_map=True)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        raise DataError(f"corrupt or unreadable parquet shard {path}: {exc}") from None


def resolve_files(paths) -> tuple[list[Path], list[int] | None]:
    """Shard files of the given paths, plus expected row counts when an index provides them."""
    files: list[Path] = []
    counts: list[int] | None = []
    for raw in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        path = Path(raw)
        if path.is_dir() and (path / INDEX_NAME).is_file():
            try:
                index = json.loads((path / INDEX_NAME).read_text())
                check_complete(path, index)
                shards = index["shards"]
            except (ValueError, KeyError, TypeError) as exc:
                raise DataError(f"corrupt index {path / INDEX_NAME}: {exc}") from None
            files += [path / s["file"] for s in shards]
            if counts is not None:
                counts += [int(s["documents"]) for s in shards]
        elif path.is_dir():
            found = sorted(p for p in path.iterdir()
                           if p.suffix in ARROW_SUFFIXES + PARQUET_SUFFIXES)
            if not found:
                raise DataError(f"no .arrow/.feather/.parquet files or {INDEX_NAME} in {path}")
            files += found
            counts = None
        elif path.exists() or path.suffix in ARROW_SUFFIXES + PARQUET_SUFFIXES:
            files.append(path)
            counts = None
        else:
            raise DataError(f"data path {path} does not exist")
    return files, counts


@dataclass(frozen=True)
class _Shard:
    path: Path
    text: tuple | None  # binary pa.Array per record batch of the text column (None: absent)
    chat: tuple | None  # pa.Array per record batch of the chat column (None: absent)
    chunk_offsets: np.ndarray  # [n_chunks + 1] row offsets


def as_binary(arr, path, column: str):
    """A text column as (large) binary; DataError naming the column when it holds no text."""
    if pa.types.is_large_string(arr.type):
        return arr.cast(pa.large_binary())
    if pa.types.is_string(arr.type):
        return arr.cast(pa.binary())
    if pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type):
        return arr
    raise DataError(f"{path}: text column {column!r} has type {arr.type}, expected string or binary")


class DocumentSource:
    """Random access to the documents of one or more shards (see the module docstring)."""

    def __init__(self, paths, *, text_column: str = "text", messages_column: str = "messages",
                 invalid_utf8: str = "error"):
        if invalid_utf8 not in ("error", "replace"):
            raise DataError(f"invalid_utf8 must be 'error' or 'replace', got {invalid_utf8!r}")
        self.text_column = text_column
        self.messages_column = messages_column
        self.invalid_utf8 = invalid_utf8
        self.files, expected = resolve_files(paths)
        # written by `xdistill data prepare` (valid UTF-8 by construction: bad bytes = corruption)
        self.prepared = expected is not None
        self._shards: list[_Shard] | None = None
        shards = self._open()
        counts = [int(s.chunk_offsets[-1]) for s in shards]
        if expected is not None:
            for shard, got, want in zip(shards, counts, expected):
                if got != want:
                    raise DataError(f"corrupt shard {shard.path}: {got} rows, index says {want}")
        self.doc_offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=self.doc_offsets[1:])

    # ------------------------------------------------------------------ opening
    def _open(self) -> list[_Shard]:
        if self._shards is None:
            self._shards = [self._open_one(p) for p in self.files]
        return self._shards

    def _open_one(self, path: Path) -> _Shard:
        if path.suffix in PARQUET_SUFFIXES:
            try:
                names = pq.read_schema(str(path)).names if path.is_file() else []
            except (pa.ArrowInvalid, OSError) as exc:
                raise DataError(f"corrupt or unreadable parquet shard {path}: {exc}") from None
            wanted = [c for c in (self.text_column, self.messages_column) if c in names]
            table = _open_parquet(path, wanted or None)
        else:
            table = _open_arrow(path)
        names = table.schema.names
        if self.text_column not in names and self.messages_column not in names:
            raise DataError(f"{path} has no text column {self.text_column!r} (nor a chat column "
                            f"{self.messages_column!r}); columns found: {', '.join(names) or 'none'}")
        text = chat = None
        if self.text_column in names:
            arr = as_binary(table.column(self.text_column), path, self.text_column)
            text = tuple(arr.chunks)
        if self.messages_column in names:
            col = table.column(self.messages_column)
            if not ((pa.types.is_list(col.type) or pa.types.is_large_list(col.type))
                    and pa.types.is_struct(col.type.value_type)):
                raise DataError(f"{path}: chat column {self.messages_column!r} has type "
                                f"{col.type}, expected a list of {{role, content}} structs (a "
                                "column of JSON strings must be parsed first, e.g. by `xdistill "
                                "data prepare` from jsonl)")
            chat = tuple(col.chunks)
        lengths = [len(c) for c in (text if text is not None else chat)]
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if text is not None and chat is not None and [len(c) for c in chat] != lengths:
            chat = tuple(pa.chunked_array(chat).combine_chunks().slice(int(offsets[k]), n)
                         for k, n in enumerate(lengths))
        return _Shard(path, text, chat, offsets)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_shards"] = None
        return state

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return int(self.doc_offsets[-1])

    def locate(self, i: int) -> tuple[Path, int]:
        """(shard file, row within it) of document ``i``."""
        s = int(np.searchsorted(self.doc_offsets, i, side="right")) - 1
        return self.files[s], i - int(self.doc_offsets[s])

    def get(self, i: int):
        """Document ``i``: ``str`` (text) or tuple of ``(role, content)`` (chat); ``""`` if null."""
        if not 0 <= i < len(self):
            raise IndexError(f"document {i} outside source of {len(self)} documents")
        s = int(np.searchsorted(self.doc_offsets, i, side="right")) - 1
        shard = self._open()[s]
        row = i - int(self.doc_offsets[s])
        c = int(np.searchsorted(shard.chunk_offsets, row, side="right")) - 1
        j = row - int(shard.chunk_offsets[c])
        where = f"{shard.path} row {row}"
        if shard.text is not None:
            chunk = shard.text[c]
            if not _offsets_ok(chunk, j, j + 1):   # checked before arrow follows them
                raise DataError(f"{where}: text offsets out of range; {CORRUPT_HINT}")
            value = chunk[j]
            if value.is_valid:
                hint = CORRUPT_HINT if self.prepared else None
                return decode_utf8(value.as_py(), self.invalid_utf8, where,
                                   *([hint] if hint else []))
        if shard.chat is not None:
            chunk = shard.chat[c]
            if not _chat_row_ok(chunk, j):
                raise DataError(f"{where}: chat message offsets out of range; {CORRUPT_HINT}")
            value = chunk[j]
            if value.is_valid:
                try:
                    return as_conversation(value.as_py(), where)
                except UnicodeDecodeError:
                    raise DataError(f"{where}: invalid UTF-8 in chat messages") from None
        return ""
