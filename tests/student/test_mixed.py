"""One-process mixed precision (xdistill/student/mixed.py): bf16 compute, float32 master weights.

* the forward equals, bit for bit, the same model with its parameters cast to bfloat16 (buffers
  kept), for Llama, Gemma-3, GPT-2 and Qwen2; gradients land in float32 on the master weights;
* activation checkpointing recomputes through the same casts; without autograd the copies are
  cached until an optimizer step changes the weights;
* a tiny AdamW run (tests/distributed_helpers.py, the loop the FSDP2 tests use) keeps float32
  master weights, gradients and optimizer state, and its losses match float32 within 1e-3
  relative (measured 0.9-3.3e-5 on 6 steps), its weights within 1e-2 (measured 4.0e-3);
* resume is bitwise under ``param_dtype: auto`` on a CPU that reports AMX (mocked);
* ``master_weights`` scores the float32 masters (the float32 model's logits, bit for bit) and
  puts the bf16 compute back on exit, also after an exception.
"""

from __future__ import annotations

import copy

import pytest
import torch

from distributed_helpers import build_tiny, train
from xdistill import precision
from xdistill.student.config import StudentConfig
from xdistill.student.mixed import apply_shadow_mixed_precision, compute_dtype_of, master_weights
from xdistill.student.model import build_causal_lm
from xdistill.student.parallelize import parallelize_student

SMALL = {
    "llama": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, tie_word_embeddings=True),
    "gemma3_text": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8),
    "gpt2": dict(n_embd=32, n_layer=2, n_head=4, n_positions=64),
    "qwen2": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, tie_word_embeddings=False),
}


def _pair(kind: str):
    """(float32 model with the shadow cast, the same model with bf16 parameters)."""
    model = build_causal_lm(kind, dict(SMALL[kind], vocab_size=120), seed=0).eval()
    ref = copy.deepcopy(model)
    for p in ref.parameters():
        p.data = p.data.to(torch.bfloat16)
    apply_shadow_mixed_precision(model, torch.bfloat16)
    return model, ref


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_forward_equals_the_bf16_model_and_grads_are_float32(kind):
    model, ref = _pair(kind)
    ids = torch.randint(0, 120, (2, 12), generator=torch.Generator().manual_seed(1))
    got, want = model(input_ids=ids).logits, ref(input_ids=ids).logits
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    got.float().square().mean().backward()
    want.float().square().mean().backward()
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32
               for p in model.parameters())
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        # the bf16 model sums a tied weight's two gradients in bf16, the master in float32
        torch.testing.assert_close(p.grad, q.grad.float(), rtol=2e-2, atol=1e-6, msg=name)
    assert set(model.state_dict()) == set(ref.state_dict())
    assert compute_dtype_of(model) == torch.bfloat16


