"""TeacherWorker and the in-process client against a plain forward of the same checkpoint.

Legend: B batch, Tt teacher tokens, V teacher vocabulary, Vs student vocabulary, K top-k.
"""

from __future__ import annotations

import pytest
import torch

from teacher_fakes import random_batch, random_projection, reference_logits
from xdistill.data.batch import TeacherView
from xdistill.errors import ConfigError, TeacherError
from xdistill.teacher import InProcessClient, TeacherConfig, TeacherRequest, TeacherWorker
from xdistill.teacher.outputs import projected_logprobs, projection_on_device, topk_logprobs

VOCAB = {"llama": 1000, "qwen2": 900, "gpt2": 800}


def _view(name, ids, mask):
    z = torch.zeros_like(ids)
    return TeacherView(name=name, input_ids_BTt=ids, attention_mask_BTt=mask, loss_mask_BTt=mask,
                       s_chunk_BTs=z, t_chunk_BTt=z, chunk_valid_BC=mask, chunk_exact_BC=mask)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_full_logits_match_plain_forward_with_micro_batches(tiny_models, arch):
    ids, mask = random_batch(VOCAB[arch], B=5, Tt=10)
    ref_BTtV = reference_logits(tiny_models[arch], ids, mask)
    cfg = TeacherConfig(name=arch, model=tiny_models[arch], micro_batch_size=2)
    worker = TeacherWorker(cfg)
    out = worker.forward(TeacherRequest(3, ids, mask))
    assert out.kind == "logits" and out.temperature == 1.0 and out.step == 3 and out.name == arch
    assert out.logits_BTtV.shape == (5, 10, VOCAB[arch])
    real = mask[:, :, None].expand_as(ref_BTtV)
    torch.testing.assert_close(out.logits_BTtV[real], ref_BTtV[real], rtol=1e-5, atol=1e-5)


def test_topk_projected_and_temperature(tiny_models):
    ids, mask = random_batch(1000, B=3, Tt=8, seed=1)
    ref_NV = reference_logits(tiny_models["llama"], ids, mask).reshape(-1, 1000)
    base = dict(model=tiny_models["llama"], micro_batch_size=2, temperature=2.0)

    top = TeacherWorker(TeacherConfig(name="t", output="topk", top_k=7, **base))
    out = top.forward(TeacherRequest(0, ids, mask))
    assert out.temperature == 2.0 and out.topk_logp_BTtK.shape == (3, 8, 7)
    v, i, tail = topk_logprobs(ref_NV, 7, 2.0)
    torch.testing.assert_close(out.topk_logp_BTtK.reshape(-1, 7), v, rtol=1e-5, atol=1e-5)
    assert torch.equal(out.topk_idx_BTtK.reshape(-1, 7), i)
    torch.testing.assert_close(out.tail_logmass_BTt.reshape(-1), tail, rtol=1e-4, atol=1e-4)

    proj = random_projection(300, 1000)
    pw = TeacherWorker(TeacherConfig(name="p", output="projected", **base), proj)
    out = pw.forward(TeacherRequest(0, ids, mask))
    assert out.proj_logp_BTtVs.shape == (3, 8, 300)
    ref = projected_logprobs(ref_NV, projection_on_device(proj, "cpu"), 2.0)
    torch.testing.assert_close(out.proj_logp_BTtVs.reshape(-1, 300), ref, rtol=1e-4, atol=1e-4)

    lw = TeacherWorker(TeacherConfig(name="l", **base))
    out_NV = lw.forward(TeacherRequest(0, ids, mask)).logits_BTtV.reshape(-1, 1000)
    torch.testing.assert_close(out_NV, ref_NV / 2.0, rtol=1e-5, atol=1e-5)


def test_bf16_teacher_and_bf16_logits(tiny_models):
    """A bfloat16 teacher writes float32 logits by default (logits_dtype auto), bfloat16 ones
    when asked; both within bf16 rounding of the float32 model."""
    ids, mask = random_batch(1000, B=2, Tt=6)
    ref = reference_logits(tiny_models["llama"], ids, mask)
    real = mask[:, :, None].expand_as(ref)
    for logits_dtype, want in (("auto", torch.float32), ("bfloat16", torch.bfloat16)):
        cfg = TeacherConfig(name="b", model=tiny_models["llama"], dtype="bfloat16",
                            logits_dtype=logits_dtype)
        worker = TeacherWorker(cfg)
        assert next(worker.model.parameters()).dtype == torch.bfloat16
        out = worker.forward(TeacherRequest(0, ids, mask))
        assert out.logits_BTtV.dtype == want
        torch.testing.assert_close(out.logits_BTtV.float()[real], ref[real], rtol=0.1, atol=0.1)


def test_inprocess_client_and_errors(tiny_models):
    ids, mask = random_batch(1000, B=2, Tt=6)
    cfg = TeacherConfig(name="llama", model=tiny_models["llama"], slots=1)
    with InProcessClient(cfg) as client:
        lease = client.forward(_view("llama", ids, mask))
        assert lease.output.logits_BTtV.shape == (2, 6, 1000)
        with pytest.raises(TeacherError, match="all output slots are held"):
            client.submit(_view("llama", ids, mask))
        lease.release()
        with pytest.raises(TeacherError, match="after its slot was released"):
            lease.output
        bad = ids.clone()
        bad[1, 4] = 1000
        with pytest.raises(TeacherError, match="token id 1000 at row 1, position 4"):
            client.forward(_view("llama", bad, mask))
        with pytest.raises(TeacherError, match="got the view of teacher 'other'"):
            client.forward(_view("other", ids, mask))
        # the slot came back after the errors; steps 0 and 1 (bad ids) reached the engine
        with client.forward(_view("llama", ids, mask)) as lease:
            assert lease.output.step == 2
    with pytest.raises(TeacherError, match="'llama' is unusable after an earlier failure: closed"):
        client.submit(_view("llama", ids, mask))   # a closed client says so


def test_config_and_load_errors(tmp_path):
    with pytest.raises(TeacherError, match="does not exist"):
        TeacherWorker(TeacherConfig(model=str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match="temperature"):
        TeacherConfig(temperature=0).validate()
    with pytest.raises(ConfigError, match="needs placement"):
        TeacherConfig(transport="shm").validate()
    with pytest.raises(ConfigError, match="offload"):
        TeacherConfig(placement="subprocess", offload=True).validate()


def test_config_fields_documented():
    from xdistill.config import undocumented_fields

    assert undocumented_fields(TeacherConfig) == []


def test_config_loads_strictly_from_yaml(tmp_path):
    from xdistill.config import load_config

    path = tmp_path / "teacher.yaml"
    path.write_text("name: qwen\nmodel: /ckpt/qwen\nplacement: ray\noutput: topk\ntop_k: 32\n"
                    "ray:\n  num_gpus: 1\n  resources: {teacher_node: 1}\n")
    cfg = load_config(TeacherConfig, path, ["temperature=2.0", "transport=ray"])
    assert (cfg.placement, cfg.output, cfg.top_k, cfg.temperature, cfg.transport) == \
        ("ray", "topk", 32, 2.0, "ray")
    assert cfg.ray.num_gpus == 1.0 and cfg.ray.resources == {"teacher_node": 1.0}
    cfg.validate()
    path.write_text("name: q\nplacment: ray\n")
    with pytest.raises(ConfigError, match="placment"):
        load_config(TeacherConfig, path)
    with pytest.raises(ConfigError, match="placement"):
        load_config(TeacherConfig, None, ["placement=gpu"])
