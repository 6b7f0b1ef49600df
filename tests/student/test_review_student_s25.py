"""Review s25 (student, demo, assets): each test demonstrates a defect and FAILS on the reviewed code."""

from __future__ import annotations

import io
import os
import tarfile
import zipfile

import pytest
import torch

from distributed_helpers import TINY_LLAMA
from xdistill.assets.archive import Archive
from xdistill.assets.paths import AssetError
from xdistill.errors import XDistillError
from xdistill.student.model import build_causal_lm, export_hf, load_causal_lm

_MEMBER = "pkg-1.0/vendor/llama.cpp/models/ggml-vocab-qwen2.gguf"


def _tar_gz(payload: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo(_MEMBER)
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def test_a_truncated_or_bit_rotten_archive_is_one_asset_error_naming_the_file(tmp_path):
    """A corrupt archive in ``downloads/`` must give one :class:`AssetError` naming the file
    (``Archive._open``'s own message: "corrupt archive <path> ... (delete it and fetch again)").

    Only ``Archive._open`` translates errors, and only ``OSError``/``BadZipFile``/``TarError``.
    A ``.tar.gz`` cut short (an interrupted copy, a full disk) fails later, inside
    ``getmembers``/``extractfile().read()``, with gzip's bare ``EOFError`` ("Compressed file
    ended before the end-of-stream marker was reached"), and a wheel whose member bytes are
    damaged fails in ``read`` with ``zipfile.BadZipFile`` ("Bad CRC-32"): neither names the
    archive nor says what to do."""
    payload = os.urandom(100_000)
    raw = _tar_gz(payload)
    cut = tmp_path / "dl dir" / "llama_cpp_python-0.3.36.tar.gz"
    cut.parent.mkdir()
    cut.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(AssetError, match="llama_cpp_python-0.3.36.tar.gz"):
        Archive(cut).read("ggml-vocab-qwen2.gguf")

    whl = tmp_path / "dl dir" / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("pkg/data.bin", payload)
    data = bytearray(whl.read_bytes())
    data[1000] ^= 0xFF                              # one flipped byte inside the member
    whl.write_bytes(bytes(data))
    with pytest.raises(AssetError, match="pkg-1.0-py3-none-any.whl"):
        Archive(whl).read("data.bin")


def test_fetch_assets_reports_a_truncated_download_as_an_error_not_a_traceback(tmp_path, capsys):
    """``python tools/fetch_assets.py`` (``fetch.main``) must end with exit code 2 and one
    ``fetch_assets: error: ...`` line naming the corrupt archive when a cached download is
    damaged; ``ensure_assets`` documents "Raises AssetError naming the package or asset".

    ``_find_archive`` reuses any non-empty file in ``downloads/``; the first read of the
    llama.cpp sdist (``_extract_llamacpp``) then raises gzip's bare ``EOFError``, which neither
    ``Archive`` nor ``ensure_assets`` translates, so ``main`` (which catches only
    ``XDistillError``) dies with a traceback."""
    from xdistill.assets import fetch

    root = tmp_path / "asset root"
    downloads = root / "downloads"
    downloads.mkdir(parents=True)
    raw = _tar_gz(os.urandom(100_000))
    for key, pkg in fetch.PACKAGES.items():
        name = f"{pkg.stem}.tar.gz" if pkg.sdist else f"{pkg.stem}-py3-none-any.whl"
        (downloads / name).write_bytes(raw[: len(raw) // 2] if key == "llamacpp" else b"x")
    try:
        rc = fetch.main(["--dir", str(root), "--no-models", "-q"])
    except Exception as exc:  # noqa: BLE001 - the defect: an untranslated exception
        pytest.fail(f"fetch_assets raised {type(exc).__name__}: {exc}")
    assert rc == 2
    assert "llama_cpp_python-0.3.36.tar.gz" in capsys.readouterr().err


def test_loading_an_export_with_damaged_weights_names_the_folder(tmp_path):
    """``load_causal_lm`` must turn a failed load into an :class:`XDistillError` naming the
    folder (as it does for a missing folder, a missing/invalid config.json and, for a
    ``.gguf``, for ``RuntimeError``s too).

    It catches only ``OSError``/``ValueError`` around ``from_pretrained``; a truncated or
    garbage ``model.safetensors`` (an interrupted copy of an exported student) raises
    safetensors' ``SafetensorError`` ("Error while deserializing header: incomplete metadata,
    file not fully covered"), which names neither the file nor the folder."""
    out = export_hf(build_causal_lm("llama", TINY_LLAMA), tmp_path / "my export")
    weights = out / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(XDistillError, match="my export"):
        load_causal_lm(out)


def test_cpu_offload_is_not_silently_ignored_on_one_process():
    """``student.cpu_offload: true`` must either take effect or be refused with a
    :class:`ConfigError` naming the key -- as ``_policies`` refuses it on a CPU mesh ("CPU
    offload needs CUDA devices ... set cpu_offload: false").

    ``parallelize_student`` returns before ``_policies`` when no process group runs (one plain
    process, the common single-GPU or CPU run), so the setting is accepted and dropped: on a
    CPU it is not refused as it is under torchrun, and on one GPU the user who asked for CPU
    offload to fit the model gets the whole model and optimizer state in GPU memory."""
    from xdistill.errors import ConfigError
    from xdistill.student.config import StudentConfig
    from xdistill.student.parallelize import parallelize_student

    cfg = StudentConfig(model_type="llama", model_config=TINY_LLAMA, cpu_offload=True,
                        param_dtype="")
    with pytest.raises(ConfigError, match="cpu_offload"):
        parallelize_student(build_causal_lm("llama", TINY_LLAMA), None, cfg, device="cpu")


def test_export_onto_an_existing_file_is_one_clear_error(tmp_path):
    """Exporting to a path that is a file is an XDistillError naming it (not a bare
    NotADirectoryError from listing the folder), and the file is left as it was."""
    target = tmp_path / "model"
    target.write_text("keep me")
    with pytest.raises(XDistillError, match="is a file, not a folder"):
        export_hf(build_causal_lm("llama", TINY_LLAMA), target)
    assert target.read_text() == "keep me"


def test_demo_scores_a_bf16_computing_arm_with_its_float32_master_weights(monkeypatch):
    """The real-pair demo scores the stock student in float32; an arm trained under
    ``dtype: auto`` on a bf16 CPU computes in bf16 through the shadow mixed precision. Its
    held-out bits per byte must be taken with the float32 master weights too, or the "change"
    column mixes training with precision. (The scorer is replaced by a probe: it records the
    dtype the model computes in while it is scored.)"""
    from xdistill.demo import real_pair
    from xdistill.student.mixed import apply_shadow_mixed_precision

    model = build_causal_lm("llama", TINY_LLAMA)
    apply_shadow_mixed_precision(model, torch.bfloat16)
    seen = []

    def probe(m, *args, **kwargs):
        with torch.no_grad():
            seen.append(m(torch.tensor([[1, 2, 3]])).logits.dtype)
        return {"bpb": 1.0}

    monkeypatch.setattr(real_pair, "model_bits_per_byte", probe)

    class _Progress:
        advance = None

    real_pair.held_out_bpb(model, None, {"heldout": "x"}, 1, False, _Progress())
    assert seen == [torch.float32]
    probe(model)                                          # bf16 again after scoring
    assert seen[-1] == torch.bfloat16
