"""Review s25 (tokenization): each test demonstrates a defect and FAILS on the reviewed code.

Checked and found correct (no test here): for gpt2, qwen2 (NFC text), llama3, llama-spm, mistral,
phi3, gemma3-270m, smollm2-135m, the GGUF vocabularies (gpt-2, llama-bpe, llama-spm, phi-3, qwen2)
and the raw gpt2/llama3 ``.tiktoken`` and Mistral ``.model`` files: a fuzz of ~1,500 texts (emoji,
ZWJ/flags, CJK, combining marks, ``\\r\\n``, tabs, space runs, NBSP, NUL, every role token's
string alone / after a space / inside text) with and without ``add_special_tokens`` and
``specials_as_text``: table bytes minus ``phantom_T`` equal each text token's slice and the text,
offsets monotone and in range, ``encode`` == ``encode_batch`` == ``encode_ids_batch`` (ids and
phantom prefix), no role token under ``specials_as_text``; fingerprints of the Mistral ``.model``,
Llama-2/Phi-3 GGUFs and GPT-2/Llama-3 rank files equal their folders.
"""

from __future__ import annotations

import numpy as np

from xdistill.tokenization import ROLE_TEXT
from xdistill.tokenization.tokenizer import Tokenizer


def _unigram_tokenizer() -> Tokenizer:
    """A SentencePiece-Unigram tokenizer as HF's ``SpmConverter`` builds one (T5, ALBERT, XLM-R):
    the control pieces ``<unk>``/``<s>``/``</s>`` sit in the model vocabulary with score 0.0 (their
    score in the ``.model`` proto) and are special added tokens; byte fallback, ``▁`` prefix."""
    from tokenizers import AddedToken, decoders, models, normalizers
    from tokenizers import Tokenizer as RustTokenizer
    from transformers import PreTrainedTokenizerFast

    vocab = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0)]
    vocab += [(f"<0x{i:02X}>", -20.0) for i in range(256)]
    vocab += [(c, -5.0) for c in "abcdefghijklmnopqrstuvwxyz<>/|\u2581"] + [("\u2581hello", -3.0)]
    rust = RustTokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    rust.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                            normalizers.Replace(" ", "\u2581")])
    rust.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                      decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    rust.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    hf = PreTrainedTokenizerFast(tokenizer_object=rust, bos_token="<s>", eos_token="</s>",
                                 unk_token="<unk>")
    return Tokenizer(hf, "unigram-tiny", "on the spot")


def test_unigram_specials_as_text_never_yields_a_role_token():
    """``specials_as_text=True`` must tokenize ``</s>`` written in a text as the characters it
    spells (text tokens whose bytes reproduce it). ``_text_backend`` only sets
    ``encode_special_tokens`` (skip the added-token match); a Unigram model then segments the
    text itself and, since its vocabulary holds the control piece ``</s>`` with score 0.0 (better
    than any spelling), picks the role token: zero bytes for four characters of text, while
    ``is_exact_on`` still calls the text exact and ``encode_ids_batch`` agrees."""
    tok = _unigram_tokenizer()
    assert not tok.lossy and tok.family == "unigram"
    for text in ("</s>", "a</s>b", "hello <s>"):
        enc = tok.encode(text, specials_as_text=True)
        roles = tok.table.roles_V[enc.ids]
        assert np.all(roles == ROLE_TEXT), (text, enc.ids.tolist(), roles.tolist())
        ph = enc.phantom_bytes_T()
        got = b"".join(tok.token_bytes(int(i))[p:] for i, p in zip(enc.ids, ph))
        assert got == text.encode("utf-8"), (text, got)
        ids, _ = tok.encode_ids_batch([text], specials_as_text=True)[0]
        assert np.all(tok.table.roles_V[ids] == ROLE_TEXT), (text, ids)
