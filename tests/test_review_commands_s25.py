"""Review s25 (commands, eval, metrics): each test demonstrates a defect and FAILS on the reviewed code."""

from __future__ import annotations

import json
import math
import re

import pytest
from test_review_cli_s23 import tiny_run_config
from test_review_commands_s24 import _run   # cli main; a traceback fails the test

from xdistill.cli import main as cli_main

DOCS = ["Hello there, a short held-out text.", "Second document here.", "Third one, café crème."]


def _one_line_error(capsys, rc, *needles):
    err = [line for line in capsys.readouterr().err.strip().splitlines()
           if line.startswith("xdistill: error: ")]
    assert rc == 2, rc
    assert len(err) == 1, err
    for needle in needles:
        assert needle in err[0], err[0]
    return err[0]


@pytest.fixture(scope="module")
def spm_lm(tmp_path_factory):
    """A random tiny Llama over the Mistral (SentencePiece, dummy-prefix) vocabulary, and a
    prepared dataset of three short documents."""
    import xdistill.tiny as mk

    root = tmp_path_factory.mktemp("spm_lm")
    model = mk.save_tiny_lm(root / "lm", "mistral", seed=1)
    src = root / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS), encoding="utf-8")
    assert cli_main(["data", "prepare", str(src), "-o", str(root / "data"), "-q"]) == 0
    return str(model), str(root / "data")


# ---------------------------------------------------------------------------- eval: bits per byte
def test_eval_bpb_divides_by_text_bytes_not_sentencepiece_dummy_prefix_bytes(spm_lm, capsys):
    """Expected: ``eval --model`` bits per byte = total NLL in bits / total UTF-8 bytes of the
    scored text (float64 reference below: one window ``BOS doc1 EOS doc2 EOS doc3 EOS``, every
    document token and EOS scored, so the scored text is the three documents, 80 bytes).

    Actual: the byte count is ``sum(lengths_V[target])``, and a SentencePiece token that opens a
    document (``▁Hello``) is 6 table bytes while the text holds 5 (the dummy-prefix space,
    ``Segment.phantom_T``, is not in the text). Every document adds one phantom byte (83 instead
    of 80), so Mistral / Llama-2 / Phi-3 students and teachers get a bpb that is too low -- not
    comparable across tokenizers, which is the point of bpb. ``evaluate()`` (``eval/bpb`` of a
    run) uses the same ``nll_and_bytes``."""
    import torch

    from xdistill.student.model import load_causal_lm
    from xdistill.tokenization import load_tokenizer

    model_dir, data = spm_lm
    capsys.readouterr()
    assert cli_main(["eval", "--model", model_dir, "--data", data, "--bos", "--seq-len", "256",
                     "--batch", "1", "--batches", "1"]) == 0
    out = json.loads(capsys.readouterr().out)

    tok, model = load_tokenizer(model_dir), load_causal_lm(model_dir)
    row = [tok.bos_id]
    for d in DOCS:
        row += [int(i) for i in tok.encode(d, add_special_tokens=False).ids] + [tok.eos_id]
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([row])).logits[0].double(), -1)
    nll = -sum(float(logp[t - 1, row[t]]) for t in range(1, len(row)))
    text_bytes = sum(len(d.encode("utf-8")) for d in DOCS)
    assert out["tokens"] == len(row) - 1            # the same tokens are scored
    assert out["bytes"] == text_bytes, (out["bytes"], text_bytes)
    assert math.isclose(out["bpb"], nll / (math.log(2) * text_bytes), rel_tol=1e-6)


def test_run_eval_over_zero_scored_bytes_reports_no_bits_per_byte(tmp_path, capsys):
    """Expected: a run's evaluation whose held-out windows score no byte (one one-token document:
    the only target is the EOS, 0 bytes) has no bits per byte: ``eval --config`` fails with one
    line (as ``eval --model`` does on the same data: "no byte was scored") or writes
    ``"eval/bpb": null``.

    Actual: ``eval_figures`` divides by ``max(n_bytes, 1)`` and prints ``"eval/bpb": 8.16,
    "eval/bytes": 0`` with exit 0 -- a total NLL in bits presented as bits per byte (and logged to
    metrics.jsonl as such during training)."""
    import yaml

    cfg = tiny_run_config(tmp_path, tmp_path / "out")
    one = tmp_path / "one.jsonl"
    one.write_text('{"text": "a"}\n')
    assert cli_main(["data", "prepare", str(one), "-o", str(tmp_path / "one"), "-q"]) == 0
    cfg["eval"].update(paths=[str(tmp_path / "one")], batches=1)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    capsys.readouterr()
    rc = _run(["eval", "--config", str(path)])
    if rc == 0:
        out = json.loads(capsys.readouterr().out)
        assert out["eval/bytes"] > 0 or out["eval/bpb"] is None, out
    else:
        _one_line_error(capsys, rc)


