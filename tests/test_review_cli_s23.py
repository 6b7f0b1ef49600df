"""Review (session 23) of the metrics/logging, the ``xdistill`` console script and the config
overrides: each test shows one defect and fails on the code it was written against."""

from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path

import pytest

from xdistill import cli
from xdistill.config import load_config


def tiny_run_config(tmp_path: Path, out: Path, **train) -> dict:
    """An off-policy run of a 1-layer student on a tiny corpus (seconds on a CPU)."""
    import xdistill.tiny as mk

    corpus, _ = mk.make_corpus(tmp_path / "corpus", n_train=20, n_eval=2, max_chars=300)
    tok = mk.train_bpe(tmp_path / "tok", 300, mk.passages(limit=40))
    return {"student": {"model_type": "llama", "model_config": dict(
                hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True)},
            "student_tokenizer": str(tok),
            "data": {"paths": [str(corpus)], "seq_len": 16, "batch_size": 1, "num_workers": 0},
            "loss": {"ce_weight": 1.0},
            "train": {"out_dir": str(out), **train},
            "checkpoint": {"every": 0, "export_hf": False},
            "eval": {"every": -1}}


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def test_review_s23_plot_without_matplotlib_is_one_line_error(tmp_path, monkeypatch, capsys):
    """Defect: ``xdistill plot`` needs matplotlib, an optional extra (``xdistill[plot]``). Without
    it, ``plot_runs`` does a bare ``import matplotlib`` and the console script dies with a
    ``ModuleNotFoundError`` traceback (exit 1), unlike every other user error of the CLI and unlike
    ``xdistill projection inspect --plot``, which says ``--plot needs matplotlib (pip install
    'xdistill[plot]')``.

    Expected: one line ``xdistill: error: ... pip install 'xdistill[plot]'`` and exit code 2.
    Fix: xdistill/commands/plot.py, ``plot_runs``: wrap the matplotlib imports in
    ``try/except ImportError`` and raise ``XDistillError`` naming the extra (as
    xdistill/projection/plot.py does)."""
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.parent.mkdir()
    metrics.write_text('{"step": 1, "time": 0.0, "loss": 2.0}\n{"step": 2, "time": 1.0, "loss": 1.5}\n')
    monkeypatch.setitem(sys.modules, "matplotlib", None)          # the extra is not installed
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    try:
        code = cli.main(["plot", str(metrics), "-o", str(tmp_path / "curves.png")])
    except ImportError as exc:
        pytest.fail(f"`xdistill plot` without matplotlib raised {exc!r} (a traceback) instead of "
                    "one `xdistill: error:` line")
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("xdistill: error:") and "xdistill[plot]" in err, err


@pytest.mark.parametrize("override, key", [
    ("train.out_dir=2024-06-01", "out_dir"),
    ("train.wandb_project=2024-06-01", "wandb_project"),
])
def test_review_s23_date_like_override_of_a_string_field_keeps_its_text(override, key):
    """Defect: the config loader resolves YAML 1.1 timestamps, so a ``str`` field given a
    date-like value (``train.out_dir=2024-06-01``, ``train.wandb_project=2024-06-01``, also
    ``out_dir: 2024-06-01`` in a file) becomes ``datetime.date`` and is refused with
    ``expected str, got datetime.date(2024, 6, 1)``. The loader already keeps what the user wrote
    for a ``str`` field given a number (``0123``, ``1.10``, ``_SourcedInt``/``_SourcedFloat``);
    a date-named run directory is common and is text, not a date.

    Expected: the field is the string ``'2024-06-01'``.
    Fix: xdistill/config.py, ``_Loader``: drop the ``tag:yaml.org,2002:timestamp`` implicit
    resolver (as the YAML 1.1 booleans were dropped) or construct timestamps as sourced strings
    that ``_convert`` accepts for ``str`` fields."""
    from xdistill.train.config import OffPolicyConfig

    cfg = load_config(OffPolicyConfig, None, [override])
    assert getattr(cfg.train, key) == "2024-06-01"


def test_review_s23_console_line_shows_non_finite_values_as_nan_and_inf():
    """Defect: ``format_metrics`` (the console line of every logged step) passes each value
    through ``_plain``, the JSON sanitiser that turns non-finite floats into ``None``. A diverged
    step is therefore printed as ``loss None | grad_norm None``: the user cannot tell a NaN loss
    from an infinite one, nor from a missing value, on exactly the step that matters. (Writing
    ``null`` to metrics.jsonl is right; the console is not JSON.)

    Expected: ``step 5 | loss nan | grad_norm inf | lr 0.001``.
    Fix: xdistill/metrics.py, ``format_metrics``: convert tensors/numpy scalars with ``.item()``
    but keep non-finite floats (format them as ``nan``/``inf``) instead of calling ``_plain``."""
    from xdistill.metrics import format_metrics

    line = format_metrics(5, {"loss": math.nan, "grad_norm": math.inf, "lr": 1e-3},
                          ["loss", "grad_norm", "lr"])
    assert line == "step 5 | loss nan | grad_norm inf | lr 0.001", line


