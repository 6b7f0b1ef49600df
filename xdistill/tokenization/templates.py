"""Chat templates shipped with xdistill for tokenizer assets whose source carries none.

Legend: none (strings only).

The Gemma-3 GGUF (``gemma3-270m``) and llama.cpp's Llama-2 SentencePiece vocabulary
(``llama-spm``) have no ``tokenizer.chat_template`` metadata, so without these a chat prompt
would fall back to the generic ``user:/assistant:`` rendering. The templates below are the
models' own published ones (Gemma-3 instruction-tuned ``tokenizer_config.json``: turns
``<start_of_turn>{user|model}\\n ... <end_of_turn>\\n``, a system message folded into the first
user turn, generation prompt ``<start_of_turn>model\\n``; Llama-2-chat: ``<s>[INST] ... [/INST]``
with an optional ``<<SYS>>`` block, answers `` {content} </s>``, no generation prompt).

:func:`apply_shipped_template` gives a loaded Hugging Face tokenizer its template when it has
none and its folder is one of these assets (``xdistill_asset.json`` names it); the asset builders
call it too, so a fresh build saves the template and an older cached build gets it at load time.
"""

from __future__ import annotations

import json
from pathlib import Path

GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}"
    "{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = \"\" -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}"
    "{%- endif -%}"
    "{%- if (message['role'] == 'assistant') -%}"
    "{%- set role = \"model\" -%}"
    "{%- else -%}"
    "{%- set role = message['role'] -%}"
    "{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}"
    "{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}"
    "{{ item['text'] | trim }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- else -%}"
    "{{ raise_exception(\"Invalid content type\") }}"
    "{%- endif -%}"
    "{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{'<start_of_turn>model\\n'}}"
    "{%- endif -%}"
)

LLAMA2_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}"
    "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)

# asset name -> its model's own chat template
SHIPPED_CHAT_TEMPLATES = {"gemma3-270m": GEMMA3_CHAT_TEMPLATE, "llama-spm": LLAMA2_CHAT_TEMPLATE}


def asset_name(folder: Path) -> str | None:
    """The ``name`` recorded in ``folder/xdistill_asset.json`` (None when absent or unreadable)."""
    try:
        meta = json.loads((Path(folder) / "xdistill_asset.json").read_text())
    except (OSError, ValueError):
        return None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else None


def apply_shipped_template(hf, name: str | None) -> bool:
    """Set ``hf.chat_template`` to the shipped template of asset ``name`` when ``hf`` has none.
    Returns True when it did."""
    template = SHIPPED_CHAT_TEMPLATES.get(name or "")
    if template is None or getattr(hf, "chat_template", None):
        return False
    hf.chat_template = template
    return True
