"""`xdistill projection build|inspect` end to end, the audit categories and the plot."""

from __future__ import annotations

import json

import numpy as np
import pytest

from xdistill.cli import main as cli_main
from xdistill.commands.projection import main
from xdistill.projection import load_projection
from xdistill.projection.audit import (
    CATEGORIES, categorize, coverage_table, entropy_histogram, row_entropy_bits, show_bytes)
from xdistill.tokenization.table import ROLE_EOS


@pytest.mark.parametrize("data,expect", [
    (b" 123", "numeral"), (b"\xe4\xb8", "byte"), (b"\x00", "byte"), (b"  ", "whitespace"),
    (b"\n", "whitespace"), (b"),", "punct"), (b" hello", "word"), ("中".encode(), "non-ascii"),
    (b"__init__", "code"), (b"    return", "code"), (b"==", "code"), (b"", "special")])
def test_categories(data, expect):
    assert categorize(data, 0) == expect
    assert categorize(b"", ROLE_EOS) == "special"


def test_show_bytes_escapes():
    assert show_bytes(b" hi\n") == "' hi\\n'"
    assert show_bytes(b"\xe4\xb8") == "'\\xe4\\xb8'"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("proj") / "new" / "folder" / "m2b.npz"   # made by the build
    rc = main(["build", "--student", "mistral", "--teacher", "bert", "--method", "multitoken,exact",
               "--top-k", "3", "--multitoken-decay", "0.2", "-o", str(out), "-q"])
    assert rc == 0
    return out


def test_build_writes_artifact_and_sidecar(built, capsys, get_tokenizer):
    meta = json.loads(built.with_suffix(".json").read_text())
    assert meta["methods"] == ["multitoken", "exact"] and meta["top_k"] == 3
    assert meta["params"]["multitoken_decay"] == 0.2
    assert meta["student"]["name"] == "mistral" and meta["teacher"]["vocab_size"] == 30522
    proj = load_projection(built, get_tokenizer("mistral"), get_tokenizer("bert"))
    assert np.diff(proj.proj_VsVt.indptr).max() <= 3


def test_inspect_report_and_plot(built, capsys, tmp_path, get_tokenizer):
    png = tmp_path / "m2b.png"
    assert main(["inspect", str(built), "--student", "mistral", "--teacher", "bert",
                 "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    for word in ("coverage by student-token category", "numeral", "byte", "example rows:",
                 "row entropy (bits", "0 (one-hot)", "[multitoken]", "[exact]", "[role]"):
        assert word in out, word
    assert png.stat().st_size > 20_000 and png.read_bytes()[:4] == b"\x89PNG"
    proj = load_projection(built)
    cov = coverage_table(proj, np.zeros(proj.shape[0], np.int8))
    assert cov[CATEGORIES[0]]["total"] == proj.shape[0]
    ent = row_entropy_bits(proj)
    assert np.nanmax(ent) <= np.log2(3) + 1e-6 and np.isnan(ent[proj.row_source_Vs == 0]).all()
    assert len(entropy_histogram(ent, 3)) >= 3


def test_inspect_with_wrong_tokenizers_is_a_one_line_error(built, capsys):
    rc = cli_main(["projection", "inspect", str(built), "--student", "gpt2", "--teacher", "bert"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert "'mistral'" in err and "'gpt2'" in err and "rebuild" in err


def test_bad_method_and_output(capsys, tmp_path):
    rc = cli_main(["projection", "build", "--student", "gpt2", "--teacher", "bert",
                   "--method", "exact,magic", "-o", str(tmp_path / "x.npz")])
    assert rc == 2 and "unknown projection method 'magic'" in capsys.readouterr().err
    rc = cli_main(["projection", "build", "--student", "gpt2", "--teacher", "bert", "-o", "x.bin"])
    assert rc == 2 and "must end in .npz" in capsys.readouterr().err


def test_output_folder_is_checked_before_the_build(capsys, tmp_path):
    """A folder that cannot be made fails at once, naming it (not after minutes of building)."""
    import time

    (tmp_path / "a_file").write_text("")
    t0 = time.perf_counter()
    rc = cli_main(["projection", "build", "--student", "gpt2", "--teacher", "qwen2",
                   "-o", str(tmp_path / "a_file" / "sub" / "p.npz")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert f"cannot create its folder '{tmp_path / 'a_file' / 'sub'}'" in err
    assert time.perf_counter() - t0 < 5                  # no tokenizer was loaded


@pytest.mark.parametrize("flag,value,want", [
    ("--multitoken-decay", "nan", ">= 0"), ("--multitoken-decay", "-1", ">= 0"),
    ("--reverse-weight", "-5", ">= 0"), ("--top-k", "0", ">= 1"),
    ("--corpus-max-texts", "-1", ">= 0 (0 = all)")])
def test_out_of_range_build_options_fail_before_the_build(capsys, tmp_path, flag, value, want):
    """A NaN decay or a negative reverse weight silently unmapped rows, a negative text limit read
    one text, and --top-k 0 failed only after the whole build: now one line, before any work."""
    rc = cli_main(["projection", "build", "--student", "gpt2", "--teacher", "bert", flag, value,
                   "-o", str(tmp_path / "p.npz")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and f"{flag} must be {want}, got" in err, err
    assert not (tmp_path / "p.npz").exists()


def test_inspect_with_negative_examples_is_one_line(built, capsys):
    rc = cli_main(["projection", "inspect", str(built), "--student", "mistral", "--teacher",
                   "bert", "--examples", "-1"])
    err = capsys.readouterr().err
    assert rc == 2 and "--examples must be >= 0, got -1" in err and err.count("\n") == 1


def test_build_does_not_replace_files_that_are_not_a_projection(built, capsys, tmp_path):
    """``-o results.npz`` wrote ``results.json`` over whatever was there (a user's own results).
    A sidecar that is not an xdistill sidecar, or an .npz without one, is refused before any work,
    naming the file and --overwrite; a previous projection at the same path is replaced."""
    import shutil

    side = tmp_path / "results.json"
    side.write_text('{"accuracy": 0.91}\n')
    argv = ["projection", "build", "--student", "mistral", "--teacher", "bert", "--top-k", "3",
            "-q", "-o", str(tmp_path / "results.npz")]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"'{side}' exists and is not an xdistill projection" in err
    assert "--overwrite" in err and side.read_text() == '{"accuracy": 0.91}\n'
    assert not (tmp_path / "results.npz").exists()
    lone = tmp_path / "lone.npz"
    lone.write_bytes(b"PK not a projection")
    assert cli_main(argv[:-1] + [str(lone)]) == 2
    assert "has no projection sidecar" in capsys.readouterr().err
    assert lone.read_bytes() == b"PK not a projection"
    again = tmp_path / "again.npz"                       # a previous projection is replaced
    shutil.copy(built, again)
    shutil.copy(built.with_suffix(".json"), again.with_suffix(".json"))
    assert cli_main(argv[:-1] + [str(again)]) == 0
    assert load_projection(again).meta["top_k"] == 3
    assert cli_main(argv + ["--overwrite"]) == 0         # the user asked for it
    assert json.loads(side.read_text())["format"] == "xdistill-projection"
