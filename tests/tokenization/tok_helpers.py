"""Shared data and checks for the tokenization tests (a uniquely named module, imported as
``from tok_helpers import ...``; ``conftest`` would clash with other test folders)."""

from __future__ import annotations

import json
import shutil
import unicodedata

import numpy as np

from xdistill.tokenization import ROLE_TEXT

#: every fetched tokenizer asset, and those whose token bytes reproduce the text exactly
ALL_ASSETS = ("gpt2", "qwen2", "llama3", "mistral", "bert", "llama-spm", "phi3")
LOSSLESS = ("gpt2", "qwen2", "llama3", "mistral", "llama-spm", "phi3")

CORPUS = [
    # English prose
    "The quick brown fox jumps over the lazy dog. It wasn't me, she said; they'd gone.",
    "Hello world",
    " leading space, trailing space ",
    # code with tabs and runs of spaces
    "def f(x):\n\tif x  >  1:\n\t\treturn    x ** 2  # square\n    return None\n",
    "    indented\n\n\n        more\t\t\ttabs  \r\n",
    "   ",
    "",
    # emoji (incl. ZWJ sequences and skin tones), CJK, combining marks
    "emoji 😀 🦙.cpp 👩‍👩‍👧 👍🏽 🇩🇪!",
    "日本語のテキストと中文字符，한국어 텍스트。",
    "e\u0301 a\u0308 q\u0301 n\u0303 Zalgo: Z\u0351\u0352a\u0353l\u0354g\u0355o\u0356",
    "Ünïcödé ß Ελληνικά кириллица עברית العربية हिन्दी",
    # numbers
    "3.14159 1234567890 12,345.67 -42 1e-10 0x1F 2024-11-21 ½ ⅔ ²³",
    # control characters
    "bell\x07 nul\x00 esc\x1b[0m del\x7f form\x0c vt\x0b",
    "math ∀x∈ℝ: x²≥0 → ∑ᵢ aᵢ ≤ ∞; quotes “‘’” «» — – …",
]


def nfc(tok, text: str) -> str:
    """The text a tokenizer reproduces exactly: its NFC form for NFC-normalising tokenizers."""
    return unicodedata.normalize("NFC", text) if tok.nfc else text


def check_lossless(tok, text: str, add_special_tokens: bool = False) -> None:
    """Concatenated token bytes minus the phantom prefix == UTF-8 text; slices == token bytes."""
    enc = tok.encode(text, add_special_tokens=add_special_tokens)
    data = text.encode("utf-8")
    assert enc.ids.dtype == np.int64 and enc.starts.dtype == np.int64 and enc.ends.dtype == np.int64
    assert enc.ids.tolist() == tok.hf.encode(text, add_special_tokens=add_special_tokens)
    assert tok.table.concat(enc.ids)[enc.phantom_prefix:] == data
    assert np.all(enc.starts <= enc.ends) and np.all(np.diff(enc.ends) >= 0)
    phantom_left = enc.phantom_prefix
    for tid, start, end in zip(enc.ids.tolist(), enc.starts.tolist(), enc.ends.tolist()):
        piece = tok.table.token_bytes(tid)
        if tok.table.roles_V[tid] != ROLE_TEXT:
            assert start == end
            continue
        cut = min(phantom_left, len(piece))
        phantom_left -= cut
        assert data[start:end] == piece[cut:], (tid, piece, start, end)


def with_added_token(tmp_path, asset: str, token_id: int, content: str):
    """A copy of tokenizer asset ``asset`` with ``content`` added as a non-special token of id
    ``token_id`` (loaded through :func:`xdistill.tokenization.load_tokenizer`)."""
    from xdistill.assets.paths import tokenizer_dir
    from xdistill.tokenization import load_tokenizer

    folder = tmp_path / f"{asset}_added"
    shutil.copytree(tokenizer_dir(asset), folder)
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["added_tokens"].append({"id": token_id, "content": content, "single_word": False,
                                 "lstrip": False, "rstrip": False, "normalized": False,
                                 "special": False})
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return load_tokenizer(folder)
