"""Review s25 (teacher workers): each test demonstrates a defect and FAILS on the reviewed code.

Legend: B batch, Tt teacher tokens, V teacher logit width (lm_head rows), Vt the projection's
teacher columns (the tokenizer's ids), Vs student vocabulary.

Checked against float64 references and found correct (no test kept): top-k values, ids and the
tail log-mass (also for confident teachers whose tail is 1e-9 .. 1e-38: float32-relative
accuracy), projected log-probs at T = 0.7, 1, 2, logits at temperature, token_logp, the
``logits_dtype`` of ``logits`` / ``support`` outputs (float32 / bfloat16 / float16, split head and
plain forward, float32 and bfloat16 weights), padding (each row equals its unpadded forward,
fully padded rows stay finite, sdpa and eager) and micro-batch splits (1, 3, 8 rows) for Llama,
Qwen2 (sliding window too), GPT-2, Phi, Gemma-2 and Gemma-3; the shared-memory transport over 60
random prepare/publish/read rounds (kinds, dtypes, growth and shrinking of both slots); a pool of
two in-process teachers with one failing (slots released, the next step works).
"""

from __future__ import annotations

import math

import pytest
import torch

from teacher_fakes import random_projection
from xdistill.errors import ConfigError
from xdistill.student.model import build_causal_lm
from xdistill.teacher import TeacherConfig, TeacherRequest, TeacherWorker
from xdistill.teacher.outputs import LOGP_TINY


# ------------------------------------------------------------------------- config validation
@pytest.mark.parametrize("field, value", [
    ("temperature", math.nan),        # `<= 0` lets NaN through: every output is NaN
    ("timeout_s", math.nan),          # `<= 0` lets NaN through: a hung worker is never killed
    ("startup_timeout_s", math.nan),  # same for a worker hung while loading
    ("num_threads", -1),              # "0 = torch's default": -1 silently means the default
])
def test_nan_and_negative_teacher_values_are_refused_naming_the_field(field, value):
    """Expected: ``TeacherConfig.validate`` refuses a NaN temperature / timeout and a negative
    ``num_threads`` with a ConfigError naming the field (YAML loading accepts ``.nan``, and the
    train config already refuses NaN and negative counts this way, see test_review_train_s25).

    Actual: xdistill/teacher/config.py compares with ``self.temperature <= 0`` and
    ``self.timeout_s <= 0 or self.startup_timeout_s <= 0``, which NaN passes, and never looks at
    ``num_threads``. A NaN temperature turns every teacher output into NaN (the run then stops
    on non-finite steps blaming the teacher's outputs); a NaN ``timeout_s`` makes
    ``SubprocessClient._recv``'s ``remaining <= 0`` never true, so a hung worker blocks
    ``collect`` forever, the very thing the timeout exists to prevent; ``num_threads: -1``
    silently runs with torch's default thread count."""
    cfg = TeacherConfig(name="t", **{field: value})
    with pytest.raises(ConfigError, match=field):
        cfg.validate()


# ------------------------------------------------------------- projected output, padded vocab
_VT, _V, _VS = 280, 300, 40   # tokenizer ids, lm_head rows (20 padded rows), student vocab


def _padded_vocab_teacher(tmp_path) -> str:
    """A tiny Phi checkpoint (its lm_head has a bias) with 20 padded output rows, never trained:
    their bias puts their logits ~120 nats above the real ones."""
    model = build_causal_lm("phi", dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, max_position_embeddings=64,
                                        vocab_size=_V), seed=0)
    with torch.no_grad():
        model.lm_head.bias[_VT:] = 120.0
    path = tmp_path / "phi_padded"
    model.save_pretrained(str(path))
    return str(path)


def test_projected_output_of_a_padded_vocabulary_teacher_is_its_real_columns_distribution(
        tmp_path):
    """Expected (xdistill/teacher/outputs.py module doc): ``proj_logp = log(normalise(proj @
    softmax(z / T)))`` where "teacher logit columns beyond the projection's Vt (padded embedding
    rows) carry no mapping and are dropped before renormalising", "so the result is a
    distribution even when the projection drops mass". By that definition the result depends
    only on the first Vt logits (the renormalisation cancels the padded rows' share), and a
    float64 reference gives a proper distribution over the student vocabulary.

    Actual: ``projected_logprobs`` takes ``softmax`` over all V columns in float32 *before*
    slicing ``[:, :Vt]``. When the padded rows' logits are far above the real ones (here ~120
    nats: untrained padded rows, or a confident teacher at a low temperature), every real
    column's probability underflows to 0, the mass ``m`` is 0 and every student log-prob is
    floored at LOGP_TINY: the output is ~84 nats off the reference at every position and sums to
    ~5e-37 instead of 1 (the same happens once the real columns are more than ~88 nats below
    the padded ones). A NaN in a padded row likewise turns every output into NaN although
    those columns are dropped. Fix: softmax over ``logits[:, :Vt]`` only (identical after the
    renormalisation), ideally stabilised by the maximum over the projection's support columns so
    that unmapped columns within Vt cannot underflow the mapped ones either."""
    proj_VsVt = random_projection(_VS, _VT, seed=0)
    worker = TeacherWorker(TeacherConfig(name="t", model=_padded_vocab_teacher(tmp_path),
                                         dtype="float32", output="projected"), proj_VsVt)
    assert worker.vocab_size == _V
    ids = torch.randint(0, _VT, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids, dtype=torch.bool)
    got = worker.forward(TeacherRequest(0, ids, mask)).proj_logp_BTtVs.double()
    with torch.no_grad():
        z = worker.model(input_ids=ids, attention_mask=mask.long()).logits.double()
    q = torch.softmax(z, dim=-1)[..., :_VT]
    m = q @ proj_VsVt.to_dense().double().T
    want = (m / m.sum(dim=-1, keepdim=True)).log().clamp(min=LOGP_TINY)
    err = float((got - want).abs().max())
    total = got.exp().sum(dim=-1)
    assert err <= 1e-4, (f"proj_logp is {err:.1f} nats off the float64 reference; each position "
                         f"sums to {float(total.max()):.2g} instead of 1")
