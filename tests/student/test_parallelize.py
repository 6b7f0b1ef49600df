"""parallelize_student without a process group: decoder-layer discovery, activation checkpointing,
config checks. (Real sharding on 2 ranks is in test_fsdp.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from distributed_helpers import TINY_LLAMA, build_tiny
from xdistill.errors import ConfigError, XDistillError
from xdistill.student.config import StudentConfig
from xdistill.student.model import build_causal_lm
from xdistill.student.parallelize import _policies, find_decoder_layers, parallelize_student


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return x + self.lin(x)


class OddNames(nn.Module):
    """Blocks under an attribute path no table knows, next to a smaller list of heads."""

    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(4, 1)])
        self.backbone = nn.Module()
        self.backbone.stack = nn.ModuleList([Block() for _ in range(3)])


def test_finds_llama_and_gpt2_layers():
    llama, _ = build_tiny()
    assert find_decoder_layers(llama) is llama.model.layers
    gpt2 = build_causal_lm("gpt2", dict(vocab_size=50, n_embd=16, n_layer=2, n_head=2, n_positions=32))
    assert find_decoder_layers(gpt2) is gpt2.transformer.h


def test_finds_layers_generically():
    model = OddNames()
    assert find_decoder_layers(model) is model.backbone.stack


@pytest.mark.parametrize("model", [nn.Sequential(nn.Linear(4, 4), nn.ReLU()),
                                   nn.ModuleDict({"a": nn.ModuleList([nn.Linear(2, 2), nn.ReLU()])})])
def test_error_names_model_class_without_decoder_layers(model):
    with pytest.raises(XDistillError, match=type(model).__name__) as info:
        parallelize_student(model, None, StudentConfig())
    assert "decoder layers" in str(info.value)


def _loss_and_grads(model, ids):
    model.zero_grad()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_activation_checkpointing_keeps_math_and_names():
    plain, _ = build_tiny()
    wrapped, _ = build_tiny()
    names_before = list(wrapped.state_dict())
    out = parallelize_student(wrapped, None, StudentConfig(activation_checkpointing=True))
    assert out is wrapped
    assert all(type(layer).__name__ == "CheckpointWrapper" for layer in wrapped.model.layers)
    assert list(wrapped.state_dict()) == names_before  # HF export/ckpt names unchanged
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (2, 10), generator=torch.Generator().manual_seed(3))
    loss_a, grads_a = _loss_and_grads(plain, ids)
    loss_b, grads_b = _loss_and_grads(wrapped, ids)
    assert torch.equal(loss_a, loss_b)
    plain_names = {n.replace("._checkpoint_wrapped_module", ""): g for n, g in grads_b.items()}
    assert plain_names.keys() == grads_a.keys()
    for name, grad in grads_a.items():
        torch.testing.assert_close(plain_names[name], grad, rtol=0, atol=1e-7)


def test_no_process_group_leaves_parameters_plain():
    model, cfg = build_tiny()
    parallelize_student(model, None, cfg)
    assert all(type(p) is nn.Parameter for p in model.parameters())


def test_cpu_offload_on_a_cpu_mesh_is_a_config_error():
    with pytest.raises(ConfigError, match="cpu_offload"):
        _policies(StudentConfig(cpu_offload=True), SimpleNamespace(device_type="cpu"))


def test_mixed_precision_policy_from_config():
    mp, _ = _policies(StudentConfig(param_dtype="bfloat16"), SimpleNamespace(device_type="cpu"))
    assert mp.param_dtype == torch.bfloat16 and mp.reduce_dtype == torch.bfloat16
    mp, _ = _policies(StudentConfig(param_dtype="bfloat16", reduce_dtype="float32"),
                      SimpleNamespace(device_type="cpu"))
    assert mp.reduce_dtype == torch.float32
    mp, _ = _policies(StudentConfig(), SimpleNamespace(device_type="cpu"))
    assert mp.param_dtype is None and mp.reduce_dtype is None


@pytest.mark.parametrize("kwargs, key", [({"dtype": "float8"}, "student.dtype"),
                                         ({"grad_reduce": "avg"}, "student.grad_reduce"),
                                         ({"dp_replicate": 0}, "student.dp_replicate"),
                                         ({"path": "", "model_type": ""}, "student")])
def test_student_config_validation_names_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        StudentConfig(**kwargs).validate()


def test_student_config_is_fully_documented_and_loads_strictly(tmp_path):
    from xdistill.config import load_config, undocumented_fields

    assert undocumented_fields(StudentConfig) == []
    path = tmp_path / "s.yaml"
    path.write_text("model_type: llama\nmodel_config: {hidden_size: 32}\nactivation_checkpointing: true\n")
    cfg = load_config(StudentConfig, path, ["param_dtype=bfloat16"])
    assert cfg.model_config == {"hidden_size": 32} and cfg.param_dtype == "bfloat16"
    path.write_text("activation_checkpoint: true\n")
    with pytest.raises(ConfigError, match="activation_checkpoint"):
        load_config(StudentConfig, path)
