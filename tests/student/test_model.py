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


def _chain_model(vocab_size: int, chain: list[int]):
    """A tiny Llama whose greedy continuation is ``chain[0] -> chain[1] -> ... -> chain[-1]``.

    Attention and MLP outputs are zeroed, so the last hidden state is the current token's
    embedding; token ``chain[i]`` embeds as basis vector ``e_i`` and the untied head maps
    ``e_i`` to a large logit for ``chain[i + 1]`` (every other logit is 0)."""
    cfg = dict(TINY_LLAMA, vocab_size=vocab_size, tie_word_embeddings=False, hidden_size=16,
               intermediate_size=32, max_position_embeddings=48)
    model = build_causal_lm("llama", cfg, seed=0)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.mul_(0.01)
        model.lm_head.weight.zero_()
        for i, (cur, nxt) in enumerate(zip(chain[:-1], chain[1:])):
            model.model.embed_tokens.weight[cur] = 0.0
            model.model.embed_tokens.weight[cur, i] = 1.0
            model.lm_head.weight[nxt, i] = 10.0
    return model.eval()


def test_export_carries_the_tokenizers_special_ids_and_generate_stops_at_its_eos(
        tmp_path, get_tokenizer):
    """A fresh Llama carries bos 1 / eos 2; exported with GPT-2's tokenizer (EOS 50256), plain
    transformers ``generate()`` must stop at ``<|endoftext|>`` -- here after three tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = get_tokenizer("gpt2")
    prompt = tok.hf("The student", add_special_tokens=False)["input_ids"]
    a, b = tok.hf.convert_tokens_to_ids(["Ġlearns", "Ġfast"])
    model = _chain_model(tok.vocab_size, [prompt[-1], a, b, tok.eos_id])
    assert (model.config.bos_token_id, model.config.eos_token_id) == (1, 2)  # Llama's defaults
    out = export_hf(model, tmp_path / "export", tok)
    config = json.loads((out / "config.json").read_text())
    gen = json.loads((out / "generation_config.json").read_text())
    for data in (config, gen):
        assert (data["bos_token_id"], data["eos_token_id"], data["pad_token_id"]) == (50256, 50256, None)
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 48

    loaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    hf_tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert hf_tok.eos_token_id == 50256 and hf_tok.model_max_length == 48
    ids = hf_tok("The student", return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        gen_ids = loaded.generate(**ids, max_new_tokens=20, do_sample=False, pad_token_id=50256)
    new = gen_ids[0, ids["input_ids"].shape[1]:].tolist()
    assert new == [a, b, 50256], new                  # stopped at EOS, not after 20 tokens
    assert hf_tok.decode(new) == " learns fast<|endoftext|>"


def _write_tiny_gguf(path, model, tokenizer_json: dict) -> None:
    """Write a Llama model + byte-level BPE vocabulary as an F32 GGUF file, the way llama.cpp's
    converter lays it out (tensor names, q/k rows permuted for its rotary layout)."""
    import gguf
    import numpy as np

    cfg = model.config
    vocab, merges = tokenizer_json["model"]["vocab"], tokenizer_json["model"]["merges"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {t["content"] for t in tokenizer_json["added_tokens"] if t["special"]}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_eos_token_id(vocab["<eos>"])

    def permute(a, n_head):
        return a.reshape(n_head, 2, a.shape[0] // n_head // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    parts = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    for key, value in model.state_dict().items():
        arr = value.detach().numpy().astype(np.float32)
        if key.startswith("model.layers."):
            layer, rest = key.split(".")[2], ".".join(key.split(".")[3:-1])
            name = f"blk.{layer}.{parts[rest]}.weight"
            if rest == "self_attn.q_proj":
                arr = permute(arr, cfg.num_attention_heads)
            elif rest == "self_attn.k_proj":
                arr = permute(arr, cfg.num_key_value_heads)
        else:
            name = names[key]
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_file_loads_as_a_plain_model_and_tokenizer(tmp_path):
    """A ``.gguf`` spec loads through transformers' gguf_file support (same logits as the model
    it was written from), with the quantizer detached, so it saves and exports as plain weights;
    the same file is a tokenizer spec."""
    import json as _json

    from xdistill.tokenization import load_tokenizer

    hf_tok = _tiny_tokenizer()
    model = build_causal_lm("llama", dict(TINY_LLAMA, vocab_size=len(hf_tok), tie_word_embeddings=False),
                            seed=3).eval()
    gguf_path = tmp_path / "tiny.gguf"
    _write_tiny_gguf(gguf_path, model, _json.loads(hf_tok.backend_tokenizer.to_str()))
    loaded = load_causal_lm(gguf_path).eval()
    assert getattr(loaded, "hf_quantizer", None) is None
    assert getattr(loaded.config, "quantization_config", None) is None
    ids = _ids(b=2, t=10) % len(hf_tok)
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5)
    tok = load_tokenizer(gguf_path)
    text = "hello world, the teacher"
    assert tok.encode(text).ids.tolist() == hf_tok(text)["input_ids"]
    assert tok.table.concat(tok.encode(text).ids) == text.encode()
    student = load_student(StudentConfig(path=str(gguf_path)))       # the student config too
    assert student.training and {p.dtype for p in student.parameters()} == {torch.float32}
    out = export_hf(loaded, tmp_path / "export", tok)
    assert "quantization_config" not in _json.loads((out / "config.json").read_text())
    with pytest.raises(XDistillError, match="does not exist"):
        load_causal_lm(tmp_path / "missing.gguf")