def test_eval_with_a_tokenizer_beyond_the_model_vocabulary_is_one_line_error(spm_lm, capsys):
    """Expected: ``eval --model M --tokenizer T`` where T produces ids the model has no embedding
    for (Qwen2's 151,936 ids against a 32,000-row model) is a user error: exit 2 and one line
    naming --tokenizer / the vocabulary sizes.

    Actual: ``IndexError: index out of range in self`` from the embedding lookup (a traceback);
    ``score_model`` never compares the tokenizer with the model."""
    from xdistill.tokenization import load_tokenizer

    model_dir, data = spm_lm
    qwen = load_tokenizer("qwen2")
    assert max(int(i) for d in DOCS for i in qwen.encode(d, add_special_tokens=False).ids) >= 32000
    capsys.readouterr()
    rc = _run(["eval", "--model", model_dir, "--tokenizer", "qwen2", "--data", data,
               "--batches", "1"])
    _one_line_error(capsys, rc, "vocab")


# ---------------------------------------------------------------------------- plot
def test_plot_output_whose_folder_is_a_file_is_one_line_error(tmp_path, capsys):
    """Expected: ``plot -o notes.txt/curves.png`` where ``notes.txt`` is a file: exit 2 and one
    ``xdistill: error:`` line naming the output.

    Actual: ``plot_runs`` calls ``out.parent.mkdir`` (and ``savefig``) unguarded:
    ``FileExistsError`` traceback."""
    pytest.importorskip("matplotlib")
    metrics = tmp_path / "m.jsonl"
    metrics.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.0}\n')
    (tmp_path / "notes.txt").write_text("x")
    rc = _run(["plot", str(metrics), "-o", str(tmp_path / "notes.txt" / "curves.png")])
    _one_line_error(capsys, rc, "notes.txt")


@pytest.mark.parametrize("command", ["plot", "config"])
def test_a_directory_given_for_a_file_is_not_reported_as_missing(tmp_path, capsys, command):
    """Expected: a directory passed where a file is expected (``plot DIR``, ``config show
    offpolicy --config DIR``) is an error that says it is a directory (or not a file).

    Actual: ``read_metrics`` / ``load_config`` test ``is_file()`` and report "metrics file 'DIR'
    does not exist" / "config file 'DIR' does not exist" -- false: it exists, and the user looks
    for a typo in a correct path."""
    folder = tmp_path / "run"
    folder.mkdir()
    argv = (["plot", str(folder), "-o", str(tmp_path / "c.png")] if command == "plot"
            else ["config", "show", "offpolicy", "--config", str(folder)])
    line = _one_line_error(capsys, _run(argv), str(folder))
    assert "does not exist" not in line, line


# ---------------------------------------------------------------------------- config show
def test_config_show_of_a_non_utf8_file_is_one_line_error(tmp_path, capsys):
    """Expected: ``config show offpolicy --config FILE`` with bytes that are not UTF-8 (a
    Latin-1 YAML, a binary picked by mistake): exit 2 and one line naming the file.

    Actual: ``load_config`` does ``path.read_text(encoding="utf-8")`` unguarded
    (xdistill/config.py): ``UnicodeDecodeError`` traceback -- also for ``eval --config`` and
    ``train``."""
    bad = tmp_path / "run.yaml"
    bad.write_bytes("eval:\n  every: 1  # r\xe9sum\xe9\n".encode("latin-1"))
    rc = _run(["config", "show", "offpolicy", "--config", str(bad)])
    _one_line_error(capsys, rc, str(bad))


# ---------------------------------------------------------------------------- tokenizers inspect
def test_tokenizers_inspect_negative_max_roles_prints_wrong_counts(capsys):
    """Expected: ``tokenizers inspect gpt2 --max-roles -1`` is refused (exit 2 naming
    --max-roles), or shows no role token with a correct "(+N)" remainder.

    Actual: ``items[:-1]`` and ``len(items) - max_roles`` make the line ``eos 1: , ... (+2)``:
    a role with one token claims two more than it shows."""
    rc = _run(["tokenizers", "inspect", "gpt2", "--max-roles", "-1"])
    captured = capsys.readouterr()
    if rc != 0:
        assert rc == 2 and "--max-roles" in captured.err, captured.err
        return
    for line in captured.out.split("roles:")[1].splitlines():
        m = re.match(r"\s+\S+\s+(\d+): (.*)", line)
        if not m:
            continue
        total, rest = int(m.group(1)), m.group(2)
        more = re.search(r"\(\+(\d+)\)$", rest)
        shown = len([p for p in rest.split(", ") if p and p != "..." and not p.startswith("... (+")])
        assert shown + (int(more.group(1)) if more else 0) == total, line


# ---------------------------------------------------------------------------- metrics console line
@pytest.mark.parametrize("value", [9999.7, -9999.9])
def test_console_line_never_switches_to_exponent_notation_near_ten_thousand(value):
    """Expected: the console line writes values of 1e4 and more as plain integers (``tok_per_s
    12346``) and smaller ones with 4 significant digits; 9999.7 is ``10000``.

    Actual: the branch tests ``abs(value) < 1e4`` *before* rounding, and ``f"{9999.7:.4g}"`` is
    ``1e+04``: a throughput hovering around 10k tok/s flips between ``9987`` and ``1e+04``."""
    from xdistill.metrics import format_metrics

    line = format_metrics(3, {"tok_per_s": value})
    assert "e+" not in line, line
