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


def test_a_null_text_says_it_is_null(tmp_path):
    """It said "no 'text' or 'messages' key; keys found: text"."""
    (tmp_path / "n.jsonl").write_text('{"text": "fine"}\n{"text": null}\n')
    with pytest.raises(DataError, match=r"n.jsonl line 2: 'text' is null; give the document's "
                                        r"text \(or its 'messages' list\), or drop the line$"):
        prepare([tmp_path / "n.jsonl"], tmp_path / "o", progress=False)


def test_output_onto_a_file_or_another_dataset_needs_overwrite(tmp_path, capsys):
    """Onto a file it was a traceback (FileExistsError); onto another dataset it replaced it
    silently. The same inputs are still prepared again in place (see the idempotence test)."""
    src = _write_inputs(tmp_path)
    target = tmp_path / "notes.txt"
    target.write_text("my notes")
    cmd = ["data", "prepare", str(src / "a.jsonl"), "-o", str(target), "-q"]
    assert cli_main(cmd) == 2
    err = capsys.readouterr().err
    assert err == (f"xdistill: error: output {target} exists and is not a directory; choose "
                   "another output directory (-o), or pass --overwrite to replace the file\n")
    assert target.read_text() == "my notes"
    assert cli_main(cmd + ["--overwrite"]) == 0 and (target / "index.json").is_file()
    capsys.readouterr()
    other = ["data", "prepare", str(src / "c.txt"), "-o", str(target), "-q"]
    assert cli_main(other) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"output {target} already holds a dataset prepared from " \
        f"other inputs (2 documents from {src / 'a.jsonl'})" in err and "--overwrite" in err
    assert cli_main(other + ["--overwrite"]) == 0
    assert "1 documents" in capsys.readouterr().out


def test_invalid_utf8_policy(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"good line\nbad \xff\xfe byte\n")
    # the hint names the flag of `data prepare` (it said invalid_utf8=replace, a config key)
    with pytest.raises(DataError, match=r"bad.txt line 2: invalid UTF-8 at byte 4 \(pass "
                                        r"--invalid-utf8 replace to substitute U\+FFFD\)$"):
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


def test_prepare_of_an_empty_directory_or_table_names_it(tmp_path, capsys):
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "empty_dir" / ".hidden").write_text("not an input")
    assert cli_main(["data", "prepare", str(tmp_path / "empty_dir"), "-o", str(tmp_path / "o")]) == 2
    assert "empty_dir: no input files" in capsys.readouterr().err
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "zero.parquet")
    with pytest.raises(DataError, match=r"zero.parquet: no documents to write \(0 empty"):
        prepare([tmp_path / "zero.parquet"], tmp_path / "o", progress=False)


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


def test_a_long_text_document_is_split_at_the_documented_boundaries(tmp_path, capsys):
    """Pieces of at most ``max_doc_bytes`` UTF-8 bytes whose concatenation is the document: cut
    after the last blank line in the second half of the limit, else after the last newline, else
    before the last space or tab (it stays with the next word, as BPE tokenizers attach it), else
    at the last character boundary."""
    from xdistill.data.prepare import split_long_text

    limit = 4096
    para = ("word " * 300).rstrip() + "\n\n"                    # 1,501 bytes
    text = para * 10 + "x" * 3000 + "\n" + "é" * 5000 + "東京" * 3000   # 2- and 3-byte characters
    pieces = split_long_text(text, limit)
    assert "".join(pieces) == text and len(pieces) > 5
    assert all(0 < len(p.encode("utf-8")) <= limit for p in pieces)
    assert pieces[0] == para * 2                       # blank line at 3,002 > 2,048: kept there
    assert all(p.endswith("\n\n") for p in pieces[:4])
    assert any(p.endswith("x\n") for p in pieces)      # no blank line in range: the newline
    assert any(set(p) == {"é"} for p in pieces)        # no whitespace: a character boundary
    assert split_long_text("short", limit) == ["short"]
    src = tmp_path / "big.txt"
    src.write_text(text, encoding="utf-8")
    index, _ = prepare([src], tmp_path / "o", max_doc_bytes=limit, progress=False)
    assert index["documents"] == len(pieces) and index["split_documents"] == 1
    assert [DocumentSource(tmp_path / "o").get(i) for i in range(len(pieces))] == pieces
    index, _ = prepare([src], tmp_path / "whole", max_doc_bytes=0, progress=False)
    assert index["documents"] == 1 and index["split_documents"] == 0
    assert cli_main(["data", "prepare", str(src), "-o", str(tmp_path / "c"), "-q",
                     "--max-doc-mb", str(limit / (1 << 20))]) == 0
    assert f"split 1 document(s) longer than {limit} bytes into {len(pieces)}" \
        in capsys.readouterr().out
    with pytest.raises(DataError, match="max_doc_bytes must be 0 .* or at least 4096"):
        prepare([src], tmp_path / "bad", max_doc_bytes=100, progress=False)


