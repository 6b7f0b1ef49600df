"""``xdistill align show`` on real tokenizers."""

from __future__ import annotations

import pytest

from xdistill.cli import main as cli_main
from xdistill.commands.align import escape, main


def test_escape_is_readable_and_unambiguous():
    assert escape("a\tb\n中 🙂".encode()) == "a\\tb\\n中 🙂"
    assert escape(b"\xf0\x9f" + b"\\x") == "\\xf0\\x9f\\\\x"
    assert escape(b"\x00\x1b") == "\\x00\\x1b"


def test_show_prints_chunks_unaligned_regions_and_coverage(get_tokenizer, capsys):
    get_tokenizer("gpt2"), get_tokenizer("bert")
    assert main(["show", "--student", "gpt2", "--teacher", "bert", "--text",
                 "Hello World, fine!\n🙂 ok"]) == 0
    out = capsys.readouterr().out
    assert "path: dp" in out and "coverage: student" in out
    assert "unaligned student regions" in out and " World" in out and "\\n" in out
    assert "= s[" in out  # at least one exact pair (",")
    assert "teacher world" in out   # " World" ~ "world" in the lossy comparison space


def test_show_space_chunks_from_file(get_tokenizer, tmp_path, capsys):
    get_tokenizer("gpt2"), get_tokenizer("qwen2")
    path = tmp_path / "t.txt"
    path.write_text("def add(a, b):\n    return a + b  # 中文\n", encoding="utf-8")
    assert main(["show", "--student", "gpt2", "--teacher", "qwen2", "--file", str(path),
                 "--chunks", "space"]) == 0
    out = capsys.readouterr().out
    assert "path: exact" in out and "coverage: student 100.0%" in out


def test_show_errors_are_one_line(capsys, tmp_path):
    assert cli_main(["align", "show", "--student", "gpt2", "--teacher", "gpt2", "--file",
                     str(tmp_path / "missing.txt")]) == 2
    assert "missing.txt" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["show", "--student", "gpt2", "--teacher", "gpt2"])   # neither --text nor --file
