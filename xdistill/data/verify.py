"""``xdistill data info [--verify]``: check a prepared directory; read every row as training does.

:func:`check_shards` (``data info``) checks a prepared directory's index against its shards
(present, same size, readable, the recorded row counts); a shard whose bytes were damaged in place
passes that, and training failed later inside a loader worker. :func:`verify_documents` opens the same
:class:`~xdistill.data.source.DocumentSource` the loaders open and fetches every row: the offset
checks, UTF-8 decoding and conversation validation of training run on each; every role must be a
known one (:data:`~xdistill.data.chat.CHAT_ROLES` or one of ``loss_roles``: ShareGPT's human/gpt
are not) and every conversation must contain a role of ``loss_roles`` (``data.loss_roles``), as
training requires. The first bad row is a :class:`~xdistill.errors.DataError` naming its file and
row.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from tqdm import tqdm

from xdistill.data.chat import CHAT_ROLES, check_roles, is_empty_conversation
from xdistill.data.packing import check_roles_message
from xdistill.data.source import DocumentSource, check_complete
from xdistill.errors import DataError


def verify_documents(paths, *, text_column: str = "text", messages_column: str = "messages",
                     invalid_utf8: str = "error", loss_roles=("assistant",),
                     progress: bool = True) -> dict:
    """Fetch every document of ``paths``; returns counts (``documents``, ``text``, ``chat``,
    ``empty``) or raises a DataError naming the first bad file and row."""
    source = DocumentSource(paths, text_column=text_column, messages_column=messages_column,
                            invalid_utf8=invalid_utf8)
    counts = {"documents": len(source), "text": 0, "chat": 0, "empty": 0}
    roles_wanted = frozenset(loss_roles)
    accepted = CHAT_ROLES + tuple(sorted(roles_wanted - set(CHAT_ROLES)))   # as PackedDataset
    for i in tqdm(range(len(source)), desc="verify", unit="doc", disable=not progress):
        doc = source.get(i)
        if isinstance(doc, str):
            counts["text" if doc else "empty"] += 1
            continue
        counts["chat"] += 1
        path, row = source.locate(i)
        check_roles(doc, f"{path} row {row}", accepted)
        roles = {r for r, _ in doc}
        if not is_empty_conversation(doc) and not roles & roles_wanted:
            raise DataError(check_roles_message(f"{path} row {row}", roles, roles_wanted))
    return counts


_INDEX_KEYS = ("documents", "bytes", "shards", "skipped_empty")


def check_index(path: Path, index) -> None:
    """DataError unless ``index`` (read from ``path``) is a prepared dataset's index: an object
    with the summary counts and a list of shards, each naming its ``file``."""
    check_complete(path.parent, index)
    missing = [k for k in _INDEX_KEYS if k not in index] if isinstance(index, dict) else None
    if missing is None or missing:
        what = f"lacks {', '.join(map(repr, missing))}" if missing else \
            f"is a JSON {type(index).__name__}"
        raise DataError(f"{path} is not an index written by `xdistill data prepare` (it {what}); "
                        "prepare the data into this folder, or give another folder")
    shards = index["shards"]
    bad = None if isinstance(shards, list) else "'shards' is not a list"
    for i, shard in enumerate(shards if bad is None else []):
        if not isinstance(shard, dict) or not isinstance(shard.get("file"), str):
            bad = f"shard entry {i} names no 'file'"
            break
    if bad:
        raise DataError(f"{path} is not an index written by `xdistill data prepare` ({bad})")


def check_shards(out: str | Path, index: dict) -> None:
    """DataError naming the first shard of ``index`` that is missing, has another size than when
    it was written, or is not a readable arrow file with its recorded number of rows."""
    out = Path(out)
    for shard in index.get("shards", []):
        path = out / shard["file"]
        if not path.is_file():
            raise DataError(f"{path}: shard listed in {out / 'index.json'} is missing")
        size = path.stat().st_size
        if "file_bytes" in shard and size != shard["file_bytes"]:
            raise DataError(f"{path}: {size} bytes on disk, {shard['file_bytes']} when written "
                            "(truncated or overwritten): prepare the data again")
        try:
            with pa.memory_map(str(path)) as source:
                rows = pa.ipc.open_file(source).read_all().num_rows
        except (pa.ArrowInvalid, OSError) as exc:
            raise DataError(f"{path}: not a readable arrow shard ({exc})") from None
        if "documents" in shard and rows != shard["documents"]:
            raise DataError(f"{path}: {rows} rows, the index says {shard['documents']}")
