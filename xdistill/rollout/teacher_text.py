"""The teacher's own rendering of a conversation with the student's response inside, byte-exact.

Legend: T teacher tokens of one row, V vocabulary.

A teacher reads the prompt rendered with *its* chat template and generation prompt
(:func:`xdistill.rollout.render.render_prompt`), followed by exactly the bytes the student wrote:

* When the response is valid UTF-8 the whole text ``prefix + response`` is encoded **in one
  piece**, as the teacher would see it in any other use: no dummy-prefix space is inserted at the
  response start (a separately encoded response gets SentencePiece's ``▁``, which the student never
  wrote), and tokens may merge across the prompt/response boundary as they naturally do.
* The response region starts at the first token holding a response byte. A token that straddles
  the boundary (a prompt ending in a space, ``"A: " + "28"`` -> ``" 28"``) belongs to the region;
  its prompt bytes are *phantom* bytes for the aligner (``phantom_T``), so the region's text is
  exactly the response.
* Bytes that are not valid UTF-8 (a byte-level student may stop inside a character) cannot be
  given to a text tokenizer. They are spelled with the teacher's single-byte tokens (byte-level
  BPE alphabet, SentencePiece ``<0xNN>`` byte fallback), so the teacher scores the very bytes the
  student produced; the valid runs around them are encoded on their own (their dummy-prefix
  spaces become phantom bytes). A byte the teacher's vocabulary cannot spell at all is *unpaired*:
  it is left out of the teacher's text and counted (``missing_bytes``); the student tokens holding
  it stay unaligned and get the unpaired-token penalty of the on-policy losses.

:func:`teacher_region` returns the prefix ids and the region (ids, per-token phantom bytes, byte
spans of each region token in response coordinates) for the scorer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xdistill.tokenization.table import ROLE_TEXT

_BYTE_TOKENS: dict[str, np.ndarray] = {}


@dataclass(frozen=True)
class TeacherRegion:
    """One teacher row split into the prompt prefix and the response region."""

    # prompt-prefix token ids (never aligned, never in the loss), int64 [Tp]
    prefix_ids: np.ndarray
    # response-region token ids, int64 [T]
    ids_T: np.ndarray
    # leading bytes of each region token's table bytes that are not response bytes, int64 [T]
    phantom_T: np.ndarray
    # byte span of each region token in response coordinates (start clipped at 0), int64 [T]
    starts_T: np.ndarray
    ends_T: np.ndarray
    # response bytes the teacher vocabulary cannot spell (left out of its text)
    missing_bytes: int = 0


def single_byte_tokens(tok) -> np.ndarray:
    """int64 ``[256]``: per byte value a text token whose table bytes are exactly that byte (-1
    when the vocabulary has none). Cached per tokenizer fingerprint."""
    key = tok.fingerprint
    if key not in _BYTE_TOKENS:
        table = tok.table
        out = np.full(256, -1, dtype=np.int64)
        one = np.flatnonzero((table.lengths_V == 1) & (table.roles_V == ROLE_TEXT))
        vals = table.data[table.offsets_V1[one]]
        for tid, b in sorted(zip(one.tolist(), vals.tolist()), reverse=True):
            out[b] = tid  # the smallest id wins for duplicate spellings
        _BYTE_TOKENS[key] = out
    return _BYTE_TOKENS[key]


def utf8_runs(data: bytes) -> list[tuple[int, bytes, bool]]:
    """``(offset, bytes, valid)`` pieces of ``data``: maximal valid UTF-8 runs and single invalid
    bytes, in order."""
    out: list[tuple[int, bytes, bool]] = []
    text = data.decode("utf-8", errors="surrogateescape")
    pos, run_start, buf = 0, 0, []
    for ch in text:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:       # an escaped invalid byte
            if buf:
                out.append((run_start, "".join(buf).encode("utf-8"), True))
                buf = []
            out.append((pos, bytes([code - 0xDC00]), False))
            pos += 1
            run_start = pos
        else:
            if not buf:
                run_start = pos
            buf.append(ch)
            pos += len(ch.encode("utf-8"))
    if buf:
        out.append((run_start, "".join(buf).encode("utf-8"), True))
    return out


def _region_of(enc, lengths_V, prefix_bytes: int):
    """Split a one-piece encoding of ``prefix + run`` at the first token holding a run byte."""
    ids = np.asarray(enc.ids, dtype=np.int64)
    ends = np.asarray(enc.ends, dtype=np.int64)
    starts = np.asarray(enc.starts, dtype=np.int64)
    k = int(np.searchsorted(ends, prefix_bytes, side="right")) if ids.size else 0
    # role tokens right at the boundary (start == end == prefix_bytes) stay in the prefix
    phantom = np.asarray(enc.phantom_bytes_T(), dtype=np.int64)[k:].copy()
    reg_starts = starts[k:] - prefix_bytes
    if reg_starts.size and reg_starts[0] < 0:      # straddles the boundary
        phantom[0] += -int(reg_starts[0])
        reg_starts[0] = 0
    return ids[:k], ids[k:], phantom, reg_starts, ends[k:] - prefix_bytes


def encode_literal(tok, text: str):
    """``tok.encode(text)`` with special-token strings in ``text`` kept as plain text (a student
    may spell ``<|endoftext|>`` with ordinary tokens; the teacher must read those bytes, not its
    control token)."""
    backend = getattr(tok, "_backend", None)
    if backend is None or not hasattr(backend, "encode_special_tokens"):
        return tok.encode(text, add_special_tokens=False)
    saved = backend.encode_special_tokens
    backend.encode_special_tokens = True
    try:
        return tok.encode(text, add_special_tokens=False)
    finally:
        backend.encode_special_tokens = saved


def teacher_region(tok, prefix: str, response: bytes) -> TeacherRegion:
    """The teacher row for ``prefix`` (its rendered prompt) + the student's ``response`` bytes
    (module docstring)."""
    prefix_b = prefix.encode("utf-8")
    runs = utf8_runs(response)
    first_text = runs[0][1].decode("utf-8") if runs and runs[0][2] else ""
    enc = tok.encode(prefix + first_text, add_special_tokens=False)
    pre, ids, phantom, starts, ends = _region_of(enc, tok.table.lengths_V, len(prefix_b))
    if ids.size and (tok.table.roles_V[ids] != ROLE_TEXT).any():
        # special-token text inside the response: the prompt alone in one piece, the response
        # as literal text (its dummy-prefix space, if any, is a phantom byte)
        pre = np.asarray(tok.encode(prefix, add_special_tokens=False).ids, dtype=np.int64)
        e = encode_literal(tok, first_text)
        ids, phantom = np.asarray(e.ids, dtype=np.int64), np.asarray(e.phantom_bytes_T())
        starts, ends = np.asarray(e.starts, dtype=np.int64), np.asarray(e.ends, dtype=np.int64)
    parts_ids, parts_ph, parts_s, parts_e = [ids], [phantom], [starts], [ends]
    missing = 0
    byte_tok = single_byte_tokens(tok)
    for offset, piece, valid in runs[1:] if first_text else runs:
        if valid:
            e = encode_literal(tok, piece.decode("utf-8"))
            parts_ids.append(np.asarray(e.ids, dtype=np.int64))
            parts_ph.append(np.asarray(e.phantom_bytes_T(), dtype=np.int64))
            parts_s.append(np.asarray(e.starts, dtype=np.int64) + offset)
            parts_e.append(np.asarray(e.ends, dtype=np.int64) + offset)
            continue
        tid = int(byte_tok[piece[0]])
        if tid < 0:
            missing += 1
            continue
        parts_ids.append(np.array([tid], dtype=np.int64))
        parts_ph.append(np.zeros(1, dtype=np.int64))
        parts_s.append(np.array([offset], dtype=np.int64))
        parts_e.append(np.array([offset + 1], dtype=np.int64))
    cat = np.concatenate
    return TeacherRegion(pre, cat(parts_ids), cat(parts_ph), cat(parts_s), cat(parts_e), missing)
