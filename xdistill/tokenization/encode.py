"""Encodings with byte offsets for every tokenizer family.

Legend: ``T`` tokens of one encoding, ``L`` characters of the text.

HF fast tokenizers report *character* offsets into the input, and several tokens may report the
same whole character when a byte-level BPE splits one emoji into two tokens. We therefore place
tokens from the token-bytes table instead (lossless families):

* the encoding is cut into *segments*: maximal runs of text tokens between role tokens; when the
  tokenizer puts a ``▁`` before every piece of text between added tokens (Phi-3's ``Prepend``
  normaliser; ``cut_V``), each non-role added token is a segment of its own and the text after
  it starts a new one;
* a segment starts right after the text span of the token before it (0 for the first);
* inside a segment each token covers exactly ``len(table bytes)``, placed by a cumulative sum;
* ``extra = (table bytes of the segment) - (bytes of text the segment covers, per HF's offset of
  its last token)`` is the dummy-prefix space SentencePiece added (legacy SentencePiece also
  prepends one after each in-text special token); token starts are clipped at the segment start.
  Every segment's extra bytes are reported per token in ``phantom_T`` (on the segment's first
  token, carried into the next ones if longer than it); a first segment starting at byte 0
  also reports its extra as ``phantom_prefix``.

So for a lossless tokenizer and text without in-text special tokens, the concatenated table bytes
of ``ids`` minus ``phantom_prefix`` bytes equal ``text.encode("utf-8")`` and each token's
``[start, end)`` slice equals its table bytes; with in-text special tokens, each text token's
table bytes minus its first ``phantom_T`` bytes are its ``[start, end)`` slice. Lossy
tokenizers (WordPiece) use HF's offsets, converted to bytes: the slice is the original text of
the piece (before lowercasing).

Role tokens (BOS/EOS/chat markers, in-text or added by the template) get ``start == end`` at the
end of the previous token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class Encoding:
    """One tokenized text: ids plus byte offsets into ``text.encode("utf-8")``.

    ``phantom_prefix``: leading bytes of the concatenated token bytes that are not in the text
    (SentencePiece's dummy-prefix space), 0 otherwise. They belong to the first text token, which
    is token 0 unless role tokens (a BOS) come first; that token's ``start`` is clipped to 0.

    ``phantom_T``: per token, the bytes at the start of its table bytes that are not in the text
    (every dummy-prefix space, also those legacy SentencePiece puts after in-text special tokens);
    ``None`` when only ``phantom_prefix`` is known (encodings built elsewhere). The aligner takes
    it as ``s_phantom_BTs`` / ``t_phantom_BTt`` (see :meth:`phantom_bytes_T`).
    """

    ids: np.ndarray      # int64 [T]
    starts: np.ndarray   # int64 [T]
    ends: np.ndarray     # int64 [T]
    phantom_prefix: int = 0
    phantom_T: np.ndarray | None = None   # int64 [T]

    def phantom_bytes_T(self) -> np.ndarray:
        """int64 ``[T]``: ``phantom_T``, or ``phantom_prefix`` at token 0 when it is ``None`` (the
        aligner carries a count past role tokens and into the next text tokens)."""
        if self.phantom_T is not None:
            return np.asarray(self.phantom_T, dtype=np.int64)
        out = np.zeros(len(self.ids), dtype=np.int64)
        if out.size:
            out[0] = self.phantom_prefix
        return out

    def __len__(self) -> int:
        return int(self.ids.size)


def char_to_byte_map(text: str) -> np.ndarray | None:
    """int64 ``[L+1]``: byte offset of each character boundary; ``None`` for pure-ASCII text."""
    if text.isascii():
        return None
    cp_L = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    blen_L = 1 + (cp_L >= 0x80) + (cp_L >= 0x800) + (cp_L >= 0x10000)
    out = np.zeros(cp_L.size + 1, dtype=np.int64)
    np.cumsum(blen_L, out=out[1:])
    return out


def hf_byte_offsets(offsets: list[tuple[int, int]], cmap: np.ndarray | None):
    """HF character offsets -> byte offsets (``starts_T``, ``ends_T``)."""
    if not offsets:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty.copy()
    off_T2 = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    if cmap is not None:
        off_T2 = cmap[off_T2]
    return off_T2[:, 0].copy(), off_T2[:, 1].copy()


def place_tokens(ids_T: np.ndarray, hs_T: np.ndarray, he_T: np.ndarray, len_V: np.ndarray,
                 role_V: np.ndarray, lossless: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """Byte ``starts_T``, ``ends_T`` and the phantom prefix (see the module docstring)."""
    starts_T, ends_T, phantom, _ = place_tokens_phantoms(ids_T, hs_T, he_T, len_V, role_V, lossless)
    return starts_T, ends_T, phantom


def place_tokens_phantoms(ids_T: np.ndarray, hs_T: np.ndarray, he_T: np.ndarray,
                          len_V: np.ndarray, role_V: np.ndarray, lossless: bool,
                          cut_V: np.ndarray | None = None):
    """:func:`place_tokens` plus the per-token phantom bytes ``phantom_T`` (int64 ``[T]``; zeros
    for lossy placement, which uses HF's offsets). ``cut_V`` (bool ``[V]``, optional): text
    tokens that start a segment and end it (non-role added tokens of a per-piece ``▁`` tokenizer)."""
    T = ids_T.size
    no_phantom_T = np.zeros(T, dtype=np.int64)
    if T == 0:
        return hs_T, he_T, 0, no_phantom_T
    is_role_T = role_V[ids_T] != 0
    if not lossless:
        ends_T = np.where(is_role_T, 0, he_T)
        ends_T = np.maximum.accumulate(ends_T)
        starts_T = np.where(is_role_T, ends_T, hs_T)
        return starts_T, ends_T, 0, no_phantom_T
    lens_T = np.where(is_role_T, 0, len_V[ids_T])
    # segment starts: text token whose predecessor is a role token (or the first token)
    prev_role_T = np.concatenate(([True], is_role_T[:-1]))
    seg_start_T = ~is_role_T & prev_role_T
    if cut_V is not None:
        cut_T = cut_V[ids_T]
        seg_start_T |= ~is_role_T & (cut_T | np.concatenate(([False], cut_T[:-1])))
    seg_T = np.cumsum(seg_start_T) - 1                      # segment index of each token
    first_S = np.flatnonzero(seg_start_T)
    if first_S.size == 0:                                     # only role tokens
        zeros = np.zeros(T, dtype=np.int64)
        return zeros, zeros.copy(), 0, no_phantom_T
    last_S = np.append(first_S[1:], T) - 1
    # last text token of each segment: walk back over trailing role tokens
    text_idx_T = np.where(~is_role_T, np.arange(T), -1)
    last_S = np.maximum.accumulate(text_idx_T)[last_S]
    anchor_S = np.where(first_S > 0, he_T[np.maximum(first_S - 1, 0)], 0)
    anchor_S = np.maximum.accumulate(anchor_S)
    csum_T = np.cumsum(lens_T)
    base_S = csum_T[first_S] - lens_T[first_S]
    total_S = csum_T[last_S] - base_S
    extra_S = np.maximum(total_S - (he_T[last_S] - anchor_S), 0)
    seg_c = np.maximum(seg_T, 0)
    ends_T = anchor_S[seg_c] + (csum_T - base_S[seg_c]) - extra_S[seg_c]
    starts_T = np.maximum(ends_T - lens_T, anchor_S[seg_c])
    ends_T = np.maximum(ends_T, starts_T)
    # role tokens sit at the end of the previous token
    ends_T = np.where(is_role_T, 0, ends_T)
    running_T = np.maximum.accumulate(ends_T)
    ends_T = np.where(is_role_T, running_T, ends_T)
    starts_T = np.where(is_role_T, running_T, starts_T)
    phantom = int(extra_S[0]) if anchor_S[0] == 0 else 0
    # per token: the segment's extra bytes not yet used by the tokens before it in the segment
    before_T = csum_T - lens_T - base_S[seg_c]
    phantom_T = np.where(is_role_T | (seg_T < 0), 0,
                         np.clip(extra_S[seg_c] - before_T, 0, lens_T)).astype(np.int64)
    return starts_T, ends_T, phantom, phantom_T
