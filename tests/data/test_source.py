"""DocumentSource: prepared shards, foreign arrow/parquet datasets, and bad shards."""

from __future__ import annotations

import json
import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from xdistill.data.prepare import prepare
from xdistill.data.source import DocumentSource
from xdistill.errors import DataError


@pytest.fixture
def prepared(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"document number {i}"}) + "\n" for i in range(30)))
    prepare([src], tmp_path / "out", shard_bytes=200, progress=False)
    return tmp_path / "out"


def test_prepared_shards_random_access_and_pickle(prepared):
    src = DocumentSource(prepared)
    assert len(src) == 30 and len(src.files) > 1
    assert src.get(17) == "document number 17"
    clone = pickle.loads(pickle.dumps(src))  # workers reopen the memory maps themselves
    assert clone._shards is None and clone.get(29) == "document number 29"


def test_missing_shard_names_the_file(prepared):
    victim = sorted(prepared.glob("shard-*.arrow"))[1]
    victim.unlink()
    with pytest.raises(DataError, match=f"missing shard .*{victim.name}"):
        DocumentSource(prepared)


def test_corrupt_shard_names_the_file(prepared):
    victim = sorted(prepared.glob("shard-*.arrow"))[0]
    victim.write_bytes(victim.read_bytes()[:50])
    with pytest.raises(DataError, match=f"corrupt or unreadable arrow shard .*{victim.name}"):
        DocumentSource(prepared)


def test_foreign_arrow_stream_and_parquet_with_text_column(tmp_path):
    table = pa.table({"id": [1, 2], "content": ["alpha", "beta"]})
    with pa.ipc.new_stream(str(tmp_path / "data-00000-of-00001.arrow"), table.schema) as w:
        w.write_table(table)  # Hugging Face save_to_disk layout (IPC stream format)
    pq.write_table(table, tmp_path / "extra.parquet")
    src = DocumentSource(tmp_path, text_column="content")
    assert [src.get(i) for i in range(len(src))] == ["alpha", "beta", "alpha", "beta"]
    with pytest.raises(DataError, match=r"no text column 'text'.*columns found: id, content"):
        DocumentSource(tmp_path / "extra.parquet")


def test_binary_column_invalid_utf8_policy(tmp_path):
    pq.write_table(pa.table({"text": pa.array([b"ok", b"bad \xff"], pa.binary())}), tmp_path / "b.parquet")
    with pytest.raises(DataError, match=r"b.parquet row 1: invalid UTF-8 at byte 4"):
        DocumentSource(tmp_path / "b.parquet").get(1)
    assert DocumentSource(tmp_path / "b.parquet", invalid_utf8="replace").get(1) == "bad \ufffd"


def test_nonexistent_path(tmp_path):
    with pytest.raises(DataError, match="missing shard .*nope.arrow"):
        DocumentSource(tmp_path / "nope.arrow")


def test_a_large_list_messages_column_reads_like_a_list_one(tmp_path):
    """Polars writes ``large_list`` by default: its 64-bit offsets were read as 32-bit ones and
    the valid shard reported as corrupt."""
    struct = pa.struct([("role", pa.string()), ("content", pa.string())])
    rows = [[{"role": "user", "content": "hi " * k}, {"role": "assistant", "content": "yo " * k}]
            for k in range(1, 6)]
    got = {}
    for name, typ in (("list", pa.list_(struct)), ("large", pa.large_list(struct))):
        table = pa.table({"messages": pa.array(rows, typ)})
        with pa.ipc.new_file(str(tmp_path / f"{name}.arrow"), table.schema) as writer:
            writer.write_table(table)
        src = DocumentSource(tmp_path / f"{name}.arrow")
        got[name] = [src.get(i) for i in range(len(src))]
    assert got["large"] == got["list"] and got["list"][4][1] == ("assistant", "yo " * 5)


def test_a_raw_jsonl_given_as_data_names_data_prepare(tmp_path):
    """A .jsonl file passed where prepared data is expected (eval --data, data.paths) is not an
    arrow shard: the error says to prepare it first."""
    from xdistill.data.source import DocumentSource
    from xdistill.errors import DataError

    raw = tmp_path / "m.jsonl"
    raw.write_text('{"text": "hello"}\n')
    with pytest.raises(DataError, match="xdistill data prepare"):
        len(DocumentSource([str(raw)]))
