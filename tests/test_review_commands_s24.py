"""Review (s24) of the user-facing subcommands (``xdistill.commands``) and ``data prepare`` inputs.

Checked and found correct (no test here, or a marked passing check):

* ``data prepare``: an empty file / an all-blank input (one-line error naming the file), blank and
  whitespace-only rows (skipped and counted), non-UTF-8 text / text-lines / jsonl (error names
  file and line, ``--invalid-utf8 replace`` substitutes), jsonl rows of the wrong type (list text,
  dict messages, null values, missing keys: each names file, line and key), a parquet file without
  the column (names the columns found), a parquet chat column of JSON strings, corrupt parquet /
  arrow inputs, an output that is a file or another dataset without ``--overwrite``, a failed
  ``--overwrite`` over another *dataset* (the old dataset stays intact), ``--max-doc-mb -1``.
  Unknown chat roles are stored by prepare and reported by ``info --verify`` (documented).
* ``data info --verify``: 300 random single-byte corruptions of a shard never raised anything but
  a one-line DataError (no traceback, no crash); a changed byte of text that stays valid UTF-8 is
  undetectable without checksums (not claimed by the docs).
* ``eval --model``: bpb = sum NLL / (ln 2 * bytes of the predicted tokens); the first token (or
  BOS) is not a target; a text shorter than one window is scored (the final partial window is
  yielded); seq_len/batch < 1 are one-line errors.
* ``tokenizers compare`` / ``align show``: special-token strings inside the text, empty text, a lone
  surrogate (one-line error), an unknown tokenizer.
* ``config show``: every field of both config kinds has its doc; the printed YAML of the defaults
  and of every config in configs/ loads back to the same config.

Defects, one failing test each:

1. ``test_interrupted_overwrite_leaves_a_mixed_dataset_that_looks_valid``: ``_install`` renames the
   new shards over the old ones *before* replacing index.json; a run interrupted in between leaves
   new shard 0 + old shard 1 under the old index; ``data info``, ``info --verify`` and a rerun of
   the old command ("up to date") all accept the mixed data.
2. ``test_failed_overwrite_of_a_file_keeps_the_file``: ``--overwrite`` onto a file unlinks it
   before the inputs are read; a bad input then fails and the file is gone (an empty folder).
3. ``test_data_info_on_a_foreign_index_json_is_one_line_error``: an ``index.json`` that is valid
   JSON but not a prepared index (``{}``, a list, a shard without ``file``) -> KeyError /
   AttributeError traceback instead of ``xdistill: error: ...``.
4. ``test_negative_or_nan_shard_mb_is_an_error``: ``--shard-mb -1`` is clamped to 1 byte and writes
   one shard per document silently; ``--shard-mb nan`` / ``--max-doc-mb nan`` raise ValueError.
5. ``test_same_inputs_spelled_otherwise_are_prepared_again_in_place``: the output check compares the
   *spelling* of input paths (``str(path)``), not the files; the same changed file given as an
   absolute then a relative path is refused as "other inputs".
6. ``test_eval_over_zero_bytes_is_an_error_not_bpb_zero``: ``eval --batches 0`` reports
   ``bpb 0.0 over 0 bytes`` with exit 0 (a perfect score for nothing scored).
7. ``test_plot_record_without_step_is_one_line_error`` / ``test_plot_non_object_record`` /
   ``test_plot_non_utf8_metrics``: plot raises KeyError / TypeError / AttributeError /
   UnicodeDecodeError tracebacks on such metrics files.
8. ``test_plot_reports_the_file_it_wrote``: ``-o curves`` writes ``curves.png`` (matplotlib adds
   the suffix) but prints ``wrote curves``; ``-o curves.txt`` is a ValueError traceback.
9. ``test_demo_tokenizers_with_fewer_than_two_names_is_an_error``: ``demo tokenizers --names gpt2``
   prints an empty table and exits 0.
10. ``test_eval_of_a_model_shows_progress``: ``eval --model`` never passes the progress hook of
    ``model_bits_per_byte``; scoring a real model on CPU is minutes of silence.
11. ``test_a_utf8_bom_is_not_document_text``: a UTF-8 BOM makes a jsonl file invalid JSON and
    stays as U+FEFF at the start of a text / text-lines document.
"""

