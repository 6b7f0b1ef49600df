"""The teacher's own rendering of a conversation with the student's response inside, byte-exact.

Legend: T teacher tokens of one row, V vocabulary.

A teacher reads the prompt rendered with *its* chat template and generation prompt
(:func:`xdistill.rollout.render.render_prompt`), followed by exactly the bytes the student wrote:

* When the response is valid UTF-8 the whole text ``prefix + response`` is encoded **in one
  piece**, as the teacher would see it in any other use: no dummy-prefix space is inserted at the
  response start (a separately encoded response gets SentencePiece's ``▁``, which the student never
  wrote), and tokens may merge across the prompt/response boundary as they naturally do.
* A response that spells one of the teacher's special-token strings (``</s>`` in an HTML-ish
  answer) is read as that text, not as the control token: the prompt up to its last role token is
  encoded as usual and the rest, response included, as literal text in one piece.
* The response region starts at the first token holding a response byte. A token that straddles
  the boundary (a prompt ending in a space, ``"A: " + "28"`` -> ``" 28"``) belongs to the region;
  its prompt bytes are *phantom* bytes for the aligner (``phantom_T``), so the region's text is
  exactly the response.
* Bytes that are not valid UTF-8 (a byte-level student may stop inside a character) cannot be
  given to a text tokenizer. They are spelled with the teacher's single-byte tokens (byte-level
  BPE alphabet, SentencePiece ``<0xNN>`` byte fallback), so the teacher scores the very bytes the
  student produced; the valid runs after them are encoded on their own as continuations
  (:func:`encode_continuation`: no dummy-prefix space, which the student never wrote). A byte the teacher's vocabulary cannot spell at all is *unpaired*:
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


def _split_at(ids, phantom, starts, ends, at: int):
    """``(prefix ids, region ids, phantom, starts, ends)``: an encoding of ``prefix + run`` (as
    arrays) split at the first token holding a run byte (``at`` = the prefix's bytes); region
    spans in run coordinates. Role tokens right at the boundary (start == end == at) stay in
    the prefix; a token straddling the boundary counts its prefix bytes as phantom bytes."""
    k = int(np.searchsorted(ends, at, side="right")) if ids.size else 0
    phantom = phantom[k:].copy()
    reg_starts = starts[k:] - at
    if reg_starts.size and reg_starts[0] < 0:      # straddles the boundary
        phantom[0] += -int(reg_starts[0])
        reg_starts[0] = 0
    return ids[:k], ids[k:], phantom, reg_starts, ends[k:] - at


def _response_roles(tok, enc, text_bytes: int, at: int) -> bool:
    """Whether the one-piece encoding read a role token out of the run: a role token's span is
    empty (at its string's start), and its string ends where the next token starts."""
    ids = np.asarray(enc.ids, dtype=np.int64)
    roles = np.flatnonzero(tok.table.roles_V[ids] != ROLE_TEXT) if ids.size else ids
    if not roles.size:
        return False
    string_end = np.append(np.asarray(enc.starts, dtype=np.int64)[1:], text_bytes)
    return bool((string_end[roles] > at).any())


def encode_literal(tok, text: str):
    """``tok.encode(text)`` with special-token strings in ``text`` kept as plain text (a student
    may spell ``<|endoftext|>`` with ordinary tokens; the teacher must read those bytes, not its
    control token)."""
    return tok.encode(text, add_special_tokens=False, specials_as_text=True)


# texts put before a piece so that a SentencePiece tokenizer spends its dummy-prefix space on
# them; the first that ends on a token boundary is used
_ANCHORS = ("\n", "\t", "#", "|")


def _arrays(enc, skip: int = 0, shift: int = 0):
    """``(ids, phantom, starts, ends)`` of ``enc`` from token ``skip`` on, spans minus ``shift``."""
    return (np.asarray(enc.ids, dtype=np.int64)[skip:],
            np.asarray(enc.phantom_bytes_T(), dtype=np.int64)[skip:].copy(),
            np.asarray(enc.starts, dtype=np.int64)[skip:] - shift,
            np.asarray(enc.ends, dtype=np.int64)[skip:] - shift)


def encode_continuation(tok, text: str, literal: bool = True):
    """``(ids, phantom, starts, ends)`` of ``text`` read as the continuation of earlier text:
    without the dummy-prefix space a SentencePiece tokenizer puts at the start of a text (the
    writer never wrote it). The text is encoded behind an anchor (a newline) that takes that
    space, and the anchor's tokens are dropped; when no anchor ends on a token boundary the
    space stays, as a phantom byte. ``literal``: special-token strings read as text."""
    encode = (lambda t: encode_literal(tok, t)) if literal else \
        (lambda t: tok.encode(t, add_special_tokens=False))
    enc = encode(text)
    if not len(enc.ids) or int(enc.phantom_bytes_T()[0]) == 0:
        return _arrays(enc)
    for anchor in _ANCHORS:
        a = len(anchor.encode("utf-8"))
        e = encode(anchor + text)
        starts, ends = np.asarray(e.starts, dtype=np.int64), np.asarray(e.ends, dtype=np.int64)
        k = int(np.searchsorted(ends, a, side="right"))
        if 0 < k < len(e.ids) and ends[k - 1] == a and starts[k] >= a \
                and int(e.phantom_bytes_T()[k]) == 0:
            return _arrays(e, skip=k, shift=a)
    return _arrays(enc)


def _literal_region(tok, prefix: str, text: str):
    """The region when the one-piece encoding read a special-token string of the response as
    its control token: the prompt up to its last role token as it was, then the rest of the
    prompt and the response encoded as text (so tokens still merge across the boundary). After
    a role token the text gets a dummy-prefix space only if the tokenizer puts one there in the
    one-piece encoding (probed with ``prefix + "a"``)."""
    prefix_b = prefix.encode("utf-8")
    pe = tok.encode(prefix, add_special_tokens=False)
    pe_ids = np.asarray(pe.ids, dtype=np.int64)
    roles = np.flatnonzero(tok.table.roles_V[pe_ids] != ROLE_TEXT) if pe_ids.size else pe_ids
    j = int(roles[-1]) if roles.size else -1
    spaced = j < 0
    if j >= 0:
        # a role token's span is empty (at its string's start): the text after it starts where
        # the next token does, or at the prompt's end
        cut = int(pe.starts[j + 1]) if j + 1 < pe_ids.size else len(prefix_b)
        probe = tok.encode(prefix + "a", add_special_tokens=False)
        spaced = j + 1 < len(probe.ids) and int(probe.phantom_bytes_T()[j + 1]) > 0
    else:
        cut = 0
    tail = prefix_b[cut:].decode("utf-8") + text
    ids, phantom, starts, ends_t = (_arrays(encode_literal(tok, tail)) if spaced
                                    else encode_continuation(tok, tail))
    pre, ids, phantom, starts, ends_t = _split_at(ids, phantom, starts, ends_t,
                                                  len(prefix_b) - cut)
    return np.concatenate([pe_ids[:j + 1], pre]), ids, phantom, starts, ends_t


def teacher_region(tok, prefix: str, response: bytes) -> TeacherRegion:
    """The teacher row for ``prefix`` (its rendered prompt) + the student's ``response`` bytes
    (module docstring)."""
    prefix_b = prefix.encode("utf-8")
    runs = utf8_runs(response)
    first_text = runs[0][1].decode("utf-8") if runs and runs[0][2] else ""
    enc = tok.encode(prefix + first_text, add_special_tokens=False)
    if first_text and _response_roles(tok, enc, len(prefix_b) + len(runs[0][1]), len(prefix_b)):
        # special-token text in the response (anywhere, its start included): read as text
        pre, ids, phantom, starts, ends = _literal_region(tok, prefix, first_text)
    else:
        pre, ids, phantom, starts, ends = _split_at(*_arrays(enc), len(prefix_b))
    parts_ids, parts_ph, parts_s, parts_e = [ids], [phantom], [starts], [ends]
    missing = 0
    byte_tok = single_byte_tokens(tok)
    for offset, piece, valid in runs[1:] if first_text else runs:
        if valid:
            e_ids, e_ph, e_s, e_e = encode_continuation(tok, piece.decode("utf-8"))
            parts_ids.append(e_ids)
            parts_ph.append(e_ph)
            parts_s.append(e_s + offset)
            parts_e.append(e_e + offset)
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
