"""``xdistill eval``: a run's evaluation at step 0, and any model's bits per byte."""

from __future__ import annotations

import json
import math

import pytest
from train_helpers import base_config, write_config

from xdistill.commands.eval import main
from xdistill.errors import ConfigError


def test_model_bits_per_byte_from_the_cli(tiny_assets, capsys):
    assert main(["--model", tiny_assets["same"], "--data", tiny_assets["eval"], "--seq-len", "48",
                 "--batch", "2", "--batches", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] > 0 and out["bytes"] > out["tokens"]
    # a random tiny LM knows nothing: close to log2(vocab) bits per token, spread over bytes
    assert math.isclose(out["bpb"], out["loss"] * out["tokens"] / math.log(2) / out["bytes"],
                        rel_tol=1e-9)
    assert 0.5 * math.log2(320) < out["loss"] / math.log(2) < 2 * math.log2(320)


def test_run_evaluation_before_training(tmp_path, tiny_assets, capsys):
    cfg = base_config(tiny_assets, tmp_path / "run")
    cfg["eval"] = {"every": -1, "paths": [tiny_assets["eval"]], "batches": 1}
    path = write_config(tmp_path / "run.yaml", cfg)
    assert main(["--config", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["eval/bpb"] > 0 and out["eval/cross/loss"] > 0 and out["eval/same/loss"] > 0
    assert not (tmp_path / "run" / "checkpoints").exists()   # nothing was trained or saved


def test_bad_usage_is_a_clear_error(tiny_assets):
    with pytest.raises(ConfigError, match="either --config"):
        main([])
    with pytest.raises(ConfigError, match="--model needs --data"):
        main(["--model", tiny_assets["same"]])
