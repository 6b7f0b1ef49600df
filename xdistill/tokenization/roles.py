"""Special-token roles: which vocabulary entries carry no text bytes, and what they mean.

A token gets a role (and zero bytes in the token-bytes table) when it is one of the tokenizer's
special tokens, or an *added* token whose content looks like a control marker (``<...>``,
``<|...|>``, ``[...]`` without whitespace; e.g. Phi-3 stores ``</s>`` as a non-special added
token). Other non-special added tokens (whitespace runs, words) stay ordinary text.

Roles are decided by name first (so Qwen's ``<|endoftext|>`` is an EOS even though the tokenizer
also calls it BOS and PAD), then by the tokenizer's declared bos/eos/pad/unk attributes:

* bos: ``<s>``, ``<|begin_of_text|>``, ``<bos>``, ``<|startoftext|>``, ``[CLS]``
* eos (end of sequence or end of turn): ``</s>``, ``<|endoftext|>``, ``<|end_of_text|>``,
  ``<|eot_id|>``, ``<|eom_id|>``, ``<|im_end|>``, ``<|end|>``, ``<eos>``, ``<end_of_turn>``, ``[SEP]``
* pad: ``<pad>``, ``[PAD]``, ``<|pad|>``, ``<|finetune_right_pad_id|>``; unk: ``<unk>``, ``[UNK]``
* tool: anything mentioning tool/function/python_tag/ipython/plugin (``<tool_call>``, ``[TOOL_CALLS]``)
* chat: role markers (``<|im_start|>``, ``<|start_header_id|>``, ``[INST]``, ``<|user|>``, ...)
* special: every other control token (``[MASK]``, reserved/placeholder tokens, ...).
"""

from __future__ import annotations

import re

import numpy as np

from xdistill.tokenization.table import (
    ROLE_BOS, ROLE_CHAT, ROLE_EOS, ROLE_PAD, ROLE_SPECIAL, ROLE_TEXT, ROLE_TOOL, ROLE_UNK,
)

_BY_NAME = {
    ROLE_BOS: {"<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>", "[cls]"},
    ROLE_EOS: {"</s>", "<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>", "<|im_end|>",
               "<|end|>", "<eos>", "<end_of_turn>", "[sep]", "<|eos|>"},
    ROLE_PAD: {"<pad>", "[pad]", "<|pad|>", "<|finetune_right_pad_id|>"},
    ROLE_UNK: {"<unk>", "[unk]", "<|unk|>"},
}
_TOOL_RX = re.compile(r"tool|function|python_tag|ipython|plugin", re.I)
_CHAT_RX = re.compile(
    r"im_start|header_id|\[/?inst\]|^<\|(user|assistant|system|developer|ipython)\|>$|start_of_turn|"
    r"system_prompt|<\|?(start|end)_?of_?role|^<\|(im_sep|channel|message|start)\|>$", re.I)
_MARKER_RX = re.compile(r"^(<[^\s<>]+>|\[[^\s\[\]]+\])$")


def looks_like_marker(content: str) -> bool:
    """``<...>``/``<|...|>``/``[...]`` without whitespace: a control marker, not text."""
    return bool(_MARKER_RX.match(content))


def role_of(content: str, declared: dict[str, str | None]) -> int:
    """Role of one special token from its content, then the tokenizer's declared attributes."""
    low = content.lower()
    for role, names in _BY_NAME.items():
        if low in names:
            return role
    if _TOOL_RX.search(content):
        return ROLE_TOOL
    if _CHAT_RX.search(content):
        return ROLE_CHAT
    for attr, role in (("bos", ROLE_BOS), ("eos", ROLE_EOS), ("pad", ROLE_PAD), ("unk", ROLE_UNK)):
        if declared.get(attr) == content:
            return role
    return ROLE_SPECIAL


def role_tokens(added: dict[int, tuple[str, bool]], special_ids: set[int],
                declared: dict[str, str | None], id_to_token) -> dict[int, int]:
    """``{id: role}`` for every token that carries a role.

    ``added`` maps id -> (content, special) for the tokenizer's added tokens; ``special_ids`` are
    ids the HF wrapper calls special; ``id_to_token`` gives the string of any other id.
    """
    out: dict[int, int] = {}
    for tid, (content, special) in added.items():
        if special or tid in special_ids or looks_like_marker(content):
            out[tid] = role_of(content, declared)
    for tid in special_ids:
        if tid not in out:
            content = id_to_token(tid)
            if content is not None:
                out[tid] = role_of(content, declared)
    return out


def roles_array(vocab_size: int, roles: dict[int, int], holes: np.ndarray) -> np.ndarray:
    """int8 ``[V]`` role per id; ids with no token string at all (holes) are ``special``."""
    roles_V = np.full(vocab_size, ROLE_TEXT, dtype=np.int8)
    roles_V[holes] = ROLE_SPECIAL
    if roles:
        ids = np.fromiter(roles.keys(), dtype=np.int64, count=len(roles))
        vals = np.fromiter(roles.values(), dtype=np.int8, count=len(roles))
        roles_V[ids] = vals
    return roles_V