from __future__ import annotations

import importlib
import json
import math
import os

import pytest

from xdistill.cli import main as cli_main

prepare_module = importlib.import_module("xdistill.data.prepare")


def _one_line_error(capsys, rc, *needles):
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("xdistill: error: "), err
    for needle in needles:
        assert needle in err[0], err[0]
    return err[0]


def _run(argv):
    """cli_main, turning an escaped exception into a failing assertion naming it."""
    try:
        return cli_main(argv)
    except SystemExit as exc:   # argparse
        return exc.code
    except BaseException as exc:  # noqa: BLE001 - a traceback is the defect under test
        pytest.fail(f"{' '.join(argv[:2])}: traceback {type(exc).__name__}: {exc}")


# ---------------------------------------------------------------------------- data prepare
def test_interrupted_overwrite_leaves_a_mixed_dataset_that_looks_valid(tmp_path, monkeypatch, capsys):
    old, new, out = tmp_path / "old.jsonl", tmp_path / "new.jsonl", tmp_path / "out"
    old.write_text('{"text": "old one"}\n{"text": "old two"}\n')
    new.write_text('{"text": "NEW one"}\n{"text": "NEW two"}\n')
    tiny = ["--shard-mb", "0.000001", "-q"]          # one document per shard
    assert cli_main(["data", "prepare", str(old), "-o", str(out)] + tiny) == 0

    real, calls = os.replace, []

    def interrupted_replace(a, b):
        calls.append(a)
        if len(calls) == 2:                            # Ctrl-C after the first shard's rename
            raise KeyboardInterrupt
        return real(a, b)

    monkeypatch.setattr(prepare_module.os, "replace", interrupted_replace)
    with pytest.raises(KeyboardInterrupt):
        cli_main(["data", "prepare", str(new), "-o", str(out), "--overwrite"] + tiny)
    monkeypatch.setattr(prepare_module.os, "replace", real)
    capsys.readouterr()

    from xdistill.data.source import DocumentSource
    from xdistill.errors import DataError

    # the folder must not present a mix of two datasets as one: training's reader, info and
    # info --verify all refuse it, and running the prepare again finishes the job
    with pytest.raises(DataError, match="stopped before it finished"):
        DocumentSource(str(out))
    assert cli_main(["data", "info", str(out)]) == 2
    assert cli_main(["data", "info", "--verify", "-q", str(out)]) == 2
    assert cli_main(["data", "prepare", str(new), "-o", str(out), "--overwrite"] + tiny) == 0
    src = DocumentSource(str(out))
    assert [src.get(i) for i in range(len(src))] == ["NEW one", "NEW two"]


def test_failed_overwrite_of_a_file_keeps_the_file(tmp_path, capsys):
    precious = tmp_path / "notes"
    precious.write_text("precious contents")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "no text key"}\n')
    rc = cli_main(["data", "prepare", str(bad), "-o", str(precious), "--overwrite", "-q"])
    _one_line_error(capsys, rc, str(bad))
    # nothing lost on bad input: the file is replaced only once there is something to put there
    assert precious.is_file() and precious.read_text() == "precious contents"


@pytest.mark.parametrize("index", ["{}", "[1, 2]", '{"documents": 1, "bytes": 1, "shards": [{"x": 1}]}'])
@pytest.mark.parametrize("verify", [False, True])
def test_data_info_on_a_foreign_index_json_is_one_line_error(tmp_path, capsys, index, verify):
    (tmp_path / "index.json").write_text(index)
    rc = _run(["data", "info", str(tmp_path)] + (["--verify", "-q"] if verify else []))
    _one_line_error(capsys, rc, "index.json")


@pytest.mark.parametrize("option", [["--shard-mb", "-1"], ["--shard-mb", "nan"],
                                    ["--max-doc-mb", "nan"]])
