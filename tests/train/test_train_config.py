"""Bad run configs fail before any compute, with a message naming the key / file / tokenizers.

Every case goes through the real CLI entry point (``xdistill train offpolicy``) in-process and
checks exit code 2, the message, and that no run directory / checkpoint / metrics was created.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from xdistill.cli import main as cli_main
from xdistill.config import load_config, undocumented_fields
from xdistill.errors import ConfigError
from xdistill.train.config import OffPolicyConfig, grad_accum_steps, validate_offpolicy

_spec = importlib.util.spec_from_file_location(
    "train_conftest_helpers_cfg", Path(__file__).resolve().parent / "conftest.py")
helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helpers)

REPO = Path(__file__).resolve().parents[2]


def _fails(tmp_path, cfg: dict, capsys, *overrides) -> str:
    path = helpers.write_config(tmp_path / "bad.yaml", cfg)
    rc = cli_main(["train", "offpolicy", "--config", str(path), *overrides])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert not Path(cfg["train"]["out_dir"]).exists(), "a run directory was created"
    return err


def test_every_field_documented():
    assert undocumented_fields(OffPolicyConfig) == []


def test_unknown_key(tmp_path, tiny_assets, capsys):
    cfg = helpers.base_config(tiny_assets, tmp_path / "run")
    cfg["optim"]["learning_rate"] = 1.0
    err = _fails(tmp_path, cfg, capsys)
    assert "learning_rate" in err and "optim" in err


def test_unknown_override(tmp_path, tiny_assets, capsys):
    cfg = helpers.base_config(tiny_assets, tmp_path / "run")
    err = _fails(tmp_path, cfg, capsys, "train.stepz=3")
    assert "stepz" in err


def test_teacher_path_missing(tmp_path, tiny_assets, capsys):
    cfg = helpers.base_config(tiny_assets, tmp_path / "run")
    cfg["teachers"][1]["worker"]["model"] = str(tmp_path / "no_such_teacher")
    err = _fails(tmp_path, cfg, capsys)
    assert "teachers.1.worker.model" in err and "no_such_teacher" in err and "does not exist" in err


def test_batch_sizes_do_not_divide(tmp_path, tiny_assets, capsys):
    cfg = helpers.base_config(tiny_assets, tmp_path / "run")
    cfg["train"]["global_batch_size"] = 5
    err = _fails(tmp_path, cfg, capsys)
    assert "train.global_batch_size (5)" in err and "data.batch_size (2)" in err


def test_projection_for_wrong_pair(tmp_path, tiny_assets, capsys):
    """The projection was built student->teacher; using it with the tokenizers swapped (and for
    another teacher) is refused, naming both tokenizer pairs."""
    cfg = helpers.base_config(tiny_assets, tmp_path / "run")
    cfg["student_tokenizer"] = tiny_assets["tok_t"]
    cfg["teachers"][0]["tokenizer"] = tiny_assets["tok_s"]
    cfg["teachers"][0]["worker"]["model"] = tiny_assets["same"]
    cfg["teachers"] = cfg["teachers"][:1]
    err = _fails(tmp_path, cfg, capsys)
    assert "teachers.0.loss.projection" in err and "was built for" in err and "swapped" in err


def test_same_tokenizer_loss_needs_same_tokenizer(tmp_path, tiny_assets, capsys):
    cfg = helpers.base_config(tiny_assets, tmp_path / "run")
    cfg["teachers"][0]["loss"] = {"kind": "forward_kl"}
    err = _fails(tmp_path, cfg, capsys)
    assert "teachers.0.loss.kind" in err and "cross-tokenizer loss" in err


def test_continuation_needs_forward_pkl_on_logits(tmp_path, tiny_assets, capsys):
    cfg = helpers.base_config(tiny_assets, tmp_path / "run", cross_kind="alm")
    cfg["teachers"][0]["loss"]["continuation"] = True
    err = _fails(tmp_path, cfg, capsys)
    assert "teachers.0.loss.continuation" in err and "'alm'" in err


def test_stop_after_needs_a_checkpoint(tmp_path, tiny_assets, capsys):
    cfg = helpers.base_config(tiny_assets, tmp_path / "run")
    cfg["train"]["stop_after"] = 3
    err = _fails(tmp_path, cfg, capsys)
    assert "train.stop_after" in err


def test_grad_accum_and_data_ranks():
    cfg = OffPolicyConfig()
    cfg.data.batch_size, cfg.train.global_batch_size = 2, 8
    assert grad_accum_steps(cfg, 1) == 4 and grad_accum_steps(cfg, 2) == 2
    cfg.train.data_ranks = 4
    assert grad_accum_steps(cfg, 1) == 1 and grad_accum_steps(cfg, 2) == 1
    cfg.train.data_ranks = 3
    with pytest.raises(ConfigError, match="train.data_ranks"):
        grad_accum_steps(cfg, 2)


def test_shipped_configs_load():
    """Every shipped config parses strictly (paths are checked only at run time)."""
    for path in sorted((REPO / "configs").glob("offpolicy*.yaml")):
        cfg = load_config(OffPolicyConfig, path)
        assert cfg.teachers, path
        with pytest.raises(ConfigError):  # the model folders are not on this machine / not built
            validate_offpolicy(load_config(OffPolicyConfig, path, ["data.paths=[/nonexistent]"]))


def test_train_without_config_fails_with_one_line(capsys):
    """Both trainers refuse a run without a config before any compute: exit 2, one line."""
    for kind in ("offpolicy", "onpolicy"):
        assert cli_main(["train", kind]) == 2
        err = capsys.readouterr().err
        assert err.startswith("xdistill: error:") and err.count("\n") == 1, (kind, err)


@pytest.mark.parametrize("override,key", [
    ("loss.ce_weight=-1", "loss.ce_weight"), ("train.log_every=0", "train.log_every"),
    ("loss.label_smoothing=1.0", "loss.label_smoothing"),
    ("data.num_workers=-1", "data.num_workers"), ("data.prefetch_factor=0", "data.prefetch_factor"),
    ("data.seq_len=1", "data.seq_len"), ("checkpoint.keep_last=-1", "checkpoint.keep_last"),
    ("loss.chunk_size=-1", "loss.chunk_size"), ("loss.chunk_size=0", "loss.chunk_size"),
    ("data.seed=-1", "data.seed")])
def test_out_of_range_values_fail_before_compute(tmp_path, tiny_assets, capsys, override, key):
    """Each of these once trained silently (ce_weight -1 as 0) or crashed after compute started."""
    cfg = helpers.base_config(tiny_assets, tmp_path / "run")
    err = _fails(tmp_path, cfg, capsys, override)
    assert key in err and err.count("\n") == 1, err


def test_yaml_12_float_override_reaches_the_run(tmp_path, tiny_assets):
    cfg = helpers.base_config(tiny_assets, tmp_path / "run")
    path = helpers.write_config(tmp_path / "ok.yaml", cfg)
    loaded = load_config(OffPolicyConfig, path, ["optim.lr=1e-3"])
    assert loaded.optim.lr == 0.001


@pytest.mark.parametrize("model", ["smaller", "larger"])
def test_teacher_tokenizer_must_belong_to_its_model(tmp_path, tiny_assets, capsys, model):
    """The cross teacher's tokenizer (400 ids) with a model of 320 output rows (ids beyond it) or
    of 50,257 rows (another model's vocabulary): one error naming the key, before training."""
    from xdistill.tiny import save_tiny_lm

    cfg = helpers.base_config(tiny_assets, tmp_path / "run")
    cfg["teachers"][0]["worker"]["model"] = (
        tiny_assets["same"] if model == "smaller" else str(save_tiny_lm(tmp_path / "g", "gpt2")))
    path = helpers.write_config(tmp_path / "bad.yaml", cfg)
    rc = cli_main(["train", "offpolicy", "--config", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and "teachers.0.tokenizer" in err and "does not belong" in err, err
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not any(
        '"step"' in line for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())


def test_seq_len_beyond_the_students_positions_fails_before_training(tmp_path, tiny_assets,
                                                                     capsys):
    cfg = helpers.base_config(tiny_assets, tmp_path / "run")
    err = _fails(tmp_path, cfg, capsys, "data.seq_len=300")   # the tiny student has 256
    assert "data.seq_len: 300 student tokens per sequence exceed the model's 256 positions" in err


def test_teacher_rejects_sequences_beyond_its_positions(tiny_assets):
    import torch

    from xdistill.errors import TeacherError
    from xdistill.teacher import TeacherConfig, TeacherRequest, TeacherWorker

    worker = TeacherWorker(TeacherConfig(name="t", model=tiny_assets["cross"]))
    limit = worker.max_positions
    ids = torch.zeros(1, limit + 1, dtype=torch.long)
    with pytest.raises(TeacherError, match=rf"teacher 't': {limit + 1} tokens per sequence exceed "
                                           rf"the model's {limit} positions"):
        worker.forward(TeacherRequest(0, ids, torch.ones_like(ids, dtype=torch.bool)))


@pytest.mark.parametrize("content", ["junk", "config"])
def test_teacher_folder_that_is_not_a_model(tmp_path, tiny_assets, capsys, content):
    """A folder with no config.json, or one whose config.json is no model's: one line naming it."""
    folder = tmp_path / "not_a_model"
    folder.mkdir()
    if content == "junk":
        (folder / "weights.txt").write_text("junk")
    else:
        (folder / "config.json").write_text('{"hello": 1}')
    cfg = helpers.base_config(tiny_assets, tmp_path / "run")
    cfg["teachers"][0]["worker"]["model"] = str(folder)
    path = helpers.write_config(tmp_path / "bad.yaml", cfg)
    rc = cli_main(["train", "offpolicy", "--config", str(path)])
    err = capsys.readouterr().err
    # the run's progress log lines (e.g. the compute dtype) may precede it: one error line, no
    # traceback (whether the log reaches this stream depends on earlier tests' logging setup)
    errors = [line for line in err.splitlines() if line.startswith("xdistill: error:")]
    assert rc == 2 and len(errors) == 1 and "not_a_model" in errors[0], err
    assert "Traceback" not in err, err
    assert ("no config.json" if content == "junk" else "cannot load a causal LM") in errors[0]
