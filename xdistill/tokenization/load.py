"""``load_tokenizer(spec)``: one entry point for every way a tokenizer arrives.

``spec`` may be

* an asset name (``gpt2``, ``qwen2``, ``llama3``, ``mistral``, ``bert``, ``llama-spm``, ``phi3``):
  the folder ``$XDISTILL_ASSETS/tokenizers/<name>`` that ``tools/fetch_assets.py`` writes; or a
  pretrained model asset (``smollm2-135m``, ``gemma3-270m``): its model folder
  ``$XDISTILL_ASSETS/models/<name>`` (:func:`xdistill.assets.paths.model_dir`);
* a local Hugging Face folder (``tokenizer.json`` / ``tokenizer.model`` + config; a
  tiktoken-format ``tokenizer.model`` without ``tokenizer.json`` loads as the rank file below),
  or a folder holding a single ``.gguf``;
* a ``tokenizer.json`` file (with a ``tokenizer_config.json`` beside it: loaded as that folder;
  otherwise bos/eos/pad/unk are its special added tokens of those roles, when unambiguous);
* a ``.tiktoken`` rank file (or a tiktoken-format ``tokenizer.model`` such as Llama-3's): GPT-2
  pattern and ``<|endoftext|>`` for 50,256 ranks, Llama-3 pattern and its 256 special tokens for
  128,000 ranks, otherwise the Llama-3 (cl100k-style) pattern without special tokens;
* a SentencePiece ``.model`` (BPE; loaded with ``LlamaTokenizer.from_pretrained``);
* a ``.gguf`` file (``AutoTokenizer.from_pretrained(dir, gguf_file=...)``; a whole model's GGUF
  works too, its weights are not read);
* a hub name (``org/name``), only when ``HF_HUB_OFFLINE`` is not set.

An asset folder whose source carries no chat template (``gemma3-270m``, ``llama-spm``) gets the
model's own template shipped in :mod:`xdistill.tokenization.templates`.

Every failure is a :class:`~xdistill.errors.TokenizerError` naming the spec or file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from xdistill.assets.paths import MODEL_NAMES, TOKENIZER_NAMES, tokenizer_dir
from xdistill.errors import TokenizerError
from xdistill.tokenization.roles import role_of
from xdistill.tokenization.table import ROLE_BOS, ROLE_EOS, ROLE_PAD, ROLE_UNK
from xdistill.tokenization.templates import apply_shipped_template, asset_name
from xdistill.tokenization.tokenizer import Tokenizer

#: pre-tokenizer patterns and special tokens of the tiktoken-format vocabularies (GPT-2, Llama-3)
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
    "<|image|>",
] + [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - 12)]

TOKENIZER_ASSETS = TOKENIZER_NAMES
MODEL_ASSETS = MODEL_NAMES
ASSET_NAMES = TOKENIZER_ASSETS + MODEL_ASSETS


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _short(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0][:300] if msg else ''}"


def _is_tiktoken_file(path: Path) -> bool:
    """tiktoken files are text lines ``<base64> <rank>``; SentencePiece files are protobuf."""
    with open(path, "rb") as fh:
        head = fh.read(256)
    line = head.split(b"\n", 1)[0].split()
    return len(line) == 2 and line[1].isdigit() and all(c < 128 for c in head)


def from_tiktoken(path: Path, pattern: str, specials: list[str], bos_first: bool = False,
                  **roles):
    """A fast HF tokenizer from a tiktoken rank file (GPT-2 byte alphabet, byte-level BPE).
    ``bos_first``: encoding with special tokens puts ``roles["bos_token"]`` first, as the
    published Llama-3 ``tokenizer.json`` does (its post-processor), so the model's BOS default
    is the same whether it was loaded from that folder or from the rank file."""
    # deferred: tokenizers, transformers (slow import; xdistill.tokenization stays numpy-only)
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tok = TikTokenConverter(vocab_file=str(path), pattern=pattern,
                            extra_special_tokens=specials).converted()
    if bos_first:
        bos = roles["bos_token"]
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                          special_tokens=[(bos, tok.token_to_id(bos))])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, **roles)


def _load_tiktoken(path: Path):
    with open(path, "rb") as fh:
        n_ranks = sum(1 for line in fh if line.strip())
    if n_ranks == 50256:
        return from_tiktoken(path, GPT2_PATTERN, ["<|endoftext|>"], bos_token="<|endoftext|>",
                             eos_token="<|endoftext|>", unk_token="<|endoftext|>")
    if n_ranks == 128000:
        return from_tiktoken(path, LLAMA3_PATTERN, LLAMA3_SPECIALS, bos_first=True,
                             bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
                             pad_token="<|finetune_right_pad_id|>")
    return from_tiktoken(path, LLAMA3_PATTERN, [])


def _load_spm(path: Path):
    # deferred: sentencepiece, transformers (xdistill.tokenization stays numpy-only)
    import sentencepiece as spm  # noqa: F401  (validates the protobuf before transformers does)
    from transformers import LlamaTokenizer

    proc = spm.SentencePieceProcessor()
    proc.LoadFromFile(str(path))
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(path, Path(tmp) / "tokenizer.model")
        # transformers 5: LlamaTokenizer(vocab_file=...) silently builds a 3-token vocabulary.
        # add_bos_token: transformers 5 defaults it to False; the published folders (Llama-2,
        # Mistral) and llama.cpp (every SentencePiece vocabulary) put BOS first.
        hf = LlamaTokenizer.from_pretrained(tmp, add_bos_token=True)
    if len(hf) != proc.GetPieceSize():
        raise TokenizerError(f"{path}: converted vocabulary has {len(hf)} entries, the "
                             f"SentencePiece model {proc.GetPieceSize()} (unsupported model type?)")
    return hf


def _json_roles(path: Path) -> dict[str, str]:
    """``bos_token``/``eos_token``/``pad_token``/``unk_token`` for a bare ``tokenizer.json``: the
    one special added token of each role (:func:`~xdistill.tokenization.roles.role_of`), when
    exactly one has it."""
    try:
        added = json.loads(path.read_text(encoding="utf-8")).get("added_tokens") or []
    except (OSError, ValueError, AttributeError):
        return {}                                   # the loader reports the broken file
    found: dict[int, list[str]] = {}
    for tok in added:
        if isinstance(tok, dict) and tok.get("special") and isinstance(tok.get("content"), str):
            found.setdefault(role_of(tok["content"], {}), []).append(tok["content"])
    # BERT's [CLS] has the bos role in the tables, but its folder declares no BOS token (and
    # adds none by default): a bare file must not make it one
    found[ROLE_BOS] = [t for t in found.get(ROLE_BOS, []) if t != "[CLS]"]
    return {attr: found[role][0] for attr, role in (
        ("bos_token", ROLE_BOS), ("eos_token", ROLE_EOS), ("pad_token", ROLE_PAD),
        ("unk_token", ROLE_UNK)) if len(found.get(role, ())) == 1}


def _load_path(path: Path):
    # deferred: transformers (slow import; xdistill.tokenization stays numpy-only)
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        has_hf = any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model",
                                                    "tokenizer_config.json", "vocab.txt"))
        if not has_hf and len(ggufs) == 1:
            return AutoTokenizer.from_pretrained(str(path), gguf_file=ggufs[0].name)
        if not has_hf:
            raise TokenizerError(f"{path}: folder has no tokenizer.json, tokenizer.model, "
                                 "tokenizer_config.json or single .gguf file")
        model = path / "tokenizer.model"
        alone = model.is_file() and not any(
            (path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
        if model.is_file() and not (path / "tokenizer.json").is_file() \
                and _is_tiktoken_file(model):
            return _load_tiktoken(model)       # Llama-3's original/: a rank file, as the file route
        if alone:                              # Llama-2 / Mistral original/: as the .model file
            return _load_spm(model)
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    suffix = path.suffix.lower()
    if suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if suffix == ".json":
        if path.name == "tokenizer.json" and (path.parent / "tokenizer_config.json").is_file():
            # the folder's config names bos/eos/pad (and add_bos_token): load it as the folder
            return AutoTokenizer.from_pretrained(str(path.parent), local_files_only=True)
        return PreTrainedTokenizerFast(tokenizer_file=str(path), **_json_roles(path))
    if suffix == ".tiktoken" or (suffix == ".model" and _is_tiktoken_file(path)):
        return _load_tiktoken(path)
    if suffix == ".model":
        return _load_spm(path)
    raise TokenizerError(f"{path}: unknown tokenizer file type {suffix!r} (expected a folder, "
                         ".json, .tiktoken, .model or .gguf)")


def resolve(spec: str | os.PathLike) -> tuple[str, Path | None]:
    """``(name, local path or None for a hub name)``; raises for unknown local names."""
    text = os.fspath(spec)
    if text in ASSET_NAMES:
        folder = tokenizer_dir(text)
        if not (folder / "tokenizer.json").is_file():
            raise TokenizerError(f"tokenizer asset {text!r} not found at {folder}; run "
                                 "`python tools/fetch_assets.py` (or set XDISTILL_ASSETS)")
        return text, folder
    path = Path(text).expanduser()
    if path.exists():
        return (path.stem if path.is_file() else path.name), path
    looks_local = text.startswith((".", "/", "~")) or os.sep in text.strip("/").replace("/", "", 1) \
        or Path(text).suffix.lower() in (".json", ".model", ".tiktoken", ".gguf")
    if looks_local:
        raise TokenizerError(f"tokenizer path {text!r} does not exist")
    if _offline():
        raise TokenizerError(f"unknown tokenizer {text!r}: not an asset name ({', '.join(ASSET_NAMES)}) "
                             "or local path, and HF_HUB_OFFLINE=1 forbids the model hub")
    return text, None


def load_tokenizer(spec: str | os.PathLike) -> Tokenizer:
    """Load a tokenizer from an asset name, local folder/file or hub name (see module docstring)."""
    name, path = resolve(spec)
    try:
        if path is None:
            # deferred: transformers (slow import; xdistill.tokenization stays numpy-only)
            from transformers import AutoTokenizer

            hf = AutoTokenizer.from_pretrained(name)
            source = f"hub:{name}"
        else:
            hf = _load_path(path)
            source = str(path)
            if path.is_dir() or path.name == "tokenizer.json":  # an asset whose source has no
                # chat template: the shipped one
                apply_shipped_template(hf, asset_name(path if path.is_dir() else path.parent))
    except TokenizerError:
        raise
    except Exception as exc:  # transformers/tokenizers/sentencepiece raise many types
        where = f"hub model {name!r}" if path is None else str(path)
        raise TokenizerError(f"cannot load tokenizer from {where}: {_short(exc)}") from exc
    try:
        return Tokenizer(hf, name, source)
    except TokenizerError:
        raise
    except Exception as exc:
        raise TokenizerError(f"cannot build token tables for {source}: {_short(exc)}") from exc
