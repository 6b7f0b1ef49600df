"""Tokenizers: load any family, token-bytes and role tables, fingerprints, byte-offset encodings.

Public API::

    tok = load_tokenizer("qwen2")      # asset name (also gemma3-270m, smollm2-135m), HF folder,
                                       # tokenizer.json, .tiktoken, SentencePiece .model, .gguf,
                                       # or hub name (online only)
    tok.family                         # "byte_bpe" | "spm" | "wordpiece" | "unigram"
    tok.table                          # TokenByteTable: id -> bytes, roles, lossy, missing_bytes
    tok.fingerprint                    # stable sha256 hex
    enc = tok.encode(text)             # Encoding: ids, starts, ends (byte offsets), phantom_prefix

Modules: ``table`` (shared contract, numpy only), ``bytes`` (per-family byte tables), ``roles``
(special-token roles), ``encode`` (byte offsets), ``fingerprint``, ``tokenizer`` (the wrapper),
``load`` (``load_tokenizer``).
"""

from xdistill.errors import TokenizerError
from xdistill.tokenization.encode import Encoding
from xdistill.tokenization.load import ASSET_NAMES, load_tokenizer
from xdistill.tokenization.table import (
    ROLE_BOS, ROLE_CHAT, ROLE_EOS, ROLE_NAMES, ROLE_PAD, ROLE_SPECIAL, ROLE_TEXT, ROLE_TOOL,
    ROLE_UNK, TokenByteTable,
)
from xdistill.tokenization.tokenizer import Tokenizer

__all__ = [
    "ASSET_NAMES", "Encoding", "ROLE_BOS", "ROLE_CHAT", "ROLE_EOS", "ROLE_NAMES", "ROLE_PAD",
    "ROLE_SPECIAL", "ROLE_TEXT", "ROLE_TOOL", "ROLE_UNK", "TokenByteTable", "Tokenizer",
    "TokenizerError", "load_tokenizer",
]
