"""Encodings with byte offsets on a varied corpus, for every fetched tokenizer."""

from __future__ import annotations

import unicodedata

import numpy as np
import pytest

from tok_helpers import ALL_ASSETS, CORPUS, LOSSLESS, check_lossless, nfc
from xdistill.tokenization import ROLE_TEXT


@pytest.mark.parametrize("name", LOSSLESS)
def test_lossless_roundtrip_and_offsets(get_tokenizer, name):
    tok = get_tokenizer(name)
    assert not tok.lossy and not tok.table.lossy
    for text in CORPUS:
        check_lossless(tok, nfc(tok, text))


@pytest.mark.parametrize("name", LOSSLESS)
def test_special_tokens_added_by_template_have_no_bytes(get_tokenizer, name):
    tok = get_tokenizer(name)
    for text in ("Hello world", " x", ""):
        check_lossless(tok, text, add_special_tokens=True)
    enc = tok.encode("Hello", add_special_tokens=True)
    if tok.hf.encode("Hello", add_special_tokens=True)[:1] == [tok.bos_id]:
        assert enc.ids[0] == tok.bos_id and enc.starts[0] == enc.ends[0] == 0


@pytest.mark.parametrize("name", ["mistral", "llama-spm", "phi3"])
def test_sentencepiece_dummy_prefix_is_reported_not_guessed(get_tokenizer, name):
    tok = get_tokenizer(name)
    enc = tok.encode("Hello world")
    assert enc.phantom_prefix == 1 and tok.table.token_bytes(int(enc.ids[0])) == b" Hello"
    assert (enc.starts[0], enc.ends[0]) == (0, 5)
    with_bos = tok.encode("Hello world", add_special_tokens=True)
    assert with_bos.phantom_prefix == 1          # the BOS contributes no bytes


def test_byte_level_split_characters_get_exact_byte_spans(get_tokenizer):
    tok = get_tokenizer("gpt2")
    enc = tok.encode(" 😀")                       # GPT-2 splits the emoji's 4 bytes over 2 tokens
    assert len(enc) == 2
    assert enc.starts.tolist() == [0, 4] and enc.ends.tolist() == [4, 5]


def test_nfc_tokenizer_on_non_nfc_text(get_tokenizer):
    """Qwen2 applies NFC: exact on NFC text; on decomposed text it still gives sane offsets."""
    tok = get_tokenizer("qwen2")
    assert tok.nfc and not tok.lossy
    text = "cafe\u0301 ok"
    enc = tok.encode(text)
    assert tok.table.concat(enc.ids) == unicodedata.normalize("NFC", text).encode()
    assert enc.ends[-1] == len(text.encode()) and np.all(np.diff(enc.starts) >= 0)


@pytest.mark.parametrize("name", ["mistral", "phi3"])
def test_sentencepiece_literal_metaspace_character(get_tokenizer, name):
    """A literal ``▁`` in the text is read as a space by SentencePiece: not exact, but the
    offsets stay ordered and inside the text."""
    tok = get_tokenizer(name)
    text = "a\u2581b \u2581\u2581c"
    assert not tok.is_exact_on(text) and tok.is_exact_on(text.replace("\u2581", " "))
    enc = tok.encode(text)
    assert np.all(np.diff(enc.starts) >= 0) and np.all(enc.starts <= enc.ends)
    assert enc.ends[-1] == len(text.encode())


@pytest.mark.parametrize("name", ALL_ASSETS)
def test_encode_batch_matches_encode(get_tokenizer, name):
    tok = get_tokenizer(name)
    texts = [nfc(tok, t) for t in CORPUS]
    for one, many in zip((tok.encode(t) for t in texts), tok.encode_batch(texts)):
        assert one.ids.tolist() == many.ids.tolist()
        assert one.starts.tolist() == many.starts.tolist() and one.ends.tolist() == many.ends.tolist()
        assert one.phantom_prefix == many.phantom_prefix


def _bert_normalise(text: str) -> str:
    """What BERT's normaliser does to text (lowercase, strip accents, control chars removed)."""
    text = unicodedata.normalize("NFD", text.lower())
    return "".join(c for c in text if unicodedata.category(c) != "Mn")


def test_wordpiece_guarantees(get_tokenizer):
    """WordPiece is lossy; what holds: ordered in-bounds offsets, each piece equals the normalised
    text of its span, ``##`` pieces continue the previous piece, no padding or truncation."""
    tok = get_tokenizer("bert")
    assert tok.family == "wordpiece" and tok.lossy and tok.table.lossy
    assert tok.table.token_bytes(tok.hf.convert_tokens_to_ids("##ing")) == b"ing"
    assert tok.table.token_bytes(tok.hf.convert_tokens_to_ids("hello")) == b"hello"
    long_text = " ".join(CORPUS) * 8                 # beyond BERT's 128/512 limits
    assert len(tok.encode(long_text)) > 512
    for text in CORPUS:
        enc = tok.encode(text)
        data = text.encode("utf-8")
        assert np.all(enc.starts <= enc.ends) and np.all(np.diff(enc.starts) >= 0)
        assert enc.ends.size == 0 or enc.ends.max() <= len(data)
        groups: dict[tuple[int, int], bytes] = {}   # tokens sharing a span (Hangul jamo)
        for k, (tid, s, e) in enumerate(zip(enc.ids.tolist(), enc.starts.tolist(), enc.ends.tolist())):
            if tok.table.roles_V[tid] != ROLE_TEXT:
                continue
            groups[(s, e)] = groups.get((s, e), b"") + tok.table.token_bytes(tid)
            if tok.hf.convert_ids_to_tokens(tid).startswith("##"):
                # a continuation follows its word: only stripped marks may lie in between
                gap = data[min(s, enc.ends[k - 1]):s].decode("utf-8")
                assert k > 0 and _bert_normalise(gap) == "", (gap, tid)
        for (s, e), pieces in groups.items():
            span = data[s:e].decode("utf-8")
            assert _bert_normalise(span).encode() == pieces, (span, pieces)


def test_encode_rejects_non_text(get_tokenizer):
    from xdistill.errors import TokenizerError

    tok = get_tokenizer("gpt2")
    with pytest.raises(TokenizerError, match="needs a str"):
        tok.encode(b"bytes")
    with pytest.raises(TokenizerError, match="item 1"):
        tok.encode_batch(["ok", 3])
