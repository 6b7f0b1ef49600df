"""Asset names, versions and folders (imports nothing of xdistill but its errors).

The loaders (:mod:`xdistill.tokenization.load`, :mod:`xdistill.student.model`, ...) import only
this module, so reading an asset never pulls in the downloader (:mod:`xdistill.assets.fetch`).
"""

from __future__ import annotations

import os
from pathlib import Path

from xdistill.errors import XDistillError

ASSETS_VERSION = 1
# bump an entry when that tokenizer's conversion changes: only it is rebuilt on the next fetch
BUILD_VERSIONS = {"mistral": 2, "llama3": 2}
ENV_VAR = "XDISTILL_ASSETS"
TOKENIZER_NAMES = ("gpt2", "qwen2", "llama3", "mistral", "bert", "llama-spm", "phi3")
GGUF_VOCABS = ("qwen2", "llama-spm", "phi-3", "llama-bpe", "gpt-2", "bert-bge")
MODEL_NAMES = ("smollm2-135m", "gemma3-270m")
PLAYS = ("hamlet", "macbeth", "othello", "tempest", "twelfth_night", "julius_caesar")


class AssetError(XDistillError):
    """A download or conversion of a test asset failed."""


def asset_dir(override: str | os.PathLike | None = None) -> Path:
    """The asset root: ``override``, else ``$XDISTILL_ASSETS``, else ``~/.cache/xdistill/assets``."""
    if override is not None:
        return Path(override).expanduser()
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "xdistill" / "assets"


def tokenizer_dir(name: str, root: Path | None = None) -> Path:
    """Folder of a tokenizer asset (a model asset's tokenizer lives in its model folder)."""
    if name in MODEL_NAMES:
        return model_dir(name, root)
    return asset_dir(root) / "tokenizers" / name


def model_dir(name: str, root: Path | None = None) -> Path:
    """Folder of a pretrained model asset (``smollm2-135m``, ``gemma3-270m``): a Hugging Face
    folder that ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained`` load directly."""
    if name not in MODEL_NAMES:
        raise AssetError(f"unknown model asset {name!r} (known: {', '.join(MODEL_NAMES)})")
    return asset_dir(root) / "models" / name