def test_review_s23_end_line_after_resuming_past_train_steps_counts_no_negative_steps():
    """Defect: a run whose ``checkpoint.resume`` (``auto``) loads a checkpoint *later* than
    ``train.steps`` (a 24-step run, then the same out_dir with ``train.steps=10``) trains nothing,
    yet its end summary says ``done: -14 step(s)``: ``end_line`` computes
    ``train.steps - start_step`` without a floor.

    Expected: ``done: 0 step(s) ...`` (no step was run).
    Fix: xdistill/train/report.py, ``end_line``: ``steps = max(0, train.steps - start_step)``
    (``start_line`` likewise says ``no steps left (10 done)`` although 24 were done: use
    ``max(last, start_step)`` there)."""
    from xdistill.train.report import end_line

    run = types.SimpleNamespace(
        cfg=types.SimpleNamespace(train=types.SimpleNamespace(steps=10, out_dir="runs/x")),
        start_step=24, last_checkpoint=Path("runs/x/checkpoints/step_0000024"))
    line = end_line(run, {}, None, 1.0)
    assert line.startswith("done: 0 step(s)"), line


def test_review_s23_eval_prints_valid_json_when_a_figure_is_nan(monkeypatch, capsys):
    """Defect: ``xdistill eval`` promises "one JSON object" on stdout but prints it with
    ``json.dumps`` defaults, so a non-finite figure (a diverged student or a float16 overflow:
    exactly the models one evaluates) comes out as the bare token ``NaN``/``Infinity``, which is
    not JSON (``jq``, JavaScript and strict parsers reject the line). ``MetricsWriter`` writes
    non-finite floats as ``null`` for this very reason.

    Expected: stdout parses as strict JSON; the NaN figure is ``null``.
    Fix: xdistill/commands/eval.py, ``main``: print ``json.dumps(_plain(out), sort_keys=True,
    allow_nan=False)`` with ``xdistill.metrics._plain`` (non-finite -> null); keep the stderr
    line readable for a NaN."""
    from xdistill.commands import eval as eval_cmd

    monkeypatch.setattr(eval_cmd, "score_model", lambda args: {
        "model": args.model, "tokenizer": "t", "add_bos": False, "bpb": math.nan,
        "loss": math.inf, "bytes": 100, "tokens": 40})
    code = cli.main(["eval", "--model", "m", "--data", "d"])
    out = capsys.readouterr().out.strip()
    assert code == 0
    record = json.loads(out, parse_constant=_reject_constant)
    assert record["bpb"] is None and record["loss"] is None


def test_review_s23_tensorboard_does_not_keep_replayed_steps_after_resume(tmp_path):
    """Defect: a resumed run replays the steps after its checkpoint. ``trim_logs`` drops those
    steps from metrics.jsonl first, but the TensorBoard tracker (on by default) is opened with a
    plain ``SummaryWriter(out_dir/tb)``: the first run's events of the replayed steps stay, and
    the resumed run writes them again, so TensorBoard shows every replayed step twice (steps
    1, 2, 3, 4, 3, 4 for a 4-step run resumed from step 2) and its curves zig-zag.

    Expected: after the resume, each step appears once in TensorBoard (the replayed ones with the
    resumed run's values), as in metrics.jsonl.
    Fix: xdistill/train/core.py ``_open_trackers`` -> xdistill/train/trackers.py
    ``open_trackers``/``TensorBoardTracker``: pass the run's start step and open
    ``SummaryWriter(folder, purge_step=run.start_step + 1)`` when resuming (TensorBoard then
    purges the stale events of steps >= purge_step)."""
    pytest.importorskip("torch.utils.tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from xdistill.config import from_dict
    from xdistill.train.config import OffPolicyConfig
    from xdistill.train.offpolicy import run_offpolicy

    out = tmp_path / "run"
    cfg = tiny_run_config(tmp_path, out, steps=4, tensorboard=True, num_threads=1)
    cfg["checkpoint"].update(every=2, keep_last=0, resume="auto")
    run_offpolicy(from_dict(OffPolicyConfig, cfg))
    cfg["checkpoint"]["resume"] = str(out / "checkpoints" / "step_0000002")
    run_offpolicy(from_dict(OffPolicyConfig, cfg))

    jsonl_steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert jsonl_steps == [1, 2, 3, 4]                    # metrics.jsonl is trimmed on resume
    acc = EventAccumulator(str(out / "tb"))
    acc.Reload()
    tb_steps = [e.step for e in acc.Scalars("loss")]
    assert tb_steps == [1, 2, 3, 4], tb_steps


def test_review_s23_the_last_step_is_logged_whatever_log_every(tmp_path):
    """Defect: with ``train.log_every: 2`` a 5-step run ended without its final step's record
    in metrics.jsonl (only 2 and 4). Fixed: the last step is always written."""
    from xdistill.config import from_dict
    from xdistill.train.config import OffPolicyConfig
    from xdistill.train.offpolicy import run_offpolicy

    out = tmp_path / "run"
    cfg = tiny_run_config(tmp_path, out, steps=5, tensorboard=False, log_every=2, num_threads=2)
    run_offpolicy(from_dict(OffPolicyConfig, cfg))
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 4, 5]
