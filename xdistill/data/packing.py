"""Lazy packing of documents into student-length windows of *text*.

Legend: T student tokens of one document or segment, K loss spans.

The stream of one DataLoader worker is its documents in (seeded, per-epoch) shuffled order, each
tokenized by the student with no automatic special tokens and followed by the student's EOS as a
separator. The stream is cut into windows of ``budget`` tokens (``window_len``, minus one when a BOS
is prepended); a document that does not fit is split at a student token boundary and continues in
the next window, so nothing is lost. Split points never fall inside a UTF-8 character (the split
moves back to the previous clean token boundary; the window is then a little shorter).

A window is a tuple of :class:`Segment`: a byte span of one document (or of the student's rendering
of a chat document) with the student's token ids for exactly those bytes, plus whether the EOS
separator follows. Teachers re-tokenize the same bytes (the collator), so every tokenization of a
window covers identical text. An EOS that did not fit at the end of a window opens the next window
as a segment with no bytes.

A text document longer than ``LONG_DOC_CHARS`` is tokenized in pieces cut after a newline that
sits between two non-space characters (``x\ny``: no pre-tokenizer we ship merges across such a
newline, and the pieces' bytes concatenate to the document's exactly); a 100 MB document then
costs its token arrays (~50 bytes per token) instead of the tokenizer's whole-text state (13.5 GB
measured; 24 MB: 0.3 GB instead of 3.3 GB). A tokenizer that adds a dummy-prefix space to every call (legacy SentencePiece) or
drops bytes (WordPiece) gets the whole text at once, as before; for the others the piecewise ids
and byte offsets equal the whole-text ones (tested).

The packing position is ``(epoch, pos, off)``: document ``pos`` of this worker's order, token ``off``
inside it (``off == n_tokens`` means only its EOS is pending). It is all the state needed to resume
exactly: the current document is simply re-tokenized.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from xdistill.data.chat import render_chat, token_loss_mask
from xdistill.errors import DataError

DEFAULT_LOSS_ROLES = frozenset({"assistant"})


@dataclass(frozen=True)
class ChatInfo:
    """What a teacher needs to re-render a chat segment with its own template."""

    # the conversation: tuple of (role, content)
    conversation: tuple
    # byte spans of each message content in the student's rendering, [M, 2]
    spans_M2: np.ndarray
    # byte length of the student's rendering
    n_bytes: int
    # byte spans of each content's stripped core there, [M, 2] (RenderedChat.core_M2)
    core_M2: np.ndarray | None = None


@dataclass(frozen=True)
class Segment:
    """A piece of one document inside a window (see the module docstring)."""

    # global index of the document in the source
    doc: int
    # the segment's text: bytes [byte_start, byte_end) of the document (chat: of the student rendering)
    text: str
    byte_start: int
    byte_end: int
    # student token ids of exactly these bytes, [T]
    ids_T: np.ndarray
    # student token byte offsets relative to byte_start (special tokens: start == end), [T]
    starts_T: np.ndarray
    ends_T: np.ndarray
    # True on student tokens that carry loss, [T]
    loss_T: np.ndarray
    # per token, its leading bytes that are not in the text (SentencePiece dummy prefix, also
    # after in-text special tokens), int64 [T]
    phantom_T: np.ndarray
    # the student's EOS separator follows this segment
    eos: bool
    # chat documents: the conversation and the student rendering's content spans; None for text
    chat: ChatInfo | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.ids_T.size) + int(self.eos)


@dataclass(frozen=True)
class Window:
    """One student-length window: segments in stream order."""

    segments: tuple[Segment, ...]
    # prepend the student's BOS token (never when the first segment already starts with it: a
    # chat template that writes the BOS itself)
    bos: bool = False
    # (epoch, shard, index of the window in the shard's stream) -- for debugging and tests
    key: tuple = ()

    @property
    def n_tokens(self) -> int:
        return sum(s.n_tokens for s in self.segments) + int(self.bos)


@dataclass
class _DocEnc:
    doc: int
    text: str
    raw_N: np.ndarray  # uint8 bytes of text
    ids_T: np.ndarray
    starts_T: np.ndarray
    ends_T: np.ndarray
    loss_T: np.ndarray
    phantom_T: np.ndarray  # per token, as Segment.phantom_T
    chat: ChatInfo | None
    allowed_T1: np.ndarray  # [T+1]: True where a split before token k keeps characters whole

    def boundary(self, k: int) -> int:
        """Byte offset of the split before token ``k``."""
        if k <= 0:
            return 0
        if k >= self.ids_T.size:
            return int(self.raw_N.size)
        return int(self.starts_T[k])


LONG_DOC_CHARS = 1 << 18   # 256 Ki characters (a piece costs ~40 MB of tokenizer state)


def _pieces(text: str, size: int) -> list[str]:
    """``text`` cut into pieces of about ``size`` characters after ``x\ny`` newlines."""
    out, start = [], 0
    while len(text) - start > size:
        cut = start + size
        while cut < len(text) - 1 and not (text[cut - 1] == "\n" and not text[cut].isspace()
                                           and cut >= 2 and not text[cut - 2].isspace()):
            cut += 1
        if cut >= len(text) - 1:
            break
        out.append(text[start:cut])
        start = cut
    out.append(text[start:])
    return out


def _arrays(enc, base: int = 0):
    n = len(enc.ids)
    return (np.asarray(enc.ids, np.int64), np.asarray(enc.starts, np.int64) + base,
            np.asarray(enc.ends, np.int64) + base, enc.phantom_bytes_T()[:n])


def encode_text(student, text: str, size: int = LONG_DOC_CHARS, specials_as_text: bool = False):
    """(ids, starts, ends, phantom bytes per token) of ``text``, piece by piece when it is long;
    ``specials_as_text``: a special token's string is read as the text it spells."""
    lossy = bool(getattr(student, "lossy", False))   # WordPiece: zero-byte tokens at piece edges
    pieces = _pieces(text, size) if len(text) > size and not lossy else [text]
    parts, base = [], 0
    for i, piece in enumerate(pieces):
        enc = student.encode(piece, add_special_tokens=False, specials_as_text=specials_as_text)
        if i and int(getattr(enc, "phantom_prefix", 0) or 0):
            # a dummy prefix on every call: pieces would add bytes; encode it whole
            return _arrays(student.encode(text, add_special_tokens=False,
                                          specials_as_text=specials_as_text))
        parts.append(_arrays(enc, base))
        base += len(piece.encode("utf-8"))
    return tuple(np.concatenate(col) for col in zip(*parts))


