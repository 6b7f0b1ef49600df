"""Whether a model starts its text with its BOS token by default, and ``add_bos`` settings resolved
against that default.

A model's default is read, first match wins, from

1. ``add_bos_token`` in the ``tokenizer_config.json`` of the folder the tokenizer came from;
2. ``tokenizer.ggml.add_bos_token`` in the metadata of the ``.gguf`` it came from; when that key
   is absent, llama.cpp's own default for the GGUF's vocabulary (``llama-vocab.cpp``): BOS for a
   SentencePiece (``llama``) or WordPiece (``bert``) vocabulary and for the BPE pre-tokenizers
   it marks ``add_bos = true`` (``llama3``, ``llama-bpe``, ``falcon3``, ``pixtral``, ...); other
   vocabularies fall through to 3.;
3. the tokenizer itself: whether encoding a text with special tokens puts the BOS id first (the
   ``tokenizer.json`` post-processor; Gemma, Llama-2, Llama-3, Mistral and Phi-3 do, GPT-2, Qwen2 and
   SmolLM2 do not).

Every ``add_bos`` setting of xdistill (``data.add_bos``, a teacher's ``add_bos``,
``rollout.add_bos``, ``xdistill eval --bos/--no-bos``) is tri-state: unset (``None``) follows the
model's default; ``true`` / ``false`` win, and one that differs from the default is logged once as
a warning (:func:`resolve_add_bos`). Gemma scores 1.51 bits/byte without its ``<bos>`` and 1.01
with it: a silently wrong default costs that much.
"""

from __future__ import annotations

import json
from pathlib import Path

from xdistill.errors import ConfigError
from xdistill.log import get_logger, rank

log = get_logger("tokenization")

GGUF_KEY = "tokenizer.ggml.add_bos_token"
#: llama.cpp (src/llama-vocab.cpp, llama_vocab::impl::load) sets ``add_bos = true`` for these
#: ``tokenizer.ggml.model`` values, and for a ``gpt2`` (BPE) model with these
#: ``tokenizer.ggml.pre`` values, when the GGUF has no ``tokenizer.ggml.add_bos_token``
LLAMA_CPP_BOS_MODELS = frozenset({"llama", "bert"})
LLAMA_CPP_BOS_PRES = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1",
                                "pixtral", "midm-2.0", "lfm2", "tekken", "chameleon"})
# (tokenizer name, explicit setting) pairs already warned about in this process
_WARNED: set[tuple[str, bool]] = set()


def _config_flag(folder: Path) -> bool | None:
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("add_bos_token")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, bool) else None


def gguf_add_bos(path: str | Path) -> bool | None:
    """``tokenizer.ggml.add_bos_token`` of a GGUF file (None when absent or unreadable)."""
    try:
        # deferred: gguf (~0.25 s import; only GGUF files need it)
        from gguf import GGUFReader

        field = GGUFReader(str(path)).get_field(GGUF_KEY)
        if field is None or not field.data:
            return None
        return bool(field.parts[field.data[0]][0])
    except Exception:  # noqa: BLE001 - a GGUF we cannot read: fall back to the tokenizer
        return None


def _gguf_str(reader, key: str) -> str | None:
    field = reader.get_field(key)
    if field is None or not field.data:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8", "replace")


def gguf_bos_default(path: str | Path) -> tuple[bool | None, str]:
    """``(add BOS, where read)`` for a GGUF: its ``tokenizer.ggml.add_bos_token``, else
    llama.cpp's default for its ``tokenizer.ggml.model`` / ``tokenizer.ggml.pre`` when that
    default is BOS (:data:`LLAMA_CPP_BOS_MODELS`, :data:`LLAMA_CPP_BOS_PRES`); ``None`` otherwise."""
    name = Path(path).name
    flag = gguf_add_bos(path)
    if flag is not None:
        return flag, f"{name} {GGUF_KEY}"
    try:
        # deferred: gguf (~0.25 s import; only GGUF files need it)
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        model, pre = _gguf_str(reader, "tokenizer.ggml.model"), _gguf_str(reader, "tokenizer.ggml.pre")
    except Exception:  # noqa: BLE001 - a GGUF we cannot read: fall back to the tokenizer
        return None, ""
    if model in LLAMA_CPP_BOS_MODELS:
        return True, f"{name}: llama.cpp default for tokenizer.ggml.model {model!r}"
    if model == "gpt2" and pre in LLAMA_CPP_BOS_PRES:
        return True, f"{name}: llama.cpp default for tokenizer.ggml.pre {pre!r}"
    return None, ""


def _gguf_of(source: Path) -> Path | None:
    if source.is_file() and source.suffix.lower() == ".gguf":
        return source
    if source.is_dir():
        ggufs = sorted(source.glob("*.gguf"))
        if len(ggufs) == 1 and not (source / "tokenizer.json").is_file():
            return ggufs[0]
    return None


def encodes_bos(hf, bos_id: int | None) -> bool:
    """Whether ``hf`` puts ``bos_id`` first when it encodes a text with its special tokens."""
    if bos_id is None:
        return False
    try:
        with_special = list(hf.encode("a", add_special_tokens=True))
        plain = list(hf.encode("a", add_special_tokens=False))
    except Exception:  # noqa: BLE001 - a tokenizer that cannot encode: no BOS by default
        return False
    return len(with_special) > len(plain) and with_special[0] == bos_id and plain[:1] != [bos_id]


def model_add_bos(hf, source: str, bos_id: int | None) -> tuple[bool, str]:
    """``(adds BOS by default, where that was read)`` for a tokenizer loaded from ``source``."""
    path = Path(source) if source and not source.startswith("hub:") else None
    if path is not None and path.exists():
        folder = path if path.is_dir() else path.parent
        flag = _config_flag(folder)
        if flag is not None:
            return flag and bos_id is not None, f"{folder / 'tokenizer_config.json'} add_bos_token"
        gguf = _gguf_of(path)
        flag, origin = gguf_bos_default(gguf) if gguf is not None else (None, "")
        if flag is not None:
            return flag and bos_id is not None, origin
    return encodes_bos(hf, bos_id), "its tokenizer's post-processor"


def resolve_add_bos(setting: bool | None, tok, what: str) -> bool:
    """The ``add_bos`` to use for ``tok``: ``setting`` when given, else the model's default.

    ``what`` names the setting in messages (``data.add_bos``, ``teachers[0].add_bos``). An
    explicit ``true`` for a tokenizer without a BOS is a :class:`ConfigError`; an explicit value
    that differs from the model's default is logged as a warning once per tokenizer and value
    (by rank 0).
    """
    default = bool(getattr(tok, "add_bos_default", False))
    if setting is None:
        return default
    setting, name = bool(setting), getattr(tok, "name", "?")
    if setting and getattr(tok, "bos_id", None) is None:
        raise ConfigError(f"{what} is true but tokenizer {name!r} has no BOS token")
    if setting != default and rank() == 0 and (name, setting) not in _WARNED:
        _WARNED.add((name, setting))
        origin = getattr(tok, "add_bos_origin", "its tokenizer")
        does = "adds its BOS" if default else "does not add a BOS"
        log.warning("%s is %s, but %r %s by default (%s); the explicit setting wins (leave it "
                    "unset to follow the model)", what, str(setting).lower(), name, does, origin)
    return setting
