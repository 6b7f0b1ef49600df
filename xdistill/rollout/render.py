"""Prompt rendering for one tokenizer: the text a model is asked to continue, and its stop tokens.

Legend: T tokens.

A prompt is a ``str`` (used verbatim) or a conversation (tuple of ``(role, content)`` pairs). A
conversation is rendered with the tokenizer's own chat template and its *generation prompt*
(``apply_chat_template(..., add_generation_prompt=True)``); without a template (or when the
template rejects the conversation) with the plain template of :mod:`xdistill.data.chat` followed by
``"assistant:\\n"``, i.e. exactly the prefix :func:`xdistill.data.chat.render_plain` writes before
an assistant message's content. Every tokenizer (student and each teacher) renders the same prompt
with its own template; the response bytes are then appended verbatim.

A prompt longer than ``max_prompt_len`` student tokens keeps its last tokens (:func:`encode_prompts`).
A teacher then reads the same part of the prompt (:func:`teacher_prompt_text`): the student's cut,
a byte offset in its rendering (:func:`prompt_cut_offset`), is mapped into the teacher's rendering
through the message contents (:func:`xdistill.data.chat.map_offset`), so that no teacher conditions
on context the student did not see.
"""

from __future__ import annotations

import numpy as np

from xdistill.data.chat import (PLAIN_CHAT_TEMPLATE, as_conversation, char_to_byte_spans,
                                 chat_template_of, locate_contents, map_offset, render_chat,
                                 render_plain)
from xdistill.errors import DataError
from xdistill.tokenization.bos import resolve_add_bos
from xdistill.tokenization.table import ROLE_TEXT

_PROBE = "xdistill-probe"
_EOT_CACHE: dict[tuple, int | None] = {}


def is_chat(prompt) -> bool:
    return not isinstance(prompt, str)


def render_prompt(tok, prompt) -> str:
    """The text ``tok``'s model continues for ``prompt`` (see the module docstring)."""
    if isinstance(prompt, str):
        return prompt
    conv = as_conversation(prompt, "prompt")
    hf = getattr(tok, "hf", None)
    template = getattr(hf, "chat_template", None) if hf is not None else None
    if isinstance(template, str) and template:
        try:
            text = hf.apply_chat_template([{"role": r, "content": c} for r, c in conv],
                                          tokenize=False, add_generation_prompt=True)
            if isinstance(text, str):
                return text
        except Exception:  # noqa: BLE001 - template rejects the conversation: plain fallback
            pass
    head = PLAIN_CHAT_TEMPLATE.split("{content}")[0].format(role="assistant")
    return render_plain(conv).text + head


def end_of_turn_id(tok) -> int | None:
    """The special token ``tok``'s chat template writes right after an assistant message, if any.

    Found by rendering a probe conversation and taking the first token after the assistant
    content when it is a role token (``<|im_end|>``, ``<|eot_id|>``, ``</s>``); else the EOS id.
    """
    # the template and EOS are not in the fingerprint (a base and an instruct checkpoint)
    key = (tok.fingerprint, chat_template_of(tok), tok.eos_id)
    if key not in _EOT_CACHE:
        r = render_chat(tok, (("user", "hi"), ("assistant", _PROBE)))
        found = None
        if r.own_template:
            suffix = r.text.encode("utf-8")[int(r.spans_M2[-1, 1]):].decode("utf-8", "replace")
            ids = np.asarray(tok.encode(suffix, add_special_tokens=False).ids)
            if ids.size and tok.table.roles_V[int(ids[0])] != ROLE_TEXT:
                found = int(ids[0])
        _EOT_CACHE[key] = found if found is not None else tok.eos_id
    return _EOT_CACHE[key]


def stop_token_ids(tok) -> tuple[int, ...]:
    """Token ids that end a response: the EOS and the chat end-of-turn token (deduplicated)."""
    out = []
    for tid in (tok.eos_id, end_of_turn_id(tok)):
        if tid is not None and int(tid) not in out:
            out.append(int(tid))
    return tuple(out)


