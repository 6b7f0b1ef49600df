"""Review of xdistill/teacher (session 23): defects found, one failing test each.

Legend: B batch, Tt teacher tokens, V teacher vocabulary.

Both defects come from the same shortcut in ``xdistill.teacher.head.fill_from_hidden``: at
temperature 1 a ``logits`` (or ``support``) output is written *directly* into the output buffer
(``direct = ... temperature == 1.0 ...``), whatever that buffer's dtype. With
``logits_dtype: bfloat16`` the buffer is bfloat16, so

* the float32 ``token_logp_BTt`` is computed from the bfloat16-rounded logits read back from the
  buffer (``zf = split.logits(h, block).float()`` with ``block = dst_NV[a:b]``), not from the
  float32 logits (the plain forward path and the same head at T != 1 use the float32 logits);
* a soft-capped (Gemma 2/3) head applies ``div_/tanh_/mul_`` in place *in bfloat16* (three more
  roundings), although ``SplitHead.logits`` documents "the soft-cap is then applied in float32".
"""

from __future__ import annotations

import torch

from xdistill.student.model import build_causal_lm
from xdistill.teacher import TeacherConfig, TeacherRequest, TeacherWorker
from xdistill.teacher.outputs import LOGP_TINY

_LLAMA = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, max_position_embeddings=128)
_GEMMA = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, head_dim=8, max_position_embeddings=128,
              final_logit_softcapping=30.0, sliding_window=16)
_V = 300


def _save_scaled(tmp_path, kind: str, cfg: dict) -> str:
    """A tiny random checkpoint whose logits are O(10) (as a trained model's are)."""
    model = build_causal_lm(kind, dict(cfg, vocab_size=_V), seed=0)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(40.0)
    path = tmp_path / kind
    model.save_pretrained(str(path))
    return str(path)


def _batch():
    ids = torch.randint(0, _V, (3, 11), generator=torch.Generator().manual_seed(1))
    return ids, torch.ones_like(ids, dtype=torch.bool)


def test_review_s23_bf16_logits_dtype_keeps_token_logp_from_float32_logits(tmp_path):
    """Defect: with ``logits_dtype: bfloat16`` at temperature 1, the split head computes the
    (float32) ``token_logp_BTt`` from the logits *after* they were rounded to bfloat16 in the
    output buffer. On this tiny Llama (logits up to ~14) token_logp is off by ~0.02 nats from
    ``log_softmax(z)[next id]`` of the model's own float32 logits, while the plain forward path
    (``fill_output``) and the very same head at T = 2 give it to float32 accuracy (diff 0).
    The config promises only that the *logits* carry ~bf16 rounding; token_logp is documented as
    float32 ``z_id / T - logsumexp(z / T)`` (k1/k3 on-policy estimators read it).

    Expected: token_logp within float32 noise (1e-4) of the float64 reference from the float32
    logits. Suggested fix: xdistill/teacher/head.py, ``fill_from_hidden``: take the ``direct``
    shortcut only when ``dst_NV.dtype == torch.float32`` (otherwise compute the float32 block and
    copy it into the output, as the T != 1 branch already does)."""
    path = _save_scaled(tmp_path, "llama", _LLAMA)
    worker = TeacherWorker(TeacherConfig(name="t", model=path, dtype="float32",
                                         logits_dtype="bfloat16", micro_batch_size=2))
    assert worker.split is not None and worker.info.logits_dtype == torch.bfloat16
    ids, mask = _batch()
    got = worker.forward(TeacherRequest(0, ids, mask))
    with torch.no_grad():
        z = worker.model(input_ids=ids, attention_mask=mask.long()).logits.double()
    want = z.log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    want = want.clamp(min=LOGP_TINY)
    err = float((got.token_logp_BTt[:, 1:].double() - want).abs().max())
    assert err <= 1e-4, (f"token_logp_BTt is {err:.4f} nats off the float32 model's log-probs "
                         "(computed from bf16-rounded logits)")


def test_review_s23_bf16_logits_dtype_softcap_is_applied_in_float32(tmp_path):
    """Defect: for a soft-capped head (Gemma 2/3, ``final_logit_softcapping``) with float32
    weights and ``logits_dtype: bfloat16`` at temperature 1, ``SplitHead.logits`` writes the
    matmul into the bfloat16 output block and then soft-caps it in place in bfloat16
    (``z.div_(c).tanh_().mul_(c)``): four roundings instead of one. Here ~10% of the logits are
    off the model's own float32 logits by more than one bfloat16 rounding (2^-8 relative; up to
    ~1% relative, 2 ulps), whereas the plain forward (``fill_output``) and the same head at
    T != 1 round the float32 soft-capped logit once. ``SplitHead.logits`` documents "the
    soft-cap is then applied in float32"; the config documents only bf16 rounding of each logit.
    The same happens for ``output: support`` (``_fill_logits``).

    Expected: every logit within one bf16 rounding of the float32 model logit. Suggested fix:
    xdistill/teacher/head.py, ``fill_from_hidden`` / ``_fill_logits``: write directly only into
    a float32 (or weights-dtype) buffer, else compute the block in float32 and copy it; or apply
    the soft-cap in ``SplitHead.logits`` to a float32 temporary before storing."""
    path = _save_scaled(tmp_path, "gemma3_text", _GEMMA)
    worker = TeacherWorker(TeacherConfig(name="t", model=path, dtype="float32",
                                         logits_dtype="bfloat16", micro_batch_size=2))
    assert worker.split is not None and worker.split.softcap == 30.0
    ids, mask = _batch()
    got = worker.forward(TeacherRequest(0, ids, mask)).logits_BTtV.float()
    with torch.no_grad():
        z = worker.model(input_ids=ids, attention_mask=mask.long()).logits.float()
    bad = (got - z).abs() > 2.0 ** -8 * z.abs() + 1e-6
    assert int(bad.sum()) == 0, (f"{int(bad.sum())} of {bad.numel()} logits are off by more "
                                 "than one bf16 rounding (soft-cap applied in bfloat16)")