def check_roles_message(where: str, roles, loss_roles) -> str:
    """The error of a conversation none of whose roles is trained (only user turns, say)."""
    return (f"{where}: chat roles {sorted(roles)} include none of data.loss_roles "
            f"{sorted(loss_roles)}, so it would carry no loss; drop it, or set data.loss_roles to "
            "the role(s) to train")


def encode_document(student, doc_index: int, doc, *, loss_roles=DEFAULT_LOSS_ROLES,
                    end_of_turn: bool = True, where: str | None = None,
                    specials_as_text: bool = True) -> _DocEnc | None:
    """Tokenize one document (text or conversation) with the student; None when it is empty.
    ``where`` names it in errors (e.g. ``"FILE row R"``; default ``"document <doc_index>"``).
    ``specials_as_text``: a text document's special-token strings (``<|endoftext|>`` written in
    it) are the text they spell, as every other tokenizer reads them (``data.specials_as_text``);
    a chat template's own tokens are always special."""
    if isinstance(doc, str):
        if not doc.strip():
            return None
        text, chat = doc, None
    else:
        if not doc or all(not c.strip() for _, c in doc):
            return None
        roles = {r for r, _ in doc}
        if not roles & frozenset(loss_roles):
            raise DataError(check_roles_message(where or f"document {doc_index}", roles,
                                                loss_roles))
        rendered = render_chat(student, doc)
        text = rendered.text
        chat = (ChatInfo(tuple(doc), rendered.spans_M2, rendered.n_bytes, rendered.core_M2),
                rendered)
    ids_T, starts_T, ends_T, ph_T = encode_text(student, text,
                                                specials_as_text=specials_as_text and chat is None)
    if ids_T.size == 0:
        return None
    raw_N = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    if chat is None:
        loss_T = np.ones(ids_T.size, dtype=bool)
    else:
        loss_T = token_loss_mask(ids_T, starts_T, ends_T, student.table.roles_V,
                                 chat[1].loss_spans(loss_roles), end_of_turn,
                                 blank_V=student.table.blank_V)
    allowed_T1 = np.ones(ids_T.size + 1, dtype=bool)
    if ids_T.size > 1:
        s = starts_T[1:]
        clean = (s < raw_N.size) & ((raw_N[np.clip(s, 0, max(raw_N.size - 1, 0))] & 0xC0) != 0x80)
        allowed_T1[1:-1] = clean & (s >= ends_T[:-1]) & (s > starts_T[:-1])
    return _DocEnc(doc_index, text, raw_N, ids_T, starts_T, ends_T, loss_T, ph_T,
                   chat[0] if chat is not None else None, allowed_T1)


