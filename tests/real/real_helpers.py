"""Shared texts and checks of the real-model tests (a uniquely named module, imported as
``from real_helpers import ...``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from xdistill.tokenization import ROLE_TEXT

MODELS = ("smollm2-135m", "gemma3-270m")

PROSE = [
    "The committee met on Tuesday to discuss the budget, which had grown by 12% since 2019.",
    "She opened the window; the morning air smelled of rain and cut grass.",
    "In 1,274 ships the fleet carried 38,000 men across the channel -- or so the chronicle says.",
    "  Indented line\twith a tab,\n\nthen a blank line and    four spaces.\n",
    "Prices: $3.99, €4.50, £2; call +1 (555) 010-9999 before 5:30 p.m.",
    "def area(r):\n    return 3.14159 * r ** 2  # circle\n",
    "<h1>Title</h1> <p>Some <em>emphasis</em> and <s>struck</s> text</p> [multimodal]",
]
UNICODE = [
    "Ünïcödé ß Ελληνικά кириллица עברית العربية हिन्दी",
    "日本語のテキストと中文字符，한국어 텍스트。",
    "emoji 😀 🦙.cpp 👩‍👩‍👧 👍🏽 🇩🇪!",
    "e\u0301 a\u0308 math ∀x∈ℝ: x²≥0 → ∑ᵢ aᵢ ≤ ∞; quotes “‘’” «» — – …",
]

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80)
WORDS = st.lists(st.sampled_from(
    ["the", " the", "The", " ships", " 1,274", " 2024", "12345", " ", "  ", "\n", "\n\n", "\t",
     "<s>", "</s>", "<h1>", "<em>", "[multimodal]", "é", "日本", "😀", "\u0301", ".", ",", "'s",
     " don't", "▁", "<0x41>", "Ġ", " café"]), max_size=25).map("".join)
PROSE_OR_RANDOM = st.one_of(TEXT, WORDS, st.sampled_from(PROSE + UNICODE))


def check_exact(tok, text: str) -> None:
    """Token bytes minus the phantom prefix == the UTF-8 text; each token's byte span holds
    exactly its bytes; the ids are HF's; decoding the ids gives the table bytes."""
    enc = tok.encode(text)
    data = text.encode("utf-8")
    assert enc.ids.tolist() == tok.hf.encode(text, add_special_tokens=False)
    concat = tok.table.concat(enc.ids)
    assert concat[enc.phantom_prefix:] == data, (text, concat)
    assert np.all(enc.starts <= enc.ends) and np.all(np.diff(enc.ends) >= 0)
    left = enc.phantom_prefix
    for tid, start, end in zip(enc.ids.tolist(), enc.starts.tolist(), enc.ends.tolist()):
        piece = tok.table.token_bytes(tid)
        assert tok.table.roles_V[tid] == ROLE_TEXT, (text, tid)
        cut = min(left, len(piece))
        left -= cut
        assert data[start:end] == piece[cut:], (text, tid, piece, start, end)
    check_decode(tok, enc.ids)


def check_decode(tok, ids) -> None:
    """The tokenizer's own decoder agrees with the table (where the bytes are valid UTF-8)."""
    concat = tok.table.concat(ids)
    try:
        expected = concat.decode("utf-8")
    except UnicodeDecodeError:
        return
    assert tok._backend.decode([int(i) for i in ids], skip_special_tokens=False) == expected


REAL_SCRIPTS = Path(__file__).resolve().parents[2] / "benchmarks" / "real"


def load_real_script(name: str):
    """``benchmarks/real/<name>.py`` loaded by its path as module ``real_<name>`` (tests import
    no benchmark script by its bare name)."""
    spec = importlib.util.spec_from_file_location(f"real_{name}", REAL_SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
