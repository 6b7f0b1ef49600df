"""Roles come from what the tokenizer says is special (never from the string's shape), and a
lossless vocabulary that lacks some byte values reports them and is not exact on texts with them.

The tokenizers here are real HF fast tokenizers trained on the spot (no assets needed)."""

from __future__ import annotations

import numpy as np
import pytest

from xdistill.tokenization import ROLE_BOS, ROLE_EOS, ROLE_SPECIAL, ROLE_TEXT, TokenByteTable
from xdistill.tokenization.bytes import bytes_to_unicode
from xdistill.tokenization.roles import role_tokens
from xdistill.tokenization.table import bytes_without_token
from xdistill.tokenization.tokenizer import Tokenizer

CORPUS = ["hello world, the <b>student</b> learns from the teacher 123 <s>x</s>"] * 20


def _byte_bpe(alphabet: list[str], added: list[tuple[str, bool]], eos: str | None = None):
    """A byte-level BPE whose base alphabet is ``alphabet`` (GPT-2 characters), plus added
    tokens ``(content, special)``."""
    from tokenizers import AddedToken, Tokenizer as RustTokenizer, models, pre_tokenizers, trainers, decoders
    from transformers import PreTrainedTokenizerFast

    rust = RustTokenizer(models.BPE())
    rust.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    rust.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, initial_alphabet=alphabet, limit_alphabet=len(alphabet))
    rust.train_from_iterator(CORPUS, trainer)
    rust.add_tokens([AddedToken(c, special=s, normalized=False) for c, s in added if not s])
    rust.add_special_tokens([AddedToken(c, special=True, normalized=False) for c, s in added if s])
    hf = PreTrainedTokenizerFast(tokenizer_object=rust, eos_token=eos)
    return Tokenizer(hf, "tiny", "trained on the spot")


FULL = sorted(bytes_to_unicode().values())


def test_non_special_added_tokens_are_text_whatever_they_look_like():
    """Before: any non-special added ``<...>``/``[...]`` token was taken as a control token with
    zero bytes (``<s>`` even as a BOS), so text containing it lost those bytes."""
    tok = _byte_bpe(FULL, [("<b>", False), ("</b>", False), ("<s>", False), ("</s>", False),
                           ("[multimodal]", False), ("<eos>", True), ("<mask>", True)], eos="<eos>")
    roles = tok.table.roles_V
    for content in ("<b>", "</b>", "<s>", "</s>", "[multimodal]"):
        tid = tok.hf.convert_tokens_to_ids(content)
        assert roles[tid] == ROLE_TEXT and tok.table.token_bytes(tid) == content.encode(), content
    assert roles[tok.hf.convert_tokens_to_ids("<eos>")] == ROLE_EOS
    assert roles[tok.hf.convert_tokens_to_ids("<mask>")] == ROLE_SPECIAL
    text = "the <b>student</b> <s>x</s> [multimodal]!"
    enc = tok.encode(text)
    assert tok.is_exact_on(text)
    assert tok.table.concat(enc.ids) == text.encode()
    data = text.encode()
    assert [data[s:e] for s, e in zip(enc.starts, enc.ends)] == \
        [tok.table.token_bytes(int(i)) for i in enc.ids]


def test_role_tokens_rules():
    declared = {"bos": "<s>", "eos": "</s>", "pad": None, "unk": "<unk>"}
    added = {0: ("<unk>", False), 1: ("<s>", False), 2: ("</s>", False), 203: ("<s>", False),
             7: ("<|end|>", True), 9: ("[PAD9]", False)}
    ids = {10: "<mask>"}
    spm = role_tokens(added, {10}, declared, ids.get, "spm")
    # SentencePiece's reserved control pieces at their default ids (Phi-3 lists </s> as a
    # plain added token); the same string elsewhere (Gemma's <s> at 203) is text
    assert spm == {0: 4, 1: ROLE_BOS, 2: ROLE_EOS, 7: ROLE_EOS, 10: ROLE_SPECIAL}
    bpe = role_tokens(added, {10}, declared, ids.get, "byte_bpe")
    assert bpe == {7: ROLE_EOS, 10: ROLE_SPECIAL}


def test_missing_bytes_are_reported_and_texts_with_them_are_not_exact():
    """Before: a byte-level BPE without some byte values was reported exact on every text,
    while the tokenizer silently dropped those bytes."""
    b2u = bytes_to_unicode()
    dropped = [0x04, 0x1D, 0xC0, 0xFF]
    alphabet = [b2u[b] for b in range(256) if b not in dropped]
    tok = _byte_bpe(alphabet, [])
    assert tok.table.missing_bytes == bytes(dropped)
    assert not tok.lossy and not tok.table.lossy       # lossy = case/whitespace folding: no
    assert tok.is_exact_on("hello world 123 ÿ")        # ÿ is c3 bf: both bytes present
    assert not tok.is_exact_on("a\x04b") and not tok.is_exact_on("end\x1d")
    text = "ab\x04cd"
    enc = tok.encode(text)
    assert tok.table.concat(enc.ids) == b"abcd"       # what the tokenizer really does
    assert np.all(enc.starts <= enc.ends) and enc.ends.max() <= len(text.encode())
    full = _byte_bpe(FULL, [])
    assert full.table.missing_bytes == b"" and full.is_exact_on("a\x04b\x1d")


def test_bytes_without_token_and_table_validation():
    table = TokenByteTable.from_bytes_list([b"a", b"b", b"ab", b"", b"c"], roles=[0, 0, 0, 1, 1])
    got = bytes_without_token(table.offsets_V1, table.data, table.roles_V)
    assert got == bytes(b for b in range(256) if b not in (ord("a"), ord("b")))  # c is a role
    with pytest.raises(ValueError, match="missing_bytes"):
        TokenByteTable(table.offsets_V1, table.data, table.roles_V, False, b"\x05\x01")