def test_negative_or_nan_shard_mb_is_an_error(tmp_path, capsys, option):
    src = tmp_path / "a.jsonl"
    src.write_text('{"text": "one"}\n{"text": "two"}\n')
    rc = _run(["data", "prepare", str(src), "-o", str(tmp_path / "out"), "-q"] + option)
    # like --max-doc-mb -1 (refused): a size that is not a positive number is a usage error
    _one_line_error(capsys, rc, option[0].lstrip("-").replace("-", "_").split("_")[0])


def test_same_inputs_spelled_otherwise_are_prepared_again_in_place(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    src, out = tmp_path / "a.jsonl", tmp_path / "out"
    src.write_text('{"text": "first version"}\n')
    assert cli_main(["data", "prepare", str(src.resolve()), "-o", str(out), "-q"]) == 0
    src.write_text('{"text": "second version"}\n')          # the same file, changed
    os.utime(src, ns=(1, 10**18))
    capsys.readouterr()
    rc = cli_main(["data", "prepare", "a.jsonl", "-o", str(out), "-q"])
    # documented: "The same inputs, changed or with other options, are prepared again in place"
    assert rc == 0, capsys.readouterr().err


# ---------------------------------------------------------------------------- eval
@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    import xdistill.tiny as mk

    root = tmp_path_factory.mktemp("tiny_lm")
    tok = mk.train_bpe(root / "tok", 320, mk.passages(limit=60))
    model = mk.save_tiny_lm(root / "lm", str(tok), seed=1)
    data = root / "text.jsonl"
    data.write_text('{"text": "Hello there, a short held-out text."}\n')
    assert cli_main(["data", "prepare", str(data), "-o", str(root / "data"), "-q"]) == 0
    return str(model), str(root / "data")


def test_eval_over_zero_bytes_is_an_error_not_bpb_zero(tiny_lm, capsys):
    model, data = tiny_lm
    capsys.readouterr()
    rc = _run(["eval", "--model", model, "--data", data, "--batches", "0"])
    out = capsys.readouterr()
    if rc == 0:
        result = json.loads(out.out)
        # bits per byte over no bytes is undefined; 0.0 reads as a perfect model
        assert result["bytes"] > 0 and not math.isclose(result["bpb"], 0.0), result
    else:
        assert rc == 2 and out.err.strip().startswith("xdistill: error: ")


# ---------------------------------------------------------------------------- plot
@pytest.fixture
def mpl():
    return pytest.importorskip("matplotlib")


@pytest.mark.parametrize("line", ['{"loss": 1.5}', '{"step": null, "loss": 1.5}'])
def test_plot_record_without_step_is_one_line_error(mpl, tmp_path, capsys, line):
    metrics = tmp_path / "m.jsonl"
    metrics.write_text('{"step": 1, "loss": 2.0}\n' + line + "\n")
    rc = _run(["plot", str(metrics), "-o", str(tmp_path / "c.png")])
    _one_line_error(capsys, rc, str(metrics))


def test_plot_non_object_record(mpl, tmp_path, capsys):
    metrics = tmp_path / "m.jsonl"
    metrics.write_text('{"step": 1, "loss": 2.0}\n[1, 2]\n')
    rc = _run(["plot", str(metrics), "-o", str(tmp_path / "c.png")])
    _one_line_error(capsys, rc, str(metrics))


def test_plot_non_utf8_metrics(mpl, tmp_path, capsys):
    metrics = tmp_path / "m.jsonl"
    metrics.write_bytes(b'{"step": 1, "loss": 2.0}\n{"step": 2, "loss": "\xff"}\n')
    rc = _run(["plot", str(metrics), "-o", str(tmp_path / "c.png")])
    _one_line_error(capsys, rc, str(metrics))


def test_plot_reports_the_file_it_wrote(mpl, tmp_path, capsys):
    metrics = tmp_path / "m.jsonl"
    metrics.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.0}\n')
    target = tmp_path / "curves"
    assert cli_main(["plot", str(metrics), "-o", str(target)]) == 0
    said = capsys.readouterr().out
    # the message must name the file that exists (matplotlib wrote curves.png)
    written = [p.name for p in tmp_path.iterdir() if p.name.startswith("curves")]
    assert target.exists() or f"wrote {target}.png" in said, (said, written)
    rc = _run(["plot", str(metrics), "-o", str(tmp_path / "curves.txt")])
    _one_line_error(capsys, rc, "curves.txt")