def encode_prompts(tok, prompts, max_len: int, *, add_bos: bool | None = None) -> list[np.ndarray]:
    """Rendered, tokenized prompts (int64 ``[T]`` each); longer ones keep their last tokens.
    ``add_bos``: start each with the BOS (once, also when the template wrote one); None: the
    model's default (:mod:`xdistill.tokenization.bos`)."""
    add_bos = resolve_add_bos(add_bos, tok, "rollout.add_bos")
    texts = [render_prompt(tok, p) for p in prompts]
    encs = tok.encode_batch(texts, add_special_tokens=False)
    out = []
    for i, enc in enumerate(encs):
        ids = np.asarray(enc.ids, dtype=np.int64)
        if add_bos:
            if tok.bos_id is None:
                raise DataError(f"add_bos is set but tokenizer {tok.name!r} has no BOS token")
            if ids.size and int(ids[0]) == int(tok.bos_id):  # the template already wrote it
                ids = ids[1:]
            ids = np.concatenate([[int(tok.bos_id)], ids[-(max_len - 1):] if max_len > 1 else ids[:0]])
        else:
            ids = ids[-max_len:]
        if ids.size == 0:
            raise DataError(f"prompt {i} renders to no tokens for tokenizer {tok.name!r}")
        out.append(ids)
    return out


def prompt_cut_offset(tok, prompt, kept_tokens: int) -> int:
    """Byte offset in ``tok``'s rendering of ``prompt`` where its last ``kept_tokens`` tokens (a
    left-cut prompt row without its BOS, :func:`encode_prompts`) start; 0 when nothing was cut."""
    text = render_prompt(tok, prompt)
    enc = tok.encode(text, add_special_tokens=False)
    # byte starts (a byte-level token may start inside a character, which the tokenizer's own
    # character offsets would round back to the character's start: bytes the row does not hold)
    starts = list(enc.starts)
    if tok.bos_id is not None and list(enc.ids[:1]) == [tok.bos_id]:
        starts = starts[1:]          # a BOS the template wrote: encode_prompts drops it
    first = len(starts) - int(kept_tokens)
    if first <= 0:
        return 0
    if first >= len(starts):       # nothing kept (a row cut down to its BOS)
        return len(text.encode("utf-8"))
    return int(starts[first])


def _content_spans(tok, prompt, text: str):
    """(byte spans, byte core spans) of the prompt's contents in ``text`` (``tok``'s rendering),
    or None when they cannot be placed."""
    if isinstance(prompt, str):
        lead = len(prompt) - len(prompt.lstrip())
        return (char_to_byte_spans(text, [(0, len(text))]),
                char_to_byte_spans(text, [(lead, lead + len(prompt.strip()))]))
    conv = as_conversation(prompt, "prompt")
    found = locate_contents(text, conv, lambda c: render_prompt(tok, c))
    if found is None:
        return None
    return char_to_byte_spans(text, found[0]), char_to_byte_spans(text, found[1])


def teacher_prompt_text(teacher, student, prompt, student_cut: int) -> str:
    """``teacher``'s rendering of ``prompt`` from the place the student's cut prompt starts
    (``student_cut``: :func:`prompt_cut_offset` in the student's rendering; 0 = all of it)."""
    t_text = render_prompt(teacher, prompt)
    if student_cut <= 0:
        return t_text
    s_text = render_prompt(student, prompt)
    s_spans, t_spans = _content_spans(student, prompt, s_text), _content_spans(teacher, prompt,
                                                                                t_text)
    if s_spans is None or t_spans is None:
        return t_text  # contents not found in a rendering: nothing to map the cut through
    raw = t_text.encode("utf-8")
    cut = map_offset(student_cut, s_spans[0], t_spans[0], len(s_text.encode("utf-8")), len(raw),
                     s_spans[1], t_spans[1])
    while cut < len(raw) and raw[cut] & 0xC0 == 0x80:   # to the next character boundary
        cut += 1
    return raw[cut:].decode("utf-8")
