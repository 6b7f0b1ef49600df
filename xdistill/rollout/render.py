"""Prompt rendering for one tokenizer: the text a model is asked to continue, and its stop tokens.

Legend: T tokens.

A prompt is a ``str`` (used verbatim) or a conversation (tuple of ``(role, content)`` pairs). A
conversation is rendered with the tokenizer's own chat template and its *generation prompt*
(``apply_chat_template(..., add_generation_prompt=True)``); without a template (or when the
template rejects the conversation) with the plain template of :mod:`xdistill.data.chat` followed by
``"assistant:\\n"``, i.e. exactly the prefix :func:`xdistill.data.chat.render_plain` writes before
an assistant message's content. Every tokenizer (student and each teacher) renders the same prompt
with its own template; the response bytes are then appended verbatim.
"""

from __future__ import annotations

import numpy as np

from xdistill.data.chat import PLAIN_CHAT_TEMPLATE, as_conversation, render_chat, render_plain
from xdistill.errors import DataError
from xdistill.tokenization.bos import resolve_add_bos
from xdistill.tokenization.table import ROLE_TEXT

_PROBE = "xdistill-probe"
_EOT_CACHE: dict[str, int | None] = {}


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
    key = tok.fingerprint
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
