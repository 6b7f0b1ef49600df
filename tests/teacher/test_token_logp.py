"""``token_logp_BTt``: log q of the teacher's own next input token, for every output kind.

Legend: B batch, Tt teacher tokens, V teacher vocabulary, Vs student vocabulary, K top-k.
Reference: float64 ``log_softmax`` of a plain forward, gathered at the next token.
"""

from __future__ import annotations

import pytest
import torch

from teacher_fakes import random_batch, random_projection, reference_logits
from xdistill.teacher import TeacherConfig, TeacherRequest, TeacherWorker
from xdistill.teacher.outputs import fill_output, next_token_logprobs, output_spec


def _reference(logits_BTtV, ids_BTt, T):
    lp = torch.log_softmax(logits_BTtV.double() / T, dim=-1)
    out = torch.zeros(ids_BTt.shape, dtype=torch.float64)
    out[:, 1:] = lp[:, :-1].gather(2, ids_BTt[:, 1:, None]).squeeze(2)
    return out


@pytest.mark.parametrize("kind", ["logits", "topk", "projected"])
def test_worker_token_logp_every_kind(tiny_models, kind):
    ids, mask = random_batch(1000, B=4, Tt=9, seed=2)
    ref = _reference(reference_logits(tiny_models["llama"], ids, mask), ids, 1.5)
    cfg = TeacherConfig(name="t", model=tiny_models["llama"], output=kind, top_k=5,
                        micro_batch_size=3, temperature=1.5)
    proj = random_projection(40, 1000) if kind == "projected" else None
    out = TeacherWorker(cfg, proj).forward(TeacherRequest(0, ids, mask))
    assert out.token_logp_BTt.shape == (4, 9) and out.token_logp_BTt.dtype == torch.float32
    assert torch.all(out.token_logp_BTt[:, 0] == 0)
    torch.testing.assert_close(out.token_logp_BTt[mask].double(), ref[mask], rtol=1e-5, atol=1e-5)
    assert "token_logp_BTt" in out.tensors() and out.clone().token_logp_BTt is not None


def test_next_token_logprobs_blocks_and_floor(monkeypatch):
    """Block boundaries (tiny blocks) change nothing; a zero-probability token is floored."""
    import xdistill.teacher.outputs as outputs

    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 7, 11, generator=g, dtype=torch.float64).float()
    ids = torch.randint(0, 11, (3, 7), generator=g)
    full = next_token_logprobs(z, ids, 1.0)
    monkeypatch.setattr(outputs, "_CHUNK_BYTES", 4 * 11 * 2)  # 2 rows per block
    torch.testing.assert_close(next_token_logprobs(z, ids, 1.0), full)
    torch.testing.assert_close(full.double(), _reference(z, ids, 1.0), rtol=1e-5, atol=1e-6)
    z[0, 0, ids[0, 1]] = float("-inf")
    assert next_token_logprobs(z, ids, 1.0)[0, 1] == pytest.approx(outputs.LOGP_TINY)


def test_fill_output_needs_ids():
    spec = output_spec("topk", 1, 4, 6, top_k=2)
    assert spec["token_logp_BTt"] == ((1, 4), torch.float32)
    out = {n: torch.empty(s, dtype=d) for n, (s, d) in spec.items()}
    with pytest.raises(ValueError, match="ids_nT"):
        fill_output("topk", torch.randn(1, 4, 6), out, slice(0, 1), temperature=1.0, top_k=2)
