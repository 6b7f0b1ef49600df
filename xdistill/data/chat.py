"""Chat data: rendering with each tokenizer's own template, byte spans of message contents, loss masks.

Legend: M messages, T tokens, K loss spans.

A conversation is a tuple of ``(role, content)`` pairs. Every tokenizer renders it with its own chat
template (``tok.hf.chat_template``) or, when it has none, with :data:`PLAIN_CHAT_TEMPLATE`
(``"{role}:\\n{content}\\n\\n"`` per message, no special tokens; the newline keeps
the first word of a content from merging with template text into one token). Templates differ between tokenizers,
but the message *contents* are the same bytes in every rendering: :func:`render_chat` locates each
content in the rendered text and returns its byte span ``spans_M2``.

Loss masks travel between tokenizations through these spans (:func:`token_loss_mask`): a token
carries loss iff it has bytes and all of them lie inside the content span of a message whose role
is trained (assistant by default). Tokens straddling a span edge carry no loss. With
``end_of_turn=True`` the first token at or after the end of a trained span (past whitespace-only
template text: Llama-2 writes ``" {content} </s>"``) also carries loss when it is a special token
without bytes (``<|im_end|>``, ``<|eot_id|>``, ``</s>``; for a template without an end-of-turn
token, the next turn's opening one): the student learns where a turn stops, and every tokenizer
marks its own end-of-turn token.

Mapping byte offsets between two renderings (:func:`map_offset`): an offset inside a content maps
to the same offset inside that content in the other rendering (counted from the content's stripped
core, since a template may trim it, and kept inside the other rendering's content); an offset in template text between
contents (a "gap") maps to the start of the other rendering's gap if it is at the gap's start, else
to the gap's end. The map is monotone, so consecutive windows of one rendering map to consecutive,
non-overlapping windows of the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xdistill.errors import DataError
from xdistill.tokenization.table import ROLE_TEXT

PLAIN_CHAT_TEMPLATE = "{role}:\n{content}\n\n"
#: the chat roles a conversation may use (``data.loss_roles`` may name more, e.g. ShareGPT's
#: ``gpt``); any other role is an error, never silently rendered by a template or dropped
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")

Conversation = tuple  # tuple[tuple[str, str], ...]


def check_roles(conv, where: str, accepted=CHAT_ROLES) -> None:
    """A :class:`DataError` naming the first message whose role is not in ``accepted``."""
    for i, (role, _) in enumerate(conv):
        if role not in accepted:
            raise DataError(f"{where}: message {i} has the unknown chat role {role!r}; accepted "
                            f"roles: {', '.join(accepted)} (map others, e.g. human -> user and "
                            "gpt -> assistant, or name them in data.loss_roles)")


def as_conversation(messages, where: str = "", roles=None) -> tuple[tuple[str, str], ...]:
    """Validate ``[{role, content}, ...]`` (or pairs) into a tuple of ``(role, content)`` pairs;
    with ``roles``, every role must be one of them (:func:`check_roles`)."""
    if not isinstance(messages, (list, tuple)):
        raise DataError(f"{where}: 'messages' must be a list of {{role, content}}, "
                        f"got {type(messages).__name__}")
    out = []
    for i, msg in enumerate(messages):
        if isinstance(msg, dict):
            role, content = msg.get("role"), msg.get("content")
        elif isinstance(msg, (list, tuple)) and len(msg) == 2:
            role, content = msg
        else:
            raise DataError(f"{where}: message {i} must be an object with 'role' and 'content'")
        if not isinstance(role, str) or not isinstance(content, str):
            raise DataError(f"{where}: message {i} needs string 'role' and 'content' "
                            f"(got role={role!r}, content of type {type(content).__name__})")
        out.append((role, content))
    if roles is not None:
        check_roles(out, where, roles)
    return tuple(out)


def is_empty_conversation(conv) -> bool:
    return all(not content.strip() for _, content in conv)


@dataclass(frozen=True)
class RenderedChat:
    """A conversation rendered by one tokenizer's template."""

    text: str
    # byte span [start, end) of each message's content in text.encode("utf-8"), [M, 2] (a
    # template may have trimmed the content: the span is what the rendering holds)
    spans_M2: np.ndarray
    roles: tuple[str, ...]
    # True when the tokenizer's own template was used (False: the plain template)
    own_template: bool
    # byte span of each content's stripped core (no leading/trailing whitespace) in the text,
    # [M, 2]: where the same byte of a content sits in two renderings (:func:`map_offset`)
    core_M2: np.ndarray | None = None

    @property
    def n_bytes(self) -> int:
        return len(self.text.encode("utf-8"))

    def loss_spans(self, loss_roles: frozenset[str]) -> np.ndarray:
        """Byte spans ``[K, 2]`` of the contents whose role is trained (non-empty ones only)."""
        keep = [i for i, r in enumerate(self.roles) if r in loss_roles
                and self.spans_M2[i, 1] > self.spans_M2[i, 0]]
        return self.spans_M2[keep].reshape(-1, 2)


