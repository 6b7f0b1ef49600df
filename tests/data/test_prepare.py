"""`xdistill data prepare`: formats, index, idempotence, and every bad-input case."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from xdistill.cli import main as cli_main
from xdistill.data.prepare import prepare
from xdistill.data.source import DocumentSource
from xdistill.errors import DataError

CHAT = {"messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello!"}]}


def _write_inputs(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "first doc"}) + "\n\n"
                                      + json.dumps({"text": "  "}) + "\n" + json.dumps(CHAT) + "\n")
    pq.write_table(pa.table({"body": ["from parquet", "", "second parquet"]}), tmp_path / "b.parquet")
    (tmp_path / "c.txt").write_text("a whole file\nis one document\n")
    (tmp_path / "d.lines").write_text("line one\n\nline two\r\n")
    return tmp_path


def test_formats_index_and_reading_back(tmp_path):
    (tmp_path / "in").mkdir()
    src = _write_inputs(tmp_path / "in")
    index, wrote = prepare([src / "a.jsonl", src / "c.txt"], tmp_path / "o1", progress=False)
    assert wrote and index["documents"] == 3 and index["skipped_empty"] == 1
    assert index["chat_documents"] == 1 and index["bytes"] == len("first doc") + 3 + 6 + 29
    docs = [DocumentSource(tmp_path / "o1").get(i) for i in range(3)]
    assert docs == ["first doc", (("user", "Hi?"), ("assistant", "Hello!")), "a whole file\nis one document\n"]
    index, _ = prepare([src / "b.parquet"], tmp_path / "o2", text_column="body", progress=False)
    assert (index["documents"], index["skipped_empty"]) == (2, 1)
    index, _ = prepare([src / "d.lines"], tmp_path / "o3", fmt="text-lines", progress=False)
    assert [DocumentSource(tmp_path / "o3").get(i) for i in range(2)] == ["line one", "line two"]


def test_idempotent_and_byte_identical(tmp_path):
    src = _write_inputs(tmp_path)
    out = tmp_path / "out"
    index, wrote = prepare([src / "a.jsonl", src / "c.txt"], out, shard_bytes=8, progress=False)
    assert wrote and len(index["shards"]) == 3  # bounded shard size
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    _, wrote = prepare([src / "a.jsonl", src / "c.txt"], out, shard_bytes=8, progress=False)
    assert not wrote and {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes
    os.utime(src / "c.txt", ns=(1, 1))  # touched input: rerun, same bytes
    _, wrote = prepare([src / "a.jsonl", src / "c.txt"], out, shard_bytes=8, progress=False)
    new = {p.name: p.read_bytes() for p in out.iterdir()}
    assert wrote and new.keys() == files.keys()
    assert all(new[k] == files[k] for k in files if k != "index.json")
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # temp dir cleaned up


def test_cli_prepare_and_errors(tmp_path, capsys):
    src = _write_inputs(tmp_path)
    assert cli_main(["data", "prepare", str(src / "a.jsonl"), "-o", str(tmp_path / "o"), "-q"]) == 0
    assert "2 documents" in capsys.readouterr().out
    assert cli_main(["data", "prepare", str(src / "b.parquet"), "-o", str(tmp_path / "p"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("xdistill: error:") and "columns found: body" in err


def test_missing_text_key_names_keys(tmp_path):
    (tmp_path / "x.jsonl").write_text(json.dumps({"content": "x", "id": 1}) + "\n")
    with pytest.raises(DataError, match=r"x.jsonl line 1.*keys found: content, id"):
        prepare([tmp_path / "x.jsonl"], tmp_path / "o", progress=False)


def test_invalid_utf8_policy(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"good line\nbad \xff\xfe byte\n")
    with pytest.raises(DataError, match=r"bad.txt line 2: invalid UTF-8 at byte 4"):
        prepare([bad], tmp_path / "o", fmt="text-lines", progress=False)
    index, _ = prepare([bad], tmp_path / "o", fmt="text-lines", invalid_utf8="replace", progress=False)
    assert index["replaced_invalid_utf8"] == 1
    assert DocumentSource(tmp_path / "o").get(1) == "bad \ufffd\ufffd byte"


def test_invalid_json_and_bad_messages_name_the_line(tmp_path):
    (tmp_path / "j.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(DataError, match=r"j.jsonl line 2: invalid JSON"):
        prepare([tmp_path / "j.jsonl"], tmp_path / "o", progress=False)
    (tmp_path / "m.jsonl").write_text(json.dumps({"messages": [{"role": "user"}]}) + "\n")
    with pytest.raises(DataError, match=r"m.jsonl line 1: message 0 needs string 'role' and 'content'"):
        prepare([tmp_path / "m.jsonl"], tmp_path / "o2", progress=False)


@pytest.mark.parametrize("content", ["", '{"text": ""}\n{"text": "  \\n"}\n'])
def test_prepare_of_an_empty_input_is_an_error(tmp_path, capsys, content):
    """It exited 0 having written 0 documents."""
    src = tmp_path / "in.jsonl"
    src.write_text(content)
    assert cli_main(["data", "prepare", str(src), "-o", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "in.jsonl: no documents to write" in err and err.count("\n") == 1
    assert not (tmp_path / "out" / "index.json").exists()


@pytest.mark.parametrize("damage", ["truncate", "delete", "garbage"])
def test_data_info_reports_a_damaged_shard(tmp_path, capsys, damage):
    """`data info` called a truncated shard fine."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(50)))
    out = tmp_path / "out"
    prepare([src], out, progress=False)
    assert cli_main(["data", "info", str(out)]) == 0
    capsys.readouterr()
    shard = out / "shard-00000.arrow"
    data = shard.read_bytes()
    if damage == "truncate":
        shard.write_bytes(data[: len(data) // 2])
    elif damage == "delete":
        shard.unlink()
    else:
        shard.write_bytes(b"\0" * len(data))   # same size, not arrow
    assert cli_main(["data", "info", str(out)]) == 2
    err = capsys.readouterr().err
    assert "shard-00000.arrow" in err and err.count("\n") == 1, err
