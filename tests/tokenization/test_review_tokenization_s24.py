"""Review of ``xdistill/tokenization`` (session s24): each test fails on the current code because of a
real defect.

Checked and found correct (no test here):

* token bytes + offsets are exact for gpt2, qwen2, llama3, mistral, llama-spm, phi3, smollm2-135m
  and gemma3-270m on ``\\r\\n`` runs, leading/trailing/only spaces, tabs, ZWJ emoji sequences,
  combining marks (NFC form for Qwen2), full-width/compatibility characters, BOM, NUL and other
  control characters, U+2028/2029, NBSP/ideographic space, 300-char runs, literal ``<0x41>``/
  ``Ġ`` text; with and without ``add_special_tokens``; ``encode_batch`` == ``encode``;
* in-text special tokens (``<s>``, ``</s>``, ``<|endoftext|>``, ``<|end|>``, ``<|im_start|>``,
  Llama-3 header tokens): each text token's slice == its table bytes minus ``phantom_T``;
* a byte-level post-processor with ``trim_offsets=True`` (RoBERTa style) still places tokens exactly;
* the GPT-2 / Llama-3 tiktoken patterns and Llama-3 special-token list match the published ones;
  the shipped Gemma-3 and Llama-2 chat templates match the published ones;
* fingerprints: merges, normaliser, pre-tokeniser, added tokens all change it; padding/truncation
  settings do not (excluded), added tokens are sorted; Phi-3/Llama-2 GGUF and GPT-2/Llama-3
  rank-file routes equal their folders; roles of every chat-template marker (Qwen2, Llama-3,
  Phi-3, SmolLM2, Gemma-3, Mistral, Llama-2) are chat/eos/bos as documented;
* clear errors: missing path, unknown name offline, BPE without byte convention, unsupported
  model type, corrupt files all raise a one-line TokenizerError naming the path.

Failing tests (defects):

* ``test_unigram_fingerprint_sees_piece_scores`` / ``test_wordpiece_fingerprint_sees_which_id_is_the_continuation``:
  ``fingerprint.canonical_config`` drops ``model.vocab`` claiming the token-bytes table covers it;
  it does not (Unigram scores, ``##x`` vs ``x`` in WordPiece): different ids, same fingerprint.
* ``test_non_special_added_token_in_prepend_spm_is_placed_exactly``: a legacy SentencePiece
  tokenizer (Prepend/Metaspace "always", Phi-3, legacy Llama-2) prepends ``▁`` after every added
  token, but ``encode`` cuts phantom segments only at *role* tokens: a non-special added token
  gets the wrong byte span and ``is_exact_on`` claims an exact text that is not reproduced.
* ``test_text_changing_normaliser_is_not_exact``: ``is_lossy`` only recognises a fixed list of
  normalisers; ``Nmt`` (SentencePiece's NMT rule, drops control characters) passes as lossless
  and ``is_exact_on`` is True for a text the token bytes do not reproduce.
* ``test_lone_surrogate_is_rejected_clearly``: ``encode`` of a str with a lone surrogate raises a
  misleading ``TypeError: TextInputSequence must be str`` instead of a TokenizerError, and
  ``is_exact_on`` says True for it.
* ``test_hf_truncation_or_padding_does_not_leak_into_encode``: ``Tokenizer`` shares the HF
  backend unless padding/truncation were on at load time; one ``tok.hf(..., truncation=True)``
  call makes every later ``tok.encode`` silently truncate (and padding leaks into ``encode_batch``).
* ``test_folder_with_a_tiktoken_tokenizer_model_loads_like_the_file``: ``_load_path`` sends a
  folder holding a tiktoken ``tokenizer.model`` (Llama-3's ``original/``) to ``AutoTokenizer``,
  bypassing the rank-file detection the file route has: no special tokens, no BOS.
* ``test_sentencepiece_model_file_keeps_the_bos_default``: Mistral's ``.model`` loads with
  ``add_bos_default`` False while its folder says True (as llama.cpp does for every SentencePiece
  vocabulary); the Llama-3 rank-file route was fixed for exactly this.
* ``test_llama3_gguf_keeps_the_bos_default``: a GGUF without ``tokenizer.ggml.add_bos_token``
  (llama.cpp's Llama-3 vocabulary) falls back to the converted post-processor, which adds no BOS;
  llama.cpp itself defaults to adding BOS there, as do the Llama-3 folder and rank file.
* ``test_tokenizer_json_file_keeps_bos_identity``: a ``tokenizer.json`` file loads with
  ``bos_id``/``eos_id`` None and ``add_bos_default`` False although the tokenizer itself puts its
  ``<s>`` (role BOS) first; the fingerprint equals the folder's, which says True.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tok_helpers import with_added_token
from xdistill.assets import asset_dir
from xdistill.assets.paths import tokenizer_dir
from xdistill.errors import TokenizerError
from xdistill.tokenization import ROLE_BOS, ROLE_TEXT, load_tokenizer
from xdistill.tokenization.tokenizer import Tokenizer

CORPUS = ["hello world, the student learns from the teacher 123 helloworld"] * 20


def _wrap(rust, **roles) -> Tokenizer:
    from transformers import PreTrainedTokenizerFast

    return Tokenizer(PreTrainedTokenizerFast(tokenizer_object=rust, **roles), "tiny", "on the spot")


# --------------------------------------------------------------------------- fingerprints


def test_unigram_fingerprint_sees_piece_scores():
    """A Unigram model's segmentation is decided by its piece scores, which live in
    ``model.vocab`` and nowhere else: changing them changes the ids of the same text, so the
    fingerprint (``everything that decides how text becomes ids``) must change."""
    from tokenizers import Tokenizer as RustTokenizer, decoders, models, pre_tokenizers, trainers

    rust = RustTokenizer(models.Unigram())
    rust.pre_tokenizer = pre_tokenizers.Metaspace()
    rust.decoder = decoders.Metaspace()
    rust.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=60, unk_token="<unk>",
                                                             special_tokens=["<unk>"]))
    spec = json.loads(rust.to_str())
    for entry in spec["model"]["vocab"]:          # make multi-character pieces very unlikely
        if len(entry[0]) > 2:
            entry[1] = -50.0
    a = _wrap(rust, unk_token="<unk>")
    b = _wrap(RustTokenizer.from_str(json.dumps(spec)), unk_token="<unk>")
    assert a.family == b.family == "unigram"
    assert a.encode("hello world").ids.tolist() != b.encode("hello world").ids.tolist()
    assert a.fingerprint != b.fingerprint


def test_wordpiece_fingerprint_sees_which_id_is_the_continuation():
    """WordPiece ``ing`` and ``##ing`` both contribute the bytes ``ing``: swapping their ids leaves
    table, roles and config unchanged, but ``playing ing`` encodes to different ids."""
    from tokenizers import Tokenizer as RustTokenizer, models, normalizers, pre_tokenizers

    def make(vocab):
        rust = RustTokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
        rust.normalizer = normalizers.BertNormalizer()
        rust.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        return _wrap(rust, unk_token="[UNK]")

    vocab = {"[UNK]": 0, "play": 1, "##ing": 2, "ing": 3}
    a = make(vocab)
    b = make({**vocab, "##ing": 3, "ing": 2})
    assert a.encode("playing ing").ids.tolist() == [1, 2, 3]
    assert b.encode("playing ing").ids.tolist() == [1, 3, 2]
    assert a.fingerprint != b.fingerprint


# --------------------------------------------------------------------------- encode


def test_non_special_added_token_in_prepend_spm_is_placed_exactly(tmp_path):
    """Phi-3's normaliser prepends ``▁`` to every piece of text between added tokens. With a
    user-added (non-special) ``<h1>``, ``a<h1>b`` becomes ``▁a <h1> ▁b``: a phantom space *inside*
    the segment. Either the text is reported as not exact, or each token's span holds its bytes
    (minus its phantom bytes); today ``<h1>`` is given the span ``a<h1`` and ``▁a`` an empty one."""
    tok = with_added_token(tmp_path, "phi3", 32064, "<h1>")
    text = "a<h1>b"
    enc = tok.encode(text)
    assert tok.hf.convert_ids_to_tokens(enc.ids.tolist()) == ["▁a", "<h1>", "▁b"]
    assert tok.table.roles_V[32064] == ROLE_TEXT and tok.table.token_bytes(32064) == b"<h1>"
    data = text.encode()
    spans = [data[s:e] for s, e in zip(enc.starts.tolist(), enc.ends.tolist())]
    assert spans == [b"a", b"<h1>", b"b"], spans
    if tok.is_exact_on(text):    # the docstring's promise for exact texts without role tokens
        assert tok.table.concat(enc.ids)[enc.phantom_prefix:] == data


def test_text_changing_normaliser_is_not_exact():
    """``is_lossy`` knows a fixed list of normalisers; SentencePiece's NMT rule (``Nmt``: drops
    control characters such as U+0001) is not on it, so the tokenizer is called lossless and
    ``is_exact_on`` True for a text whose token bytes lose a byte (and later offsets shift)."""
    from tokenizers import Tokenizer as RustTokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, trainers

    from xdistill.tokenization.bytes import bytes_to_unicode

    rust = RustTokenizer(models.BPE())
    rust.normalizer = normalizers.Nmt()
    rust.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    rust.decoder = decoders.ByteLevel()
    rust.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=sorted(bytes_to_unicode().values())))
    tok = _wrap(rust)
    text = "a\x01b"
    enc = tok.encode(text)
    assert tok.table.concat(enc.ids) == b"ab"              # what the tokenizer really does
    assert tok.table.missing_bytes == b""                   # not the missing-byte case
    assert tok.lossy or not tok.is_exact_on(text)


def test_lone_surrogate_is_rejected_clearly(get_tokenizer):
    """A str holding a lone surrogate cannot be UTF-8 encoded; ``encode`` already turns bad input
    into a TokenizerError, but this one surfaces as ``TypeError: TextInputSequence must be str``
    (it *is* a str) and ``is_exact_on`` calls the text exact."""
    tok = get_tokenizer("gpt2")
    text = "a\ud800b"
    with pytest.raises(TokenizerError, match="surrogate"):
        tok.encode(text)
    with pytest.raises(TokenizerError, match="item 1"):
        tok.encode_batch(["ok", text])
    assert not tok.is_exact_on(text)


def test_hf_truncation_or_padding_does_not_leak_into_encode():
    """``encode()`` must never pad or truncate (tokenizer.py). Calling the public ``tok.hf`` with
    ``truncation=True`` leaves truncation switched on in the shared Rust backend, so every later
    ``tok.encode`` is silently cut; ``padding=True`` likewise pads ``encode_batch`` rows."""
    tok = load_tokenizer(tokenizer_dir("smollm2-135m"))     # a private instance (has a pad token)
    assert tok.hf.backend_tokenizer.truncation is None and tok.hf.backend_tokenizer.padding is None
    text = "the quick brown fox jumps over the lazy dog"
    before = tok.encode(text).ids.tolist()
    tok.hf(text, truncation=True, max_length=4)
    assert tok.encode(text).ids.tolist() == before
    tok.hf(["a", text], padding=True)
    assert tok.encode_batch(["a"])[0].ids.tolist() == tok.encode("a").ids.tolist()


# --------------------------------------------------------------------------- loading and BOS


def test_folder_with_a_tiktoken_tokenizer_model_loads_like_the_file(get_tokenizer, tmp_path):
    """Llama-3's ``original/`` download is a folder whose ``tokenizer.model`` is a tiktoken rank
    file. ``load_tokenizer(that file)`` detects it (Llama-3 pattern, 256 special tokens, BOS);
    ``load_tokenizer(the folder)`` hands it to ``AutoTokenizer`` instead, which silently builds a
    128,000-entry vocabulary with no special tokens: ``<|eot_id|>`` becomes 8 text tokens."""
    shutil.copy(asset_dir() / "raw" / "llama3.tiktoken", tmp_path / "tokenizer.model")
    from_file = load_tokenizer(tmp_path / "tokenizer.model")
    from_folder = load_tokenizer(tmp_path)
    assert from_file.vocab_size == 128256 and from_file.encode("<|eot_id|>").ids.tolist() == [128009]
    assert from_folder.encode("<|eot_id|>").ids.tolist() == [128009]
    assert (from_folder.vocab_size, from_folder.bos_id, from_folder.add_bos_default) == \
        (128256, 128000, True)
    assert from_folder.fingerprint == from_file.fingerprint == get_tokenizer("llama3").fingerprint


def test_sentencepiece_model_file_keeps_the_bos_default(get_tokenizer):
    """Mistral from its folder adds ``<s>`` by default (llama.cpp too, for any SentencePiece
    vocabulary); from its raw
    SentencePiece ``.model`` it does not (transformers 5's LlamaTokenizer no longer defaults
    ``add_bos_token`` to True), so a student/teacher loaded that way trains without its BOS."""
    folder = get_tokenizer("mistral")
    raw = load_tokenizer(asset_dir() / "raw" / "mistral.model")
    assert folder.add_bos_default is True
    assert raw.add_bos_default is True, raw.add_bos_origin
    assert raw.hf.encode("Hello", add_special_tokens=True)[0] == raw.bos_id == 1


def test_llama3_gguf_keeps_the_bos_default():
    """llama.cpp's Llama-3 vocabulary GGUF has no ``tokenizer.ggml.add_bos_token`` key; llama.cpp
    then adds BOS (its default for pre-tokenizer ``llama-bpe``), as Llama-3's folder and rank file
    do here. xdistill falls through to the converted post-processor (which adds nothing) and
    reports False, so Llama-3 loaded from a GGUF trains/scores without ``<|begin_of_text|>``."""
    from xdistill.tokenization.bos import gguf_add_bos

    path = asset_dir() / "gguf" / "ggml-vocab-llama-bpe.gguf"
    assert gguf_add_bos(path) is None                     # the key is absent
    tok = load_tokenizer(path)
    assert tok.bos_id == 128000
    assert tok.add_bos_default is True, tok.add_bos_origin


def test_tokenizer_json_file_keeps_bos_identity(get_tokenizer):
    """Loading the Mistral asset's own ``tokenizer.json`` file: the tokenizer puts ``<s>`` (id 1,
    role BOS) first when asked for special tokens, yet ``bos_id`` is None and the BOS default is
    False (an explicit ``add_bos: true`` is then a ConfigError), while the fingerprint is that of
    the folder, whose default is True."""
    folder = get_tokenizer("mistral")
    tok = load_tokenizer(tokenizer_dir("mistral") / "tokenizer.json")
    first = tok.hf.encode("Hello", add_special_tokens=True)[0]
    assert first == 1 and tok.table.roles_V[first] == ROLE_BOS
    assert tok.fingerprint == folder.fingerprint
    assert (tok.bos_id, tok.eos_id) == (folder.bos_id, folder.eos_id) == (1, 2)
    assert tok.add_bos_default is folder.add_bos_default is True
    assert np.array_equal(tok.table.roles_V, folder.table.roles_V)