def chat_template_of(tok) -> str | None:
    """The chat template ``tok`` renders with (None: the generic rendering)."""
    hf = getattr(tok, "hf", None)
    template = getattr(hf, "chat_template", None) if hf is not None else None
    return template if isinstance(template, str) and template else None


def renders_alike(a, b, chat: bool) -> bool:
    """Tokenizers ``a`` and ``b`` write the same ids for the same document: one vocabulary
    (fingerprint) and the same BOS/EOS ids, and for ``chat`` the same template (a base and an
    instruct checkpoint share ``tokenizer.json`` but not their templates)."""
    if a.fingerprint != b.fingerprint or a.bos_id != b.bos_id or a.eos_id != b.eos_id:
        return False
    return not chat or chat_template_of(a) == chat_template_of(b)


def _probes(content: str) -> list[str]:
    """What a template may put in place of ``content``: itself, or trimmed on one or both sides."""
    out = []
    for probe in (content, content.strip(), content.lstrip(), content.rstrip()):
        if probe not in out:
            out.append(probe)
    return out


def _core(content: str, probe: str, start: int) -> tuple[int, int]:
    """Char span of ``content.strip()`` inside ``probe`` placed at ``start``."""
    a = start + len(probe) - len(probe.lstrip())
    return a, a + len(content.strip())


def _place(spans: list, cores: list, content: str, probe: str, pos: int) -> int:
    """Record ``probe`` (how ``content`` was rendered) at char ``pos``; returns its end."""
    spans.append((pos, pos + len(probe)))
    cores.append(_core(content, probe, pos))
    return pos + len(probe)


def _walk(text: str, skeleton: list[str], conv):
    """Char spans and cores of the contents, reading ``text`` as ``skeleton[0] content_0
    skeleton[1] ... content_M-1 skeleton[M]`` (the template's own text around each message, from
    a rendering with placeholders); None if ``text`` is not that."""
    if not text.startswith(skeleton[0]):
        return None
    spans, cores, cursor = [], [], len(skeleton[0])
    for i, (_, content) in enumerate(conv):
        after = skeleton[i + 1]
        for probe in _probes(content):
            end = cursor + len(probe)
            if text.startswith(probe, cursor) and text.startswith(after, end) and (
                    i + 1 < len(conv) or end + len(after) == len(text)):
                cursor = _place(spans, cores, content, probe, cursor) + len(after)
                break
        else:
            return None
    return spans, cores


def _search(text: str, conv):
    """Fallback when the template renders placeholders differently from real contents: each
    content searched in order (it may then match template text that equals it)."""
    spans, cores, cursor = [], [], 0
    for _, content in conv:
        for probe in (content, content.strip()):
            pos = text.find(probe, cursor)
            if pos >= 0:
                cursor = _place(spans, cores, content, probe, pos)
                break
        else:
            return None
    return spans, cores


def _skeleton(render, conv) -> list[str] | None:
    """The template's text around each message: ``conv`` rendered with a placeholder for every
    content, cut at the placeholders (None when the template rejects or alters them)."""
    marks = [f"XDISTILLMSG{i:05d}Z" for i in range(len(conv))]
    try:
        text = render(tuple((role, mark) for (role, _), mark in zip(conv, marks)))
    except Exception:  # noqa: BLE001 - a template that rejects the placeholders: search instead
        return None
    pieces = []
    for mark in marks:
        if not isinstance(text, str) or text.count(mark) != 1:
            return None
        head, text = text.split(mark)
        pieces.append(head)
    return pieces + [text]


def locate_contents(text: str, conv, render=None):
    """(char spans, char core spans) of each content in ``text``; None if one is missing. With
    ``render`` (the template), the contents are read between the template's own pieces of text
    (:func:`_skeleton`), so that a content equal to template text (``assistant``, ``a``) is not
    found there instead."""
    skeleton = _skeleton(render, conv) if render is not None else None
    found = _walk(text, skeleton, conv) if skeleton is not None else None
    return found if found is not None else _search(text, conv)


def char_to_byte_spans(text: str, char_spans) -> np.ndarray:
    """Char spans of ``text`` (sorted, disjoint) as byte spans of its UTF-8, ``[K, 2]``."""
    out = np.zeros((len(char_spans), 2), dtype=np.int64)
    byte_pos, char_pos = 0, 0
    for i, (a, b) in enumerate(char_spans):
        byte_pos += len(text[char_pos:a].encode("utf-8"))
        out[i, 0] = byte_pos
        byte_pos += len(text[a:b].encode("utf-8"))
        out[i, 1] = byte_pos
        char_pos = b
    return out


def render_plain(conv) -> RenderedChat:
    parts, char_spans, cores, pos = [], [], [], 0
    for role, content in conv:
        piece = PLAIN_CHAT_TEMPLATE.format(role=role, content=content)
        start = pos + len(role) + 2
        char_spans.append((start, start + len(content)))
        cores.append(_core(content, content, start))
        parts.append(piece)
        pos += len(piece)
    text = "".join(parts)
    return RenderedChat(text, char_to_byte_spans(text, char_spans),
                        tuple(r for r, _ in conv), own_template=False,
                        core_M2=char_to_byte_spans(text, cores))


