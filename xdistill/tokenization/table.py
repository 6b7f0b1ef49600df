"""Token-bytes and role tables: the common ground of every tokenizer (numpy only).

Two tokenizations of the same text are compared through the bytes each token contributes to the
decoded text. A :class:`TokenByteTable` holds, for a vocabulary of ``V`` ids:

* ``offsets_V1`` (int64, ``[V+1]``) and ``data`` (uint8): token ``i`` contributes
  ``data[offsets_V1[i]:offsets_V1[i+1]]``; special tokens contribute no bytes;
* ``roles_V`` (int8, ``[V]``): :data:`ROLE_TEXT` for ordinary tokens, otherwise the role of a
  special token (bos, eos, pad, ...). Role tokens are aligned by role, never by string;
* ``lossy``: the tokenizer normalises text (lowercasing, accent stripping, dropped whitespace,
  e.g. WordPiece), so concatenated token bytes need not equal the input text. The aligner reads
  it as "compare case- and whitespace-folded" (``xdistill.align.api``), so it is *not* set for
  the narrower defect below;
* ``missing_bytes``: byte values no token of a lossless byte-level vocabulary can produce (no
  text token consists of that byte alone: SmolLM2's byte-level BPE lacks 21 of the 256, e.g.
  ``\x04``, ``\xc0``, ``\xf5``..``\xff``). The tokenizer silently drops such bytes, so a text
  containing one is not reproduced by its token bytes (``Tokenizer.is_exact_on`` is False and
  encodings fall back to HF's offsets); every other text still is, exactly. The aligner needs
  nothing special: the two texts differ there, so the row takes the DP path and the dropped
  bytes stay unaligned. Empty for lossy tables (they are never exact anyway).

This module imports numpy only, so ``xdistill.align`` and ``xdistill.projection`` may use it.
"""

from __future__ import annotations

import functools

from dataclasses import dataclass

import numpy as np

ROLE_TEXT = 0      # ordinary token with text bytes
ROLE_BOS = 1       # beginning of sequence (also BERT [CLS])
ROLE_EOS = 2       # end of sequence / end of turn (also BERT [SEP])
ROLE_PAD = 3       # padding
ROLE_UNK = 4       # unknown token
ROLE_CHAT = 5      # chat-template role markers (<|im_start|>, <|start_header_id|>, [INST], ...)
ROLE_TOOL = 6      # tool-call / tool-response markers
ROLE_SPECIAL = 7   # any other special/control token without text bytes (mask, reserved, ...)

ROLE_NAMES = {
    ROLE_TEXT: "text", ROLE_BOS: "bos", ROLE_EOS: "eos", ROLE_PAD: "pad", ROLE_UNK: "unk",
    ROLE_CHAT: "chat", ROLE_TOOL: "tool", ROLE_SPECIAL: "special",
}


@dataclass(frozen=True, eq=False)
class TokenByteTable:
    """Per-token bytes and roles of one vocabulary (see the module docstring)."""

    offsets_V1: np.ndarray
    data: np.ndarray
    roles_V: np.ndarray
    lossy: bool = False
    missing_bytes: bytes = b""   # sorted byte values no token produces (see the module doc)

    def __post_init__(self) -> None:
        off = self.offsets_V1
        if off.dtype != np.int64 or off.ndim != 1 or off.size < 1:
            raise ValueError("offsets_V1 must be a 1-D int64 array of length V+1")
        if self.data.dtype != np.uint8 or self.data.ndim != 1:
            raise ValueError("data must be a 1-D uint8 array")
        if off[0] != 0 or off[-1] != self.data.size or np.any(np.diff(off) < 0):
            raise ValueError("offsets_V1 must start at 0, be non-decreasing and end at len(data)")
        if self.roles_V.dtype != np.int8 or self.roles_V.shape != (off.size - 1,):
            raise ValueError(f"roles_V must be int8 of shape ({off.size - 1},)")
        if list(self.missing_bytes) != sorted(set(self.missing_bytes)):
            raise ValueError("missing_bytes must hold distinct byte values in increasing order")

    @property
    def vocab_size(self) -> int:
        return int(self.offsets_V1.size - 1)

    @property
    def lengths_V(self) -> np.ndarray:
        """Number of bytes each token contributes (int64, ``[V]``)."""
        return np.diff(self.offsets_V1)

    @functools.cached_property
    def blank_V(self) -> np.ndarray:
        """bool ``[V]``: text tokens made only of ASCII whitespace (computed once)."""
        nonblank = np.cumsum(~np.isin(self.data, np.frombuffer(b" \t\n\r\x0b\x0c", np.uint8)))
        c = np.concatenate([[0], nonblank])
        off = self.offsets_V1
        return (self.lengths_V > 0) & (c[off[1:]] == c[off[:-1]]) & (self.roles_V == ROLE_TEXT)

    def token_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < self.vocab_size:
            raise IndexError(f"token id {token_id} outside vocabulary of size {self.vocab_size}")
        return self.data[self.offsets_V1[token_id]:self.offsets_V1[token_id + 1]].tobytes()

    def concat(self, ids) -> bytes:
        """Concatenated bytes of a sequence of ids (slow helper for tests and tools)."""
        return b"".join(self.token_bytes(int(i)) for i in ids)

    @classmethod
    def from_bytes_list(cls, pieces: list[bytes], roles=None, lossy: bool = False) -> "TokenByteTable":
        """Build a table from one ``bytes`` per id (``roles`` defaults to all text)."""
        lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
        offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = np.frombuffer(b"".join(pieces), dtype=np.uint8).copy()
        roles_arr = (np.zeros(len(pieces), dtype=np.int8) if roles is None
                     else np.asarray(roles, dtype=np.int8))
        return cls(offsets, data, roles_arr, lossy)


def bytes_without_token(offsets_V1: np.ndarray, data: np.ndarray, roles_V: np.ndarray) -> bytes:
    """Sorted byte values that no text token consists of alone (``TokenByteTable.missing_bytes``
    of a lossless byte-level vocabulary: byte-level BPE, or SentencePiece with byte fallback)."""
    single_V = (np.diff(offsets_V1) == 1) & (roles_V == ROLE_TEXT)
    present = np.zeros(256, dtype=bool)
    present[data[offsets_V1[:-1][single_V]]] = True
    return bytes(np.flatnonzero(~present).astype(np.uint8).tolist())