def test_no_grad_copies_are_cached_until_the_weights_change():
    model, _ = _pair("llama")
    ids = torch.randint(0, 120, (1, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a = model(input_ids=ids).logits
        shadow = model._xdistill_mixed_precision
        cached = dict(shadow._cache)
        b = model(input_ids=ids).logits
        assert torch.equal(a, b) and all(shadow._cache[k][1] is v[1] for k, v in cached.items())
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    model(input_ids=ids).logits.float().sum().backward()
    opt.step()
    with torch.no_grad():
        c = model(input_ids=ids).logits
    assert not torch.equal(a, c)
    ref = copy.deepcopy(model)
    ref._xdistill_mixed_precision.remove()
    for p in ref.parameters():
        p.data = p.data.to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(c, ref(input_ids=ids).logits)  # the fresh weights, not a stale copy


def test_a_fused_optimizer_step_invalidates_the_no_grad_copies():
    """torch's fused AdamW (``optim.implementation: auto`` on one process) updates the weights
    without bumping their version counters: with no grad-mode forward in between (gradients from
    elsewhere), a no-grad forward after the step used the pre-step copies."""
    model, _ = _pair("llama")
    ids = torch.randint(0, 120, (1, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before = model(input_ids=ids).logits             # fills the cache
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    with torch.no_grad():
        after = model(input_ids=ids).logits
    model._xdistill_mixed_precision._cache.clear()
    with torch.no_grad():
        fresh = model(input_ids=ids).logits
    assert not torch.equal(before, after) and torch.equal(after, fresh)


def test_activation_checkpointing_through_the_casts():
    cfg = StudentConfig(param_dtype="bfloat16", activation_checkpointing=True)
    plain, _ = build_tiny()
    model, _ = build_tiny()
    parallelize_student(model, None, cfg)
    apply_shadow_mixed_precision(plain, torch.bfloat16)
    ids = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(3))
    la, lb = plain(input_ids=ids, labels=ids).loss, model(input_ids=ids, labels=ids).loss
    la.backward()
    lb.backward()
    assert torch.equal(la, lb)
    grads = {n.replace("._checkpoint_wrapped_module", ""): p.grad for n, p in model.named_parameters()}
    for n, p in plain.named_parameters():
        assert grads[n].dtype == torch.float32
        torch.testing.assert_close(grads[n], p.grad, rtol=0, atol=1e-7)


def test_tiny_run_keeps_float32_master_weights_and_matches_float32(tmp_path):
    """6 AdamW steps, 2 micro-batches each: bf16 compute vs float32. Losses within 1e-3
    relative (bf16 keeps 8 significant bits; measured 0.9-3.3e-5), float32 master weights, and
    the weights really moved differently (bf16 compute happened; max |diff| measured 4.0e-3)."""
    ref = train(str(tmp_path / "f32.pt"), 6, student={"param_dtype": "float32"})
    got = train(str(tmp_path / "bf16.pt"), 6, student={"param_dtype": "bfloat16"})
    assert got == pytest.approx(ref, rel=1e-3)
    a = torch.load(tmp_path / "f32.pt", weights_only=False)["state"]
    b = torch.load(tmp_path / "bf16.pt", weights_only=False)["state"]
    assert all(v.dtype == torch.float32 for v in b.values())
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert 0 < diff < 1e-2


def test_master_weights_grads_and_optimizer_state_stay_float32():
    model, cfg = build_tiny({"param_dtype": "bfloat16"})
    parallelize_student(model, None, cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(4))
    for _ in range(2):
        out = model(input_ids=ids, labels=ids)
        assert out.logits.dtype == torch.bfloat16
        out.loss.backward()
        opt.step()
        opt.zero_grad()
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    states = [v for s in opt.state.values() for v in s.values() if v.dim() > 0]
    assert states and {v.dtype for v in states} == {torch.float32}


def test_resume_is_bitwise_under_auto_with_bf16_units(tmp_path, monkeypatch):
    """param_dtype auto on a CPU that reports AMX (mocked) computes in bf16; a run resumed from
    its step-3 checkpoint ends bitwise equal to the uninterrupted run."""
    monkeypatch.delenv(precision.ENV_OVERRIDE, raising=False)
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: {"amx": True, "avx512_bf16": True})
    model, cfg = build_tiny({"param_dtype": "auto"})
    parallelize_student(model, None, cfg)
    assert compute_dtype_of(model) == torch.bfloat16
    ckpt = tmp_path / "ckpt"
    full = train(str(tmp_path / "full.pt"), 6, save_at=3, ckpt=str(ckpt),
                 student={"param_dtype": "auto"})
    resumed = train(str(tmp_path / "res.pt"), 6, resume=str(ckpt / "step_0000003"),
                    student={"param_dtype": "auto"})
    assert resumed == full[3:]
    a = torch.load(tmp_path / "full.pt", weights_only=False)["state"]
    b = torch.load(tmp_path / "res.pt", weights_only=False)["state"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    f32 = train(str(tmp_path / "f32.pt"), 6, student={"param_dtype": "float32"})
    assert f32 != full  # auto really computed in bf16 here


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_plain_embedding_table_is_never_cast_whole(kind, monkeypatch):
    """A plain nn.Embedding looks up float32 rows and casts them: its table is cast only by a
    tied output head (once per forward), and its gradient is float32 all the way."""
    from xdistill.student import mixed

    model, _ = _pair(kind)
    cast = []
    real = mixed.ShadowCast._cast
    monkeypatch.setattr(mixed.ShadowCast, "_cast",
                        lambda self, p: cast.append(id(p)) or real(self, p))
    emb = model.get_input_embeddings()
    seen = []
    emb.register_forward_hook(lambda m, a, out: seen.append(out.dtype), prepend=True)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.float().sum().backward()
    tied = model.get_output_embeddings().weight is emb.weight
    assert cast.count(id(emb.weight)) == (1 if tied else 0)
    assert seen == [torch.float32]  # the rows before the cast
    assert emb.weight.grad.dtype == torch.float32


def test_master_weights_scores_the_float32_masters_then_restores_bf16():
    model, ref = _pair("llama")
    plain = build_causal_lm("llama", dict(SMALL["llama"], vocab_size=120), seed=0).eval()
    ids = torch.randint(0, 120, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before = model(input_ids=ids).logits
        with master_weights(model) as m:
            assert m is model and compute_dtype_of(model) == torch.bfloat16  # the setting stays
            masters = model(input_ids=ids).logits
        after = model(input_ids=ids).logits
        with pytest.raises(KeyError), master_weights(model):
            raise KeyError("inside")
        again = model(input_ids=ids).logits
        assert masters.dtype == torch.float32
        assert torch.equal(masters, plain(input_ids=ids).logits)
        assert before.dtype == after.dtype == again.dtype == torch.bfloat16
        assert torch.equal(before, after) and torch.equal(before, again)
        assert torch.equal(before, ref(input_ids=ids).logits)
        assert not torch.equal(masters, before.float())


def test_master_weights_leaves_a_float32_model_alone():
    model = build_causal_lm("llama", dict(SMALL["llama"], vocab_size=120), seed=0).eval()
    with master_weights(model) as m:
        assert m is model
        assert {p.dtype for p in model.parameters()} == {torch.float32}