def render_chat(tok, conv) -> RenderedChat:
    """Render ``conv`` with ``tok``'s chat template (or the plain one) and locate the contents.

    Falls back to the plain template when the tokenizer has no template, when its template
    rejects the conversation (e.g. roles it does not allow) or when it alters a content so that it
    cannot be found verbatim in the output (a loss mask could not be placed).
    """
    template = chat_template_of(tok)
    if template is not None:
        def render(c):
            return tok.hf.apply_chat_template([{"role": r, "content": x} for r, x in c],
                                              tokenize=False)
        try:
            text = render(conv)
        except Exception:  # noqa: BLE001 - template rejects the conversation: plain fallback
            text = None
        found = locate_contents(text, conv, render) if isinstance(text, str) else None
        if found is not None:
            spans, cores = found
            return RenderedChat(text, char_to_byte_spans(text, spans),
                                tuple(r for r, _ in conv), own_template=True,
                                core_M2=char_to_byte_spans(text, cores))
    return render_plain(conv)


def map_offset(pos: int, src_M2: np.ndarray, dst_M2: np.ndarray, src_len: int, dst_len: int,
               src_core_M2: np.ndarray | None = None, dst_core_M2: np.ndarray | None = None) -> int:
    """Map byte offset ``pos`` of one rendering to the other (see the module docstring). Inside a
    content the offset keeps its distance from the content's stripped core (``*_core_M2``; the
    span start without them), so whitespace a template trimmed does not shift it, and it is
    clamped to the other rendering's content span: it never lands in template text."""
    if pos <= 0:
        return 0
    if pos >= src_len:
        return dst_len
    m = len(src_M2)
    i = int(np.searchsorted(src_M2[:, 0], pos, side="right")) - 1  # last content starting <= pos
    if i >= 0 and pos < src_M2[i, 1]:
        src_ref = int((src_M2 if src_core_M2 is None else src_core_M2)[i, 0])
        dst_ref = int((dst_M2 if dst_core_M2 is None else dst_core_M2)[i, 0])
        return min(max(dst_ref + (pos - src_ref), int(dst_M2[i, 0])), int(dst_M2[i, 1]))
    gap_start = int(src_M2[i, 1]) if i >= 0 else 0
    if pos == gap_start:
        return int(dst_M2[i, 1]) if i >= 0 else 0
    return int(dst_M2[i + 1, 0]) if i + 1 < m else dst_len


def token_loss_mask(ids_T: np.ndarray, starts_T: np.ndarray, ends_T: np.ndarray, roles_V: np.ndarray,
                    spans_K2: np.ndarray, end_of_turn: bool = True,
                    blank_V: np.ndarray | None = None) -> np.ndarray:
    """Loss mask ``[T]``: tokens whose bytes lie inside one of the (sorted, disjoint) spans.

    ``starts_T/ends_T`` are byte offsets in the same coordinates as ``spans_K2``. With
    ``end_of_turn``, the first token starting at or after a span's end also carries loss when it is
    a special token (role other than text) -- the end-of-turn marker. ``blank_V``
    (``TokenByteTable.blank_V``): whitespace-only text tokens of the template between the span and
    that token are skipped (Llama-2 writes ``" {content} </s>"``).
    """
    mask_T = np.zeros(len(ids_T), dtype=bool)
    if len(spans_K2) == 0 or len(ids_T) == 0:
        return mask_T
    span_a, span_b = spans_K2[:, 0], spans_K2[:, 1]
    k_T = np.searchsorted(span_a, starts_T, side="right") - 1
    k_safe_T = np.clip(k_T, 0, None)
    has_bytes_T = ends_T > starts_T
    mask_T = (k_T >= 0) & has_bytes_T & (ends_T <= span_b[k_safe_T]) & (starts_T >= span_a[k_safe_T])
    if end_of_turn:
        first_T = np.searchsorted(starts_T, span_b, side="left")
        if blank_V is not None:
            _skip_blanks(first_T, ids_T, starts_T, roles_V, blank_V, span_a)
        ok = first_T < len(ids_T)
        cand = first_T[ok]
        special = roles_V[ids_T[cand]] != ROLE_TEXT
        mask_T[cand[special]] = True
    return mask_T


def _skip_blanks(first_K, ids_T, starts_T, roles_V, blank_V, span_a_K) -> None:
    """Move each ``first_K[k]`` past whitespace-only text tokens, never into the next span."""
    n = len(ids_T)
    for k in range(len(first_K)):
        i, stop = int(first_K[k]), span_a_K[k + 1] if k + 1 < len(span_a_K) else None
        while (i < n and (stop is None or starts_T[i] < stop)
               and roles_V[ids_T[i]] == ROLE_TEXT and blank_V[ids_T[i]]):
            i += 1
        first_K[k] = i
