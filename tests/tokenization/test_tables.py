"""Token-bytes and role tables against independent references (tiktoken, sentencepiece, the
Rust decoders), and the per-family conventions of docs/architecture.md §3."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tok_helpers import ALL_ASSETS, with_added_token
from xdistill.assets import asset_dir
from xdistill.tokenization import (
    ROLE_BOS, ROLE_CHAT, ROLE_EOS, ROLE_PAD, ROLE_SPECIAL, ROLE_TEXT, ROLE_TOOL, ROLE_UNK,
)
from xdistill.tokenization.bytes import build_table_arrays, bytes_to_unicode

EXPECTED_SIZES = {"gpt2": 50257, "qwen2": 151936, "llama3": 128256, "mistral": 32000,
                  "bert": 30522, "llama-spm": 32000, "phi3": 32064}
EXPECTED_FAMILY = {"gpt2": "byte_bpe", "qwen2": "byte_bpe", "llama3": "byte_bpe", "mistral": "spm",
                   "bert": "wordpiece", "llama-spm": "spm", "phi3": "spm"}


@pytest.mark.parametrize("name", ALL_ASSETS)
def test_family_size_and_coverage(get_tokenizer, name):
    tok = get_tokenizer(name)
    assert tok.family == EXPECTED_FAMILY[name]
    assert tok.vocab_size == EXPECTED_SIZES[name] == tok.table.vocab_size
    assert tok.vocab_size >= len(tok.hf)
    roles = tok.table.roles_V
    assert np.all(tok.table.lengths_V[roles != ROLE_TEXT] == 0)      # role tokens: no bytes
    assert np.all(tok.table.lengths_V[roles == ROLE_TEXT] > 0)       # text tokens: some bytes


@pytest.mark.parametrize("name,raw", [("gpt2", "gpt2.tiktoken"), ("llama3", "llama3.tiktoken")])
def test_byte_bpe_table_equals_tiktoken_ranks(get_tokenizer, name, raw):
    from tiktoken.load import load_tiktoken_bpe

    tok = get_tokenizer(name)
    ranks = load_tiktoken_bpe(str(asset_dir() / "raw" / raw))
    for piece, rank in ranks.items():
        assert tok.table.token_bytes(rank) == piece
    assert np.all(tok.table.roles_V[len(ranks):] != ROLE_TEXT)


def test_spm_table_equals_sentencepiece_pieces(get_tokenizer):
    import sentencepiece as spm

    tok = get_tokenizer("mistral")
    sp = spm.SentencePieceProcessor(model_file=str(asset_dir() / "raw" / "mistral.model"))
    assert sp.get_piece_size() == tok.vocab_size
    n_byte = 0
    for i in range(sp.get_piece_size()):
        if sp.is_control(i) or sp.is_unknown(i):
            assert tok.table.roles_V[i] != ROLE_TEXT
            continue
        piece = sp.id_to_piece(i)
        if sp.is_byte(i):
            n_byte += 1
            expected = bytes([int(piece[3:5], 16)])
        else:
            expected = piece.replace("\u2581", " ").encode("utf-8")
        assert tok.table.token_bytes(i) == expected, (i, piece)
    assert n_byte == 256


@pytest.mark.parametrize("name", ["qwen2", "phi3", "llama-spm"])
def test_table_agrees_with_rust_decoder(get_tokenizer, name):
    """For every text token whose bytes are valid UTF-8, HF's decoder gives the same text
    (SentencePiece: decoded after a leading ``a`` so the decoder's space-strip does not apply)."""
    tok = get_tokenizer(name)
    ids = np.flatnonzero(tok.table.roles_V == ROLE_TEXT)
    prefix = [] if tok.family == "byte_bpe" else [tok.hf.convert_tokens_to_ids("a")]
    decoded = tok._backend.decode_batch([prefix + [int(i)] for i in ids], skip_special_tokens=False)
    checked = 0
    for tid, text in zip(ids.tolist(), decoded):
        piece = tok.table.token_bytes(tid)
        try:
            expected = piece.decode("utf-8")
        except UnicodeDecodeError:
            continue
        assert text == ("a" if prefix else "") + expected, (tid, text, piece)
        checked += 1
    assert checked > 0.9 * ids.size


def test_conventions_per_family(get_tokenizer):
    gpt2, mistral, bert = get_tokenizer("gpt2"), get_tokenizer("mistral"), get_tokenizer("bert")
    assert gpt2.table.token_bytes(gpt2.hf.convert_tokens_to_ids("Ġthe")) == b" the"
    assert gpt2.table.token_bytes(gpt2.hf.convert_tokens_to_ids("Ċ")) == b"\n"
    assert gpt2.table.token_bytes(gpt2.hf.convert_tokens_to_ids("ĉ")) == b"\t"
    assert mistral.table.token_bytes(mistral.hf.convert_tokens_to_ids("<0x0A>")) == b"\n"
    assert mistral.table.token_bytes(mistral.hf.convert_tokens_to_ids("<0xF0>")) == b"\xf0"
    assert mistral.table.token_bytes(mistral.hf.convert_tokens_to_ids("▁the")) == b" the"
    assert bert.table.token_bytes(bert.hf.convert_tokens_to_ids("##s")) == b"s"


def test_unit_tables_without_assets():
    """The builders on hand-made vocabularies: byte-level, SentencePiece with byte fallback,
    WordPiece, holes and zero-byte role tokens."""
    b2u = bytes_to_unicode()
    assert len(b2u) == 256 and len(set(b2u.values())) == 256 and b2u[0x20] == "Ġ"
    toks = ["Ġhi", "Ċ", b2u[0xF0] + b2u[0x9F], None, "<|x|>"]
    zero = np.array([False, False, False, True, True])
    off, data = build_table_arrays(toks, "byte_bpe", zero, False)
    pieces = [data[off[i]:off[i + 1]].tobytes() for i in range(5)]
    assert pieces == [b" hi", b"\n", b"\xf0\x9f", b"", b""]
    off, data = build_table_arrays(["▁a▁b", "<0x00>", "<0xFF>", "é", "<s>"], "spm",
                                   np.array([False] * 4 + [True]), True)
    pieces = [data[off[i]:off[i + 1]].tobytes() for i in range(5)]
    assert pieces == [b" a b", b"\x00", b"\xff", "é".encode(), b""]
    off, data = build_table_arrays(["##ing", "word", "##é"], "wordpiece", np.zeros(3, bool), False)
    assert [data[off[i]:off[i + 1]].tobytes() for i in range(3)] == [b"ing", b"word", "é".encode()]


ROLE_CASES = {
    "llama3": {"<|begin_of_text|>": ROLE_BOS, "<|end_of_text|>": ROLE_EOS, "<|eot_id|>": ROLE_EOS,
               "<|start_header_id|>": ROLE_CHAT, "<|end_header_id|>": ROLE_CHAT,
               "<|python_tag|>": ROLE_TOOL, "<|finetune_right_pad_id|>": ROLE_PAD,
               "<|reserved_special_token_7|>": ROLE_SPECIAL},
    "qwen2": {"<|endoftext|>": ROLE_EOS, "<|im_start|>": ROLE_CHAT, "<|im_end|>": ROLE_EOS},
    "bert": {"[CLS]": ROLE_BOS, "[SEP]": ROLE_EOS, "[PAD]": ROLE_PAD, "[UNK]": ROLE_UNK,
             "[MASK]": ROLE_SPECIAL},
    "mistral": {"<s>": ROLE_BOS, "</s>": ROLE_EOS, "<unk>": ROLE_UNK},
    "phi3": {"<s>": ROLE_BOS, "</s>": ROLE_EOS, "<|end|>": ROLE_EOS, "<|assistant|>": ROLE_CHAT,
             "<|user|>": ROLE_CHAT, "<|endoftext|>": ROLE_EOS},
    "gpt2": {"<|endoftext|>": ROLE_EOS},
}


@pytest.mark.parametrize("name", sorted(ROLE_CASES))
def test_roles(get_tokenizer, name):
    tok = get_tokenizer(name)
    for content, role in ROLE_CASES[name].items():
        tid = tok.hf.convert_tokens_to_ids(content)
        assert tok.table.roles_V[tid] == role, content
        assert tok.table.token_bytes(tid) == b""
    table = tok.role_table()
    assert sum(len(v) for v in table.values()) == int((tok.table.roles_V != ROLE_TEXT).sum())


def test_qwen2_table_builds_in_a_few_seconds(get_tokenizer):
    tok = get_tokenizer("qwen2")
    t0 = time.perf_counter()
    table = tok._build_table()
    elapsed = time.perf_counter() - t0
    assert elapsed < 5.0, elapsed
    assert np.array_equal(table.offsets_V1, tok.table.offsets_V1)
    assert np.array_equal(table.data, tok.table.data)


def test_an_added_token_of_byte_alphabet_characters_is_its_utf8(tmp_path):
    """An added (non-special) token holds raw text: ``°C`` added to GPT-2 is the bytes C2 B0 43,
    although ``°`` is also the byte-alphabet character of the single byte 0xB0. Read through the
    alphabet, the table had one byte too few and every later offset of the text was shifted."""
    tok = with_added_token(tmp_path, "gpt2", 50257, "°C")
    text = "It is 21°C today"
    enc = tok.encode(text)
    assert 50257 in enc.ids.tolist() and tok.table.token_bytes(50257) == "°C".encode()
    raw = text.encode()
    assert tok.table.concat(enc.ids) == raw
    assert [raw[s:e] for s, e in zip(enc.starts, enc.ends)] == [
        tok.table.token_bytes(int(i)) for i in enc.ids]
