"""Every way to load a tokenizer, fingerprints, and bad input (one-line errors, CLI exit 2)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest

from tok_helpers import ALL_ASSETS, CORPUS
from xdistill.assets import asset_dir
from xdistill.errors import TokenizerError
from xdistill.tokenization import load_tokenizer


def _same_ids(a, b, texts=CORPUS):
    return all(a.encode(t).ids.tolist() == b.encode(t).ids.tolist() for t in texts)


def test_tiktoken_file_matches_asset(get_tokenizer):
    tok = load_tokenizer(asset_dir() / "raw" / "gpt2.tiktoken")
    asset = get_tokenizer("gpt2")
    assert tok.family == "byte_bpe" and tok.vocab_size == 50257 and _same_ids(tok, asset)
    assert tok.fingerprint == asset.fingerprint          # same tokenizer by another route


def test_tiktoken_format_model_file_is_detected(get_tokenizer, tmp_path):
    """A ``tokenizer.model`` may be a tiktoken rank file (Llama-3's is), not a SentencePiece
    protobuf: it is recognised by its content."""
    shutil.copy(asset_dir() / "raw" / "gpt2.tiktoken", tmp_path / "tokenizer.model")
    tok = load_tokenizer(tmp_path / "tokenizer.model")
    assert tok.vocab_size == 50257 and _same_ids(tok, get_tokenizer("gpt2"), CORPUS[:4])


def test_sentencepiece_model_file(get_tokenizer):
    tok = load_tokenizer(asset_dir() / "raw" / "mistral.model")
    assert tok.family == "spm" and tok.vocab_size == 32000
    assert _same_ids(tok, get_tokenizer("mistral"))


def test_sentencepiece_library_agrees_on_simple_text(get_tokenizer):
    """The converted Mistral tokenizer gives the sentencepiece library's ids, except on runs of
    spaces (known difference, see benchmarks/results/tokenization.md)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(asset_dir() / "raw" / "mistral.model"))
    tok = get_tokenizer("mistral")
    for text in ("Hello world.", "The quick brown fox, 3.14 and 日本語 😀!", "a\nb\tc"):
        assert tok.encode(text).ids.tolist() == sp.encode(text)


def test_gguf_file(get_tokenizer):
    tok = load_tokenizer(asset_dir() / "gguf" / "ggml-vocab-gpt-2.gguf")
    assert tok.family == "byte_bpe" and _same_ids(tok, get_tokenizer("gpt2"), CORPUS[:6])


@pytest.mark.slow
def test_gguf_folder(get_tokenizer, tmp_path):
    shutil.copy(asset_dir() / "gguf" / "ggml-vocab-phi-3.gguf", tmp_path / "vocab.gguf")
    tok = load_tokenizer(tmp_path)
    assert tok.family == "spm" and tok.fingerprint == get_tokenizer("phi3").fingerprint


def test_tokenizer_json_file(get_tokenizer):
    bert = get_tokenizer("bert")
    tok = load_tokenizer(asset_dir() / "tokenizers" / "bert" / "tokenizer.json")
    assert tok.family == "wordpiece" and tok.lossy and _same_ids(tok, bert)


# --------------------------------------------------------------------------- fingerprints

FP_NAMES = ("gpt2", "mistral", "bert", "phi3")   # the smaller ones: a fresh process loads them
FP_SCRIPT = """
import json, os
os.environ["HF_HUB_OFFLINE"] = "1"
from xdistill.tokenization import load_tokenizer
print(json.dumps({n: load_tokenizer(n).fingerprint for n in %r}))
"""


def test_fingerprints_stable_across_processes_and_distinct(get_tokenizer):
    here = {name: get_tokenizer(name).fingerprint for name in ALL_ASSETS}
    assert len(set(here.values())) == len(ALL_ASSETS)               # pairwise distinct
    assert all(len(fp) == 64 and int(fp, 16) >= 0 for fp in here.values())
    out = subprocess.run([sys.executable, "-c", FP_SCRIPT % (FP_NAMES,)], capture_output=True,
                         text=True, check=True, env={**__import__("os").environ,
                                                     "PYTHONHASHSEED": "12345"})
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {n: here[n] for n in FP_NAMES}


def test_fingerprint_changes_with_any_part(tmp_path, get_tokenizer):
    base = get_tokenizer("gpt2")
    spec = json.loads((asset_dir() / "tokenizers" / "gpt2" / "tokenizer.json").read_text())
    variants = {}
    added = json.loads(json.dumps(spec))
    added["added_tokens"].append({"id": 50257, "content": "<|extra|>", "single_word": False,
                                  "lstrip": False, "rstrip": False, "normalized": False,
                                  "special": True})
    variants["added"] = added
    pre = json.loads(json.dumps(spec))
    pre["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\s+|\S+"
    variants["pre"] = pre
    norm = json.loads(json.dumps(spec))
    norm["normalizer"] = {"type": "NFC"}
    variants["norm"] = norm
    merges = json.loads(json.dumps(spec))
    merges["model"]["merges"] = merges["model"]["merges"][:-1]
    variants["merges"] = merges
    fps = {base.fingerprint}
    for key, variant in variants.items():
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps(variant))
        fps.add(load_tokenizer(path).fingerprint)
    assert len(fps) == 1 + len(variants)


# --------------------------------------------------------------------------- bad input


def _cli_error(capsys, spec) -> str:
    from xdistill.cli import main

    assert main(["tokenizers", "inspect", str(spec)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("xdistill: error: ")
    return err


def test_unknown_name_fails_fast_offline(capsys):
    t0 = time.perf_counter()
    with pytest.raises(TokenizerError, match="HF_HUB_OFFLINE"):
        load_tokenizer("some-org/no-such-tokenizer")
    assert time.perf_counter() - t0 < 1.0
    assert "no-such-tokenizer" in _cli_error(capsys, "some-org/no-such-tokenizer")


def test_missing_path(tmp_path, capsys):
    missing = tmp_path / "nope" / "tokenizer.json"
    with pytest.raises(TokenizerError, match="does not exist"):
        load_tokenizer(missing)
    assert str(missing) in _cli_error(capsys, missing)


def test_missing_asset_names_the_fetch_tool(tmp_path, monkeypatch):
    monkeypatch.setenv("XDISTILL_ASSETS", str(tmp_path))
    with pytest.raises(TokenizerError, match="fetch_assets"):
        load_tokenizer("gpt2")


@pytest.mark.parametrize("fname,content", [
    ("tokenizer.json", b"{not json"),
    ("tokenizer.json", b'{"model": {"type": "BPE"}}'),
    ("broken.model", b"\x00\x01garbage protobuf"),
    ("broken.gguf", b"GGUF\x03\x00\x00\x00garbage"),
    ("broken.tiktoken", b"not base64 at all\n"),
    ("weird.bin", b"1234"),
])
def test_corrupt_files(tmp_path, capsys, fname, content):
    path = tmp_path / fname
    path.write_bytes(content)
    with pytest.raises(TokenizerError) as info:
        load_tokenizer(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    assert str(path) in _cli_error(capsys, path)


def test_truncated_gguf_and_corrupt_folder(tmp_path, capsys):
    data = (asset_dir() / "gguf" / "ggml-vocab-gpt-2.gguf").read_bytes()
    (tmp_path / "t.gguf").write_bytes(data[:5000])
    with pytest.raises(TokenizerError, match="t.gguf"):
        load_tokenizer(tmp_path / "t.gguf")
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        load_tokenizer(folder)
    (folder / "tokenizer.json").write_text("[]")
    assert str(folder) in _cli_error(capsys, folder)
