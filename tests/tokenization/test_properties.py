"""Property tests over random unicode: for every lossless family, token bytes reproduce the text
and every token's byte span holds exactly its bytes."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tok_helpers import check_lossless

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60)
MIXED = st.lists(st.sampled_from(["  ", "\t", "\n", " ", "a", "Z", "1", "😀", "日", "\u0301", "é",
                                  "ß", "\x00", "▁", "Ġ", "<0x41>", "##", "'s", "..."]),
                 max_size=30).map("".join)


@pytest.mark.parametrize("name", ["gpt2", "qwen2", "llama3", "mistral", "phi3"])
def test_random_unicode_roundtrip(get_tokenizer, name):
    tok = get_tokenizer(name)

    @settings(max_examples=40, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.one_of(TEXT, MIXED))
    def run(text):
        if tok.nfc:
            text = unicodedata.normalize("NFC", text)
        if tok.family == "spm":                   # SentencePiece reads a literal ▁ as a space
            text = text.replace("\u2581", " ")
        assert tok.is_exact_on(text)
        check_lossless(tok, text)

    run()
