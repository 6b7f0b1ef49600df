"""The HF export keeps the student model's own dtype (its config.json's), unless
``checkpoint.export_dtype`` says otherwise; a fresh student exports its training dtype."""

from __future__ import annotations

import json

import pytest
import torch
from train_helpers import base_config, exported_weights

from xdistill.config import from_dict
from xdistill.student.model import export_dtype, stock_dtype
from xdistill.train.config import OffPolicyConfig


@pytest.fixture(scope="module")
def bf16_student(tiny_assets, tmp_path_factory):
    """The tiny same-tokenizer model saved in bfloat16 (as stock checkpoints often are)."""
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("bf16") / "student"
    model = AutoModelForCausalLM.from_pretrained(tiny_assets["same"], dtype=torch.bfloat16)
    model.save_pretrained(str(out))
    return str(out)


def test_stock_dtype_is_read_from_the_config(tiny_assets, bf16_student, tmp_path):
    assert stock_dtype(bf16_student) == "bfloat16"
    assert stock_dtype(tiny_assets["same"]) == "float32"
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float16"}))
    assert stock_dtype(tmp_path) == "float16" and stock_dtype(tmp_path / "missing") == ""
    assert export_dtype("auto", bf16_student) == "bfloat16"
    assert export_dtype("auto", "") == "" and export_dtype("float32", bf16_student) == "float32"


@pytest.mark.parametrize("setting,want", [("auto", torch.bfloat16), ("float32", torch.float32)])
def test_export_follows_the_student_model(tmp_path, tiny_assets, bf16_student, setting, want):
    from xdistill.train.offpolicy import run_offpolicy

    cfg = base_config(tiny_assets, tmp_path / "run")
    cfg["student"] = {"path": bf16_student}
    cfg["teachers"] = cfg["teachers"][1:]
    cfg["train"]["steps"] = 1
    cfg["checkpoint"].update(export_hf=True, export_dtype=setting)
    run_offpolicy(from_dict(OffPolicyConfig, cfg))
    weights = exported_weights(tmp_path / "run")
    assert {v.dtype for v in weights.values()} == {want}
    config = json.loads((tmp_path / "run" / "export" / "config.json").read_text())
    assert config["dtype"] == str(want).removeprefix("torch.")
