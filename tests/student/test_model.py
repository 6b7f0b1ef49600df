"""Student build/load and Hugging Face export (1 process)."""

from __future__ import annotations

import json

import pytest
import torch

from distributed_helpers import TINY_LLAMA, build_tiny
from xdistill.errors import ConfigError, XDistillError
from xdistill.student.config import StudentConfig
from xdistill.student.model import build_causal_lm, export_hf, load_causal_lm, load_student


def _ids(seed=0, b=2, t=12):
    return torch.randint(0, TINY_LLAMA["vocab_size"], (b, t), generator=torch.Generator().manual_seed(seed))


def _tiny_tokenizer():
    """A real byte-level BPE trained on the spot, wrapped as a transformers tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world, the student learns from the teacher"] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def test_seeded_init_is_reproducible_and_leaves_global_rng_alone():
    torch.manual_seed(5)
    expected_next = torch.rand(3)
    torch.manual_seed(5)
    a, _ = build_tiny()
    b, _ = build_tiny()
    assert torch.equal(torch.rand(3), expected_next)  # building consumed no global randomness
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    c, _ = build_tiny()  # same seed again
    d = load_student(StudentConfig(model_type="llama", model_config=dict(TINY_LLAMA), init_seed=99))
    assert torch.equal(a.model.layers[0].mlp.up_proj.weight, c.model.layers[0].mlp.up_proj.weight)
    assert not torch.equal(a.model.layers[0].mlp.up_proj.weight, d.model.layers[0].mlp.up_proj.weight)
    assert a.training


def test_dtype_is_applied():
    model = load_student(StudentConfig(model_type="llama", model_config=dict(TINY_LLAMA), dtype="bfloat16"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_unknown_config_key_and_model_type_are_named():
    with pytest.raises(ConfigError, match="'hiden_size'"):
        build_causal_lm("llama", {"hiden_size": 32})
    with pytest.raises(ConfigError, match="'not-a-model'"):
        build_causal_lm("not-a-model", {})


def test_load_errors_name_the_folder(tmp_path):
    with pytest.raises(XDistillError, match="does not exist"):
        load_causal_lm(tmp_path / "missing")
    with pytest.raises(XDistillError, match="no config.json"):
        load_causal_lm(tmp_path)


@pytest.mark.parametrize("tied", [True, False])
def test_export_round_trip_identical_logits_with_tokenizer(tmp_path, tied):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, _ = build_tiny()
    if not tied:
        model = build_causal_lm("llama", dict(TINY_LLAMA, tie_word_embeddings=False), seed=4)
    with torch.no_grad():  # make the weights differ from any fresh init
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    tokenizer = _tiny_tokenizer()
    out = export_hf(model, tmp_path / "export", tokenizer)
    assert out == tmp_path / "export" and not (tmp_path / "export.tmp").exists()
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    loaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    model.eval()
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=_ids()).logits, model(input_ids=_ids()).logits)
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert tok("hello world")["input_ids"] == tokenizer("hello world")["input_ids"]
    again = load_student(StudentConfig(path=str(out)))  # the student can start from an export
    assert all(torch.equal(x, y) for x, y in zip(again.state_dict().values(), model.state_dict().values()))


def test_export_in_bfloat16_and_overwrite_protection(tmp_path):
    from transformers import AutoModelForCausalLM

    model, _ = build_tiny()
    out = export_hf(model, tmp_path / "bf16", dtype="bfloat16")
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    loaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True, dtype="auto")
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    assert torch.equal(loaded.model.norm.weight, model.model.norm.weight.to(torch.bfloat16))
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # the live model is untouched
    with pytest.raises(XDistillError, match="not empty"):
        export_hf(model, out)
    export_hf(model, out, overwrite=True)
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
