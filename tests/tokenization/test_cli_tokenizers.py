"""``xdistill tokenizers inspect`` / ``compare`` through ``main([...])``."""

from __future__ import annotations

import json

from xdistill.commands.tokenizers import common_spans, main, show_bytes


def test_inspect_text(get_tokenizer, capsys):
    assert main(["inspect", "phi3", "--max-roles", "20"]) == 0
    out = capsys.readouterr().out
    assert "family:      spm" in out and "vocab_size:  32064" in out
    assert get_tokenizer("phi3").fingerprint in out
    assert "chat" in out and "<|assistant|>" in out and "eos" in out and "bos" in out


def test_inspect_json(get_tokenizer, capsys):
    assert main(["inspect", "bert", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["family"] == "wordpiece" and info["lossy"] is True and info["vocab_size"] == 30522
    assert info["fingerprint"] == get_tokenizer("bert").fingerprint
    assert [101, "[CLS]"] in info["roles"]["bos"] and info["bytes"]["max_bytes"] > 10


def test_compare_side_by_side(capsys):
    from xdistill.cli import main as cli_main

    assert cli_main(["tokenizers", "compare", "gpt2", "mistral", "Hello  wörld 😀"]) == 0
    out = capsys.readouterr().out
    assert "A = gpt2 (byte_bpe" in out and "B = mistral (spm" in out
    assert "phantom prefix 1 B" in out
    assert "[   0,   5)  15496:'Hello'" in out              # both sides end "Hello" at byte 5
    assert out.strip().splitlines()[-1].endswith("identical 1:1 token pairs")


def test_common_spans_cover_text_in_order(get_tokenizer):
    a, b = get_tokenizer("qwen2"), get_tokenizer("phi3")
    text = "def f(x):\n\treturn  x  # 😀 日本語"
    ea, eb = a.encode(text), b.encode(text)
    rows = common_spans(ea, eb)
    assert rows[0][0] == 0 and rows[-1][1] == len(text.encode())
    assert all(r0[1] == r1[0] for r0, r1 in zip(rows, rows[1:]))
    assert sorted(i for r in rows for i in r[2]) == list(range(len(ea)))
    assert sorted(j for r in rows for j in r[3]) == list(range(len(eb)))
    assert show_bytes(b"a\tb\xf0") == "a\\tb\\xf0"
