"""Test and demo assets: names and folders (``paths``), archives (``archive``), the fetcher (``fetch``).

Three modules, so that reading an asset never imports the downloader (no import cycle):

- :mod:`xdistill.assets.paths`: asset names, versions and folders (``asset_dir``,
  ``tokenizer_dir``, ``model_dir``, ``AssetError``); imports nothing of xdistill but its errors.
  Every module inside xdistill imports from here.
- :mod:`xdistill.assets.archive`: pinned archives, their members, atomic folder builds.
- :mod:`xdistill.assets.fetch`: downloads and conversions (``ensure_assets``, ``main``, the
  layout under the asset root); it imports :mod:`xdistill.pretrained`.

This package re-exports the names of ``paths`` eagerly and those of ``archive`` and ``fetch``
lazily (module ``__getattr__``), so ``from xdistill.assets import ensure_assets`` keeps working
for scripts and tests while ``import xdistill.assets.paths`` stays free of the fetcher. Modules
inside xdistill import from the submodules themselves.
"""

from __future__ import annotations

from xdistill.assets.paths import (ASSETS_VERSION, BUILD_VERSIONS, ENV_VAR, GGUF_VOCABS, MODEL_NAMES,
                                   PLAYS, TOKENIZER_NAMES, AssetError, asset_dir, model_dir,
                                   tokenizer_dir)

_ARCHIVE_NAMES = ("Archive", "Package", "Staging", "write_bytes_atomic")
_FETCH_NAMES = ("BUILDERS", "LLAMA3_CHAT_TEMPLATE", "MISTRAL_CHAT_TEMPLATE", "PACKAGES",
                "assets_complete", "ensure_assets", "main", "strip_gutenberg")

__all__ = ["ASSETS_VERSION", "BUILD_VERSIONS", "ENV_VAR", "GGUF_VOCABS", "MODEL_NAMES", "PLAYS",
           "TOKENIZER_NAMES", "AssetError", "asset_dir", "model_dir", "tokenizer_dir",
           *_ARCHIVE_NAMES, *_FETCH_NAMES]


def __getattr__(name: str):
    if name in _ARCHIVE_NAMES:
        # deferred: tarfile, zipfile via assets.archive (keeps `import xdistill.assets.paths` lean)
        from xdistill.assets import archive

        return getattr(archive, name)
    if name in _FETCH_NAMES:
        # deferred: numpy via assets.fetch (keeps `import xdistill.assets.paths` stdlib-only)
        from xdistill.assets import fetch

        return getattr(fetch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
