"""Every response byte is supervised or counted: a student that emits invalid UTF-8.

A byte-level student (GPT-2) can sample a lone lead byte of a multi-byte character. Its bytes:

* reach a byte-level teacher (Qwen2) as the teacher's own single-byte token, so they form an
  ordinary aligned chunk and get the teacher's (low) log-prob as their loss;
* cannot be spelled by an uncased WordPiece teacher (BERT has no raw-byte tokens): the student
  token is *unpaired*, counted in ``unaligned_frac``, and still gets a loss -- the floor penalty
  (policy-gradient form with the teacher's log-prob taken to be ``logp_min``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rollout_helpers import tiny_llama
from xdistill.data import TeacherTokenization
from xdistill.losses import ChunkAlignment
from xdistill.losses.onpolicy import Clamps, OnPolicyLossSpec, onpolicy_loss
from xdistill.rollout import RolloutScorer
from xdistill.rollout.engine import Rollouts, _right_pad
from xdistill.rollout.teacher_text import single_byte_tokens


def _rollout_with_lone_byte(tok):
    """'Answer:' -> ' ab' + <0xE4> + ' cd' + EOS (the lone byte is a GPT-2 byte token)."""
    lone = int(single_byte_tokens(tok)[0xE4])
    assert lone >= 0
    resp = np.concatenate([tok.encode(" ab").ids, [lone], tok.encode(" cd").ids, [tok.eos_id]])
    prompt = np.asarray(tok.encode("Answer:").ids)
    p_ids, p_len = _right_pad([prompt], 0)
    r_ids, r_len = _right_pad([resp.astype(np.int64)], 0)
    mask = torch.ones(r_ids.shape, dtype=torch.bool)
    ro = Rollouts(("Answer:",), p_ids, p_len, r_ids, r_len, mask, torch.zeros(r_ids.shape),
                  1.0, 1.0, ("stop",))
    return ro, int(prompt.size) + 1  # row position of the lone byte token


def _spec(kind: str, **kw) -> OnPolicyLossSpec:
    # no log-prob floor on the sampled estimators: the random 50k-way student sits near
    # log(1/50257) < -10, where the floor would block the gradient being checked
    return OnPolicyLossSpec(kind, clamps=Clamps(logp_min=None), **kw)


def _grad_at(view, batch, pos: int, spec) -> float:
    """Gradient of the loss w.r.t. the student logits row that predicts token ``pos``."""
    V = int(batch.input_ids_BTs.max()) + 1
    model = tiny_llama(max(V, 50257), seed=0)
    z = model(input_ids=batch.input_ids_BTs).logits.detach().requires_grad_()
    t_logp = torch.full(view.input_ids_BTt.shape, -11.0)  # near the random student: no clamp fires
    out = onpolicy_loss(spec, z, batch.input_ids_BTs, batch.loss_mask_BTs,
                        align=ChunkAlignment.from_view(view), t_loss_mask_BTt=view.loss_mask_BTt,
                        teacher_token_logp_BTt=t_logp, unpaired_BTs=view.s_unpaired_BTs)
    out.loss.backward()
    return float(z.grad[0, pos - 1].abs().sum()), out


@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_lone_byte_reaches_a_byte_level_teacher_as_its_byte_token(get_tokenizer, kind):
    s, t = get_tokenizer("gpt2"), get_tokenizer("qwen2")
    ro, pos = _rollout_with_lone_byte(s)
    scored = RolloutScorer(s, [TeacherTokenization("q", t, None)])(ro)
    view = scored.batch.teacher("q")
    assert view.s_chunk_BTs[0, pos] >= 0 and not view.s_unpaired_BTs.any()
    assert scored.stats.unaligned_frac["q"] == 0.0 and scored.stats.missing_bytes["q"] == 0
    g, _ = _grad_at(view, scored.batch, pos, _spec(kind))
    assert g > 0


@pytest.mark.parametrize("kind", ["k1", "k3", "dpca"])
def test_byte_the_teacher_cannot_spell_is_unpaired_and_penalised(get_tokenizer, kind):
    s, t = get_tokenizer("gpt2"), get_tokenizer("bert")
    ro, pos = _rollout_with_lone_byte(s)
    scored = RolloutScorer(s, [TeacherTokenization("b", t, None)])(ro)
    view = scored.batch.teacher("b")
    assert bool(view.s_unpaired_BTs[0, pos]) and int(view.s_unpaired_BTs.sum()) == 1
    assert scored.stats.missing_bytes["b"] == 1
    assert scored.stats.unaligned_frac["b"] == pytest.approx(1 / 8)  # 1 of 7 bytes + the stop
    assert not view.s_unpaired_BTs[0, -1]  # BERT has no end token: the stop is not penalised
    spec = _spec(kind)
    if kind == "dpca":
        return  # dpca needs behaviour log-probs: covered by the trainer test below
    g, out = _grad_at(view, scored.batch, pos, spec)
    assert g > 0 and out.counters["unpaired"] == 1
    g0, out0 = _grad_at(view, scored.batch, pos, _spec(kind, unpaired="ignore"))
    assert g0 == 0.0 and out0.units == out.units - 1
