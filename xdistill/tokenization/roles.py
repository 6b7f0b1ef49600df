"""Special-token roles: which vocabulary entries carry no text bytes, and what they mean.

*Whether* a token gets a role (and zero bytes in the token-bytes table) is decided by what the
tokenizer itself says, never by the shape of the string:

* an added token flagged ``special`` (a GGUF file's *control* tokens become exactly these when
  transformers converts it; its *user-defined* tokens become non-special added tokens);
* an id the HF wrapper declares special (bos/eos/pad/unk/mask and its extra special tokens);
* in a SentencePiece vocabulary, the pieces SentencePiece reserves as control symbols at their
  default ids (``<unk>`` 0, ``<s>`` 1, ``</s>`` 2), which some conversions list as plain added
  tokens (Phi-3's ``</s>``).

Every other token is text, whatever it looks like: Gemma's ``<h1>``, ``<em>``, ``<s>``, ``</s>``
(ids 184..237, user-defined HTML tags), ``[multimodal]`` and newline/tab runs are ordinary text
with the bytes of their string, and a text containing ``<s>`` round-trips byte for byte.

*Which* role a role token gets is decided by name first (so Qwen's ``<|endoftext|>`` is an EOS even though the tokenizer
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
#: SentencePiece's default control pieces and their default ids
_SPM_RESERVED = {0: "<unk>", 1: "<s>", 2: "</s>"}


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
                declared: dict[str, str | None], id_to_token, family: str = "") -> dict[int, int]:
    """``{id: role}`` for every token that carries a role (see the module docstring).

    ``added`` maps id -> (content, special) for the tokenizer's added tokens; ``special_ids`` are
    ids the HF wrapper calls special; ``id_to_token`` gives the string of any other id;
    ``family`` (``spm``/``unigram``) enables SentencePiece's reserved control pieces.
    """
    out: dict[int, int] = {}
    for tid, (content, special) in added.items():
        reserved = family in ("spm", "unigram") and _SPM_RESERVED.get(tid) == content
        if special or tid in special_ids or reserved:
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
