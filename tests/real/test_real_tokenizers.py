"""The two real pretrained tokenizers (SmolLM2's byte-level BPE, Gemma-3's SentencePiece-style
vocabulary): exact token-bytes tables and byte offsets over random unicode and prose, their
roles, missing bytes and conventions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from real_helpers import MODELS, PROSE, PROSE_OR_RANDOM, UNICODE, check_decode, check_exact
from xdistill.tokenization import ROLE_BOS, ROLE_CHAT, ROLE_EOS, ROLE_PAD, ROLE_TEXT

pytestmark = pytest.mark.real

SMOL_MISSING = bytes([0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, *range(0xF5, 0x100)])


@pytest.mark.parametrize("name", MODELS)
def test_tables_exact_on_prose_unicode_and_random_text(get_tokenizer, name):
    tok = get_tokenizer(name)
    assert not tok.lossy
    for text in PROSE + UNICODE:
        assert tok.is_exact_on(text), text
        check_exact(tok, text)

    @settings(max_examples=60, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(PROSE_OR_RANDOM)
    def run(text):
        if tok.family == "spm":                 # SentencePiece reads a literal ▁ as a space
            text = text.replace("\u2581", " ")
        if tok.is_exact_on(text):
            check_exact(tok, text)
        else:                                   # only SmolLM2's missing bytes may do this
            assert set(text.encode()) & set(tok.table.missing_bytes), text
            check_decode(tok, tok.encode(text).ids)

    run()


def test_gemma_conventions(get_tokenizer):
    tok = get_tokenizer("gemma3-270m")
    assert tok.family == "spm" and tok.vocab_size == 262_144 and tok.table.missing_bytes == b""
    # 6,249 role tokens = the GGUF's control tokens; its 165 user-defined tokens (HTML tags,
    # [multimodal], <start_of_image>, newline and tab runs) are text with their own bytes
    assert int((tok.table.roles_V != ROLE_TEXT).sum()) == 6249
    for content in ("<h1>", "</h1>", "<em>", "<s>", "</s>", "[multimodal]", "<start_of_image>"):
        tid = tok.hf.convert_tokens_to_ids(content)
        assert tok.table.roles_V[tid] == ROLE_TEXT and tok.table.token_bytes(tid) == content.encode()
    roles = {c: tok.table.roles_V[tok.hf.convert_tokens_to_ids(c)] for c in
             ("<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>")}
    assert roles == {"<bos>": ROLE_BOS, "<eos>": ROLE_EOS, "<pad>": ROLE_PAD,
                     "<start_of_turn>": ROLE_CHAT, "<end_of_turn>": ROLE_EOS}
    # no dummy prefix: no phantom byte, a leading space is a real "▁"
    enc = tok.encode("hello world")
    assert enc.phantom_prefix == 0 and tok.table.concat(enc.ids) == b"hello world"
    assert tok.table.concat(tok.encode(" hello").ids) == b" hello"
    # digits are split one by one
    enc = tok.encode("In 2024, 1,274 ships")
    digits = [tok.table.token_bytes(int(i)) for i in enc.ids if tok.table.token_bytes(int(i)).strip().isdigit()]
    assert digits == [b"2", b"0", b"2", b"4", b"1", b"2", b"7", b"4"]
    # the model needs its <bos>: the tokenizer adds it (a role token, no bytes, offset 0)
    enc = tok.encode("hello", add_special_tokens=True)
    assert enc.ids[0] == tok.bos_id == 2 and enc.starts[0] == enc.ends[0] == 0
    # byte fallback: every byte value has a <0xNN> piece
    assert tok.table.concat(tok.encode("a\x04b\x1d").ids) == b"a\x04b\x1d"


def test_smollm2_missing_bytes_and_roles(get_tokenizer):
    tok = get_tokenizer("smollm2-135m")
    assert tok.family == "byte_bpe" and tok.vocab_size == 49_152
    assert tok.table.missing_bytes == SMOL_MISSING and len(SMOL_MISSING) == 21
    assert not tok.lossy                       # not case/whitespace folding: the aligner stays exact
    assert not tok.is_exact_on("end of text\x04") and not tok.is_exact_on("\U00040000")  # f1 80 80 80
    assert tok.is_exact_on("plain text, ÿ and 😀")
    enc = tok.encode("ab\x04cd")
    assert tok.table.concat(enc.ids) == b"abcd"      # the tokenizer drops the byte
    roles = {c: tok.table.roles_V[tok.hf.convert_tokens_to_ids(c)] for c in
             ("<|endoftext|>", "<|im_start|>", "<|im_end|>")}
    assert roles == {"<|endoftext|>": ROLE_EOS, "<|im_start|>": ROLE_CHAT, "<|im_end|>": ROLE_EOS}
    assert int((tok.table.roles_V != ROLE_TEXT).sum()) == 17
    assert tok.hf.chat_template and "<|im_start|>" in tok.hf.chat_template
    # digits: SmolLM2's merges hold no multi-digit token, so numbers are split digit by digit too
    t = tok.table
    multi = [i for i in np.flatnonzero((t.roles_V == ROLE_TEXT) & (t.lengths_V >= 2))
             if t.token_bytes(int(i)).strip().isdigit()]
    assert multi == []
