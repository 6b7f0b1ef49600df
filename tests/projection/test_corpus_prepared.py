"""``xdistill projection build --corpus DIR`` takes an ``xdistill data prepare`` output folder, and
a wrong corpus path fails at once (before the tokenizers load), naming the path."""

from __future__ import annotations

import json
import time

import pytest

from xdistill.cli import main as cli_main
from xdistill.errors import ProjectionError
from xdistill.projection import load_projection
from xdistill.projection.corpus import iter_corpus_texts, resolve_corpus_files

TEXTS = ["The ships sailed at dawn, 1,274 of them.", "A second document: numbers 42 and 7.",
         "Third text with unicode: café, naïve, 日本."]


@pytest.fixture()
def prepared(tmp_path):
    src = tmp_path / "docs.jsonl"
    chat = {"messages": [{"role": "user", "content": "What is 12 + 30?"},
                         {"role": "assistant", "content": "12 + 30 = 42."}]}
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS) + json.dumps(chat) + "\n")
    out = tmp_path / "prepared"
    assert cli_main(["data", "prepare", str(src), "-o", str(out)]) == 0
    assert (out / "index.json").is_file()
    return out


def test_prepared_folder_is_read_through_its_index(prepared):
    shards = resolve_corpus_files([prepared])
    assert shards and all(p.suffix == ".arrow" and p.parent == prepared for p in shards)
    assert list(iter_corpus_texts([prepared])) == TEXTS + ["What is 12 + 30?", "12 + 30 = 42."]


def test_cli_build_with_a_prepared_folder(prepared, tmp_path, get_tokenizer):
    get_tokenizer("gpt2")      # the assets exist (a clear error otherwise)
    out = tmp_path / "proj.npz"
    rc = cli_main(["projection", "build", "--student", "gpt2", "--teacher", "mistral",
                   "--method", "corpus,exact", "--corpus", str(prepared), "-o", str(out), "-q"])
    assert rc == 0
    proj = load_projection(out, get_tokenizer("gpt2"), get_tokenizer("mistral"))
    assert proj.meta["coverage"]["rows"]["corpus"] > 0
    assert proj.meta["params"]["corpus_files"] == [str(prepared)]


@pytest.mark.parametrize("kind", ["missing", "plain-folder"])
def test_bad_corpus_path_fails_fast_naming_it(tmp_path, capsys, kind):
    path = tmp_path / ("nope" if kind == "missing" else "folder")
    if kind == "plain-folder":
        path.mkdir()
    t0 = time.perf_counter()
    rc = cli_main(["projection", "build", "--student", "gemma3-270m", "--teacher", "qwen2",
                   "--method", "corpus,exact", "--corpus", str(path), "-o", str(tmp_path / "p.npz")])
    elapsed = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert rc == 2 and str(path) in err and err.startswith("xdistill: error: corpus path")
    assert ("does not exist" if kind == "missing" else "without index.json") in err
    assert elapsed < 2.0, elapsed            # no tokenizer was loaded
    with pytest.raises(ProjectionError, match="needs a corpus"):
        from xdistill.commands.projection import main
        main(["build", "--student", "gpt2", "--teacher", "qwen2", "--method", "corpus",
              "-o", str(tmp_path / "p.npz")])


def test_chunk_starts_use_per_token_phantoms(get_tokenizer):
    """Legacy SentencePiece (Phi-3) puts a phantom space after an in-text special token; with
    only the row's phantom prefix the aligner saw an extra space there and lost the
    ("General", "▁General") chunk."""
    from xdistill.projection.corpus import chunk_start_pairs

    s, t = get_tokenizer("gpt2"), get_tokenizer("phi3")
    keys = chunk_start_pairs(s, t, ["Hello there<|endoftext|>General Kenobi"])
    pairs = [(s.hf.convert_ids_to_tokens(int(k // t.vocab_size)),
              t.hf.convert_ids_to_tokens(int(k % t.vocab_size))) for k in keys]
    assert pairs == [("Hello", "▁Hello"), ("Ġthere", "▁there"), ("<|endoftext|>", "<|endoftext|>"),
                     ("General", "▁General"), ("ĠKenobi", "▁Ken")]