def _segment(enc: _DocEnc, k0: int, k1: int, eos: bool) -> Segment:
    b0, b1 = enc.boundary(k0), enc.boundary(k1)
    text = enc.raw_N[b0:b1].tobytes().decode("utf-8", errors="replace")
    return Segment(enc.doc, text, b0, b1, enc.ids_T[k0:k1],
                   np.clip(enc.starts_T[k0:k1] - b0, 0, None), np.clip(enc.ends_T[k0:k1] - b0, 0, None),
                   enc.loss_T[k0:k1], enc.phantom_T[k0:k1], eos, enc.chat)


def _window(segs: list, bos: bool, bos_id: int | None, key: tuple) -> Window:
    """A window; its BOS is dropped when the text already starts with it (one BOS, not two)."""
    if bos and segs and segs[0].ids_T.size and bos_id is not None \
            and int(segs[0].ids_T[0]) == int(bos_id):
        bos = False
    return Window(tuple(segs), bos, key)


def pack(order, fetch, encode, st: dict, budget: int, bos: bool, key=(), bos_id=None):
    """Pack documents ``order[st['pos']:]`` into windows; ``st`` is updated before each yield.

    ``fetch(i)`` returns document ``i``; ``encode(i, doc)`` returns its :class:`_DocEnc` or None
    (empty: skipped and counted in ``st['skipped_empty']``). The final partial window is yielded too.
    ``bos``: windows start with ``bos_id`` unless their text already does.
    """
    if budget < 1:
        raise DataError(f"window too short: {budget} token(s) left for text")
    segs: list[Segment] = []
    used, enc = 0, None
    while st["pos"] < len(order):
        doc_id = int(order[st["pos"]])
        if enc is None or enc.doc != doc_id:
            enc = encode(doc_id, fetch(doc_id))
            if enc is None:
                st["skipped_empty"] += 1
                st["pos"], st["off"] = st["pos"] + 1, 0
                continue
        n, off = int(enc.ids_T.size), st["off"]
        close = False
        if off < n:
            stop = min(n, off + budget - used)
            if stop < n:
                ok = np.flatnonzero(enc.allowed_T1[off + 1:stop + 1])
                if ok.size:
                    stop = off + 1 + int(ok[-1])
                elif segs:
                    stop, close = off, True  # no clean split: close this window, retry in a new one
                # else: one character longer than a window -- split inside it (rare; lossy bytes)
            if stop > off:
                segs.append(_segment(enc, off, stop, eos=False))
                used += stop - off
                st["off"] = off = stop
        if off == n and used < budget:
            if segs and segs[-1].doc == doc_id and segs[-1].byte_end == enc.raw_N.size:
                segs[-1] = replace(segs[-1], eos=True)
            else:
                segs.append(_segment(enc, n, n, eos=True))
            used += 1
            st["pos"], st["off"] = st["pos"] + 1, 0
        if used >= budget or close:
            st["windows"] += 1
            yield _window(segs, bos, bos_id, key + (st["windows"] - 1,))
            segs, used = [], 0
    if segs:
        st["windows"] += 1
        yield _window(segs, bos, bos_id, key + (st["windows"] - 1,))