def test_a_huge_document_costs_bounded_memory_in_training(tmp_path):
    """One 4 MB single-line document (no newline for the packer to cut at): prepared whole, the
    student tokenized it in one call (peak RSS growth measured: ~640 MB; a 100 MB document took
    13.5 GB); split by ``data prepare`` (default ``max_doc_bytes``): ~80 MB, the same tokens.
    Peak growth is VmHWM in a fresh process, from after the tokenizer's warm-up."""
    import subprocess
    import sys

    words = "All the world's a stage, and all the men and women merely players. "
    (tmp_path / "big.jsonl").write_text(json.dumps({"text": words * (4 * (1 << 20) // len(words))}))
    code = """
import json, sys
from xdistill.data.packing import encode_document
from xdistill.data.prepare import prepare
from xdistill.data.source import DocumentSource
from xdistill.metrics import peak_rss_mb
from xdistill.tokenization import load_tokenizer
tmp, mode = sys.argv[1], sys.argv[2]
kw = {"max_doc_bytes": 0} if mode == "whole" else {}
prepare([tmp + "/big.jsonl"], tmp + "/" + mode, progress=False, **kw)
src = DocumentSource(tmp + "/" + mode)
tok = load_tokenizer("gpt2")
tok.encode("warm up")
before = peak_rss_mb()
tokens = sum(encode_document(tok, i, src.get(i)).ids_T.size for i in range(len(src)))
print(json.dumps({"growth": peak_rss_mb() - before, "docs": len(src), "tokens": tokens}))
"""
    out = {}
    for mode in ("split", "whole"):
        proc = subprocess.run([sys.executable, "-c", code, str(tmp_path), mode], capture_output=True,
                              text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["whole"]["docs"] == 1 and out["split"]["docs"] >= 8, out
    assert out["split"]["tokens"] == out["whole"]["tokens"], out   # cut before spaces: same ids
    assert out["split"]["growth"] * 4 < out["whole"]["growth"], out


def test_a_table_with_text_and_chat_columns_keeps_both_kinds(tmp_path):
    """Mixed data (prepare's own output, or a dataset with both columns): a row whose text is null
    is read from its messages; it was dropped as empty."""
    from xdistill.data.prepare import SCHEMA

    table = pa.table({"text": pa.array(["a text document", None, None], pa.large_string()),
                      "messages": pa.array([None, CHAT["messages"], None],
                                           SCHEMA.field("messages").type)})
    with pa.ipc.new_file(str(tmp_path / "mixed.arrow"), table.schema) as writer:
        writer.write_table(table)
    index, _ = prepare([tmp_path / "mixed.arrow"], tmp_path / "out", progress=False)
    assert (index["documents"], index["chat_documents"], index["skipped_empty"]) == (2, 1, 1)
    assert [DocumentSource(tmp_path / "out").get(i) for i in range(2)] == [
        "a text document", (("user", "Hi?"), ("assistant", "Hello!"))]
    shards = sorted((tmp_path / "out").glob("*.arrow"))           # prepare's own output as input
    again, _ = prepare(shards, tmp_path / "again", progress=False)
    assert again["documents"] == 2 and again["chat_documents"] == 1


def test_a_text_column_of_numbers_names_the_column(tmp_path):
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "i.parquet")
    with pytest.raises(DataError, match=r"i.parquet: text column 'text' has type int64, "
                                        r"expected string or binary"):
        prepare([tmp_path / "i.parquet"], tmp_path / "out", progress=False)


def test_a_lone_surrogate_is_replaced_by_u_fffd_and_counted(tmp_path):
    (tmp_path / "s.jsonl").write_text('{"text": "caf\\ud800e ok"}\n')
    index, _ = prepare([tmp_path / "s.jsonl"], tmp_path / "out", invalid_utf8="replace",
                       progress=False)
    assert DocumentSource(tmp_path / "out").get(0) == "caf\ufffde ok"
    assert index["replaced_invalid_utf8"] == 1