# ---------------------------------------------------------------------------- demo
def test_demo_tokenizers_with_fewer_than_two_names_is_an_error(capsys):
    rc = _run(["demo", "tokenizers", "--names", "gpt2"])
    out = capsys.readouterr()
    # one name has no pair to compare: the table is empty and the run says nothing about it
    assert rc == 2 and "--names" in out.err, out.out[-300:]


# ---------------------------------------------------------------------------- added checks
def test_eval_of_a_model_shows_progress(tiny_lm, monkeypatch, capsys):
    """Long work shows progress: ``eval --model`` scores ``--batches`` batches (a 270M model on
    CPU: minutes) without passing the progress hook ``model_bits_per_byte`` has (the demo passes
    it); nothing is printed until the end."""
    evaluate = importlib.import_module("xdistill.train.evaluate")
    seen = {}
    real = evaluate.model_bits_per_byte

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluate, "model_bits_per_byte", spy)
    model, data = tiny_lm
    assert cli_main(["eval", "--model", model, "--data", data, "--batches", "2"]) == 0
    assert seen.get("progress") is not None, "eval --model reports no progress while scoring"


@pytest.mark.parametrize("fmt,suffix", [("jsonl", ".jsonl"), ("text", ".txt"),
                                        ("text-lines", ".txt")])
def test_a_utf8_bom_is_not_document_text(tmp_path, capsys, fmt, suffix):
    """A UTF-8 byte-order mark (Notepad, Excel/pandas ``utf-8-sig`` exports) is an encoding
    signature: a jsonl file starting with one is refused ("invalid JSON: Unexpected UTF-8 BOM"),
    and a text file's first document starts with U+FEFF, which training then tokenizes."""
    from xdistill.data.source import DocumentSource

    body = '{"text": "hello"}\n' if fmt == "jsonl" else "hello\n"
    src = tmp_path / ("in" + suffix)
    src.write_bytes(b"\xef\xbb\xbf" + body.encode())
    rc = cli_main(["data", "prepare", str(src), "--format", fmt, "-o", str(tmp_path / "out"), "-q"])
    assert rc == 0, capsys.readouterr().err
    first = DocumentSource(str(tmp_path / "out")).get(0)
    assert not first.startswith("\ufeff"), repr(first)


def test_a_file_added_to_an_input_folder_is_prepared_again_in_place(tmp_path, capsys):
    """The same input folder with one more file: the same inputs, prepared again in place
    (it was refused as 'a dataset prepared from other inputs'); a relative spelling of it too."""
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (src / "a.jsonl").write_text('{"text": "one"}\n')
    assert _run(["data", "prepare", str(src), "-o", str(out), "-q"]) == 0
    (src / "b.jsonl").write_text('{"text": "two"}\n')
    assert _run(["data", "prepare", str(src), "-o", str(out), "-q"]) == 0, capsys.readouterr().err
    index = json.loads((out / "index.json").read_text())
    assert index["documents"] == 2 and len(index["sources"]) == 2
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        assert _run(["data", "prepare", "src", "-o", "out", "-q"]) == 0
    finally:
        os.chdir(cwd)
    assert "up to date" in capsys.readouterr().out


@pytest.mark.parametrize("argv, option, other", [
    (["demo", "distill", "--names", "gpt2,qwen2"], "--names", "tokenizers"),
    (["demo", "tokenizers", "--steps", "5"], "--steps", "distill"),
    (["demo", "--out", "x"], "--out", "distill")])        # `which` defaults to tokenizers
def test_demo_option_of_the_other_demo_is_an_error_not_ignored(capsys, argv, option, other):
    rc = _run(argv)
    err = capsys.readouterr().err
    assert rc == 2 and f"{option} applies to `xdistill demo {other}`" in err, err[-500:]
