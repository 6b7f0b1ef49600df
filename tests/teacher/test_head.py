"""Teacher outputs from hidden states block by block (xdistill/teacher/head.py).

* the split path is active for Llama and soft-capped Gemma-3 and gives the values of the plain
  forward for every output kind and temperature;
* peak memory: with a 262,144-token vocabulary the worker holds one full-size logits buffer (its
  output), not the model's logits plus soft-cap temporaries besides it (measured in subprocesses).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from xdistill.student.model import build_causal_lm
from xdistill.teacher import TeacherConfig, TeacherRequest, TeacherWorker
from xdistill.teacher.outputs import LOGP_TINY

GEMMA = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=8, max_position_embeddings=128,
             final_logit_softcapping=3.0, sliding_window=16)
LLAMA = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, max_position_embeddings=128)


def _save(tmp_path, kind: str, cfg: dict, V: int) -> str:
    model = build_causal_lm(kind, dict(cfg, vocab_size=V), seed=0)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(40.0)  # logits large enough to be soft-capped
    path = tmp_path / kind
    model.save_pretrained(str(path))
    return str(path)


@pytest.mark.parametrize("kind,cfg", [("gemma3_text", GEMMA), ("llama", LLAMA)])
@pytest.mark.parametrize("output", ["logits", "topk", "projected", "support"])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_split_head_equals_the_plain_forward(tmp_path, kind, cfg, output, temperature):
    V = 300
    path = _save(tmp_path, kind, cfg, V)
    proj = None
    if output == "projected":
        proj = torch.eye(V)[: V // 2].repeat_interleave(1, 0).to_sparse_csr()
    if output == "support":  # student token s -> teacher ids 3s+1 (every third column)
        proj = torch.zeros(V // 3, V)
        proj[torch.arange(V // 3), torch.arange(V // 3) * 3 + 1] = 1.0
        proj = proj.to_sparse_csr()
    tc = TeacherConfig(name="t", model=path, output=output, top_k=7, temperature=temperature,
                       micro_batch_size=2)
    worker = TeacherWorker(tc, proj)
    assert worker.split is not None
    ids = torch.randint(0, V, (3, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids, dtype=torch.bool)
    got = worker.forward(TeacherRequest(0, ids, mask))
    worker.split = None  # the plain forward + fill_output
    ref = worker.forward(TeacherRequest(0, ids, mask))
    for name in ("logits_BTtV", "topk_logp_BTtK", "topk_idx_BTtK", "tail_logmass_BTt",
                 "proj_logp_BTtVs", "support_logits_BTtS", "token_logp_BTt"):
        a, b = getattr(got, name), getattr(ref, name)
        assert (a is None) == (b is None), name
        if a is not None:
            if a.dtype.is_floating_point:
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)
            else:
                assert torch.equal(a, b), name


_PEAK = """
import json, sys, torch
from xdistill.teacher import TeacherConfig, TeacherRequest, TeacherWorker

def hwm_kib():  # this process's own peak RSS (getrusage's ru_maxrss keeps the parent's from fork)
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
torch.set_num_threads(1)
w = TeacherWorker(TeacherConfig(name="t", model=sys.argv[1], micro_batch_size=4))
if sys.argv[2] == "plain":
    w.split = None
ids = torch.randint(0, 262144, (4, 64), generator=torch.Generator().manual_seed(0))
req = TeacherRequest(0, ids, torch.ones_like(ids, dtype=torch.bool))
w.forward(TeacherRequest(0, ids[:1, :4], torch.ones(1, 4, dtype=torch.bool)))  # warm-up
before = hwm_kib()
out = w.forward(req)
after = hwm_kib()
print(json.dumps({"growth_mb": (after - before) / 1024, "split": w.split is not None}))
"""


def test_262k_vocab_teacher_holds_one_logits_buffer(tmp_path):
    path = _save(tmp_path, "gemma3_text", dict(GEMMA, num_hidden_layers=1), 262144)
    full_mb = 4 * 64 * 262144 * 4 / 2 ** 20   # one float32 [B, T, V]: 256 MiB
    res = {}
    for mode in ("split", "plain"):
        proc = subprocess.run([sys.executable, "-c", _PEAK, path, mode], capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        res[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["split"]["split"] and not res["plain"]["split"]
    print(f"\npeak growth: split {res['split']['growth_mb']:.0f} MiB, plain "
          f"{res['plain']['growth_mb']:.0f} MiB, one [B,T,V] float32 = {full_mb:.0f} MiB")
    assert res["split"]["growth_mb"] < 1.6 * full_mb  # the buffer + at most half of it in blocks
    assert res["plain"]["growth_mb"] > res["split"]["growth_mb"] + 0.5 * full_mb


@pytest.mark.parametrize("kind,cfg", [("gemma3_text", GEMMA), ("llama", LLAMA)])
def test_bf16_teacher_head_writes_float32_from_bf16_hidden_states(tmp_path, kind, cfg):
    """bfloat16 weights, float32 outputs: the split stays active (its check allows bf16
    rounding), logits are float32 and within bf16 rounding of the model's own bf16 forward, and
    the token log-probs equal a float64 log-softmax of those float32 logits."""
    V = 300
    path = _save(tmp_path, kind, cfg, V)
    worker = TeacherWorker(TeacherConfig(name="t", model=path, dtype="bfloat16",
                                         micro_batch_size=2))
    assert worker.split is not None and worker.info.logits_dtype == torch.float32
    ids = torch.randint(0, V, (3, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids, dtype=torch.bool)
    got = worker.forward(TeacherRequest(0, ids, mask))
    assert got.logits_BTtV.dtype == torch.float32
    with torch.no_grad():
        own = worker.model(input_ids=ids, attention_mask=mask.long()).logits.float()
    scale = float(own.abs().max())
    assert float((got.logits_BTtV - own).abs().max()) <= 2.0 ** -7 * scale + 1e-5
    logp = got.logits_BTtV.double().log_softmax(-1)
    want = logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1).clamp(min=LOGP_TINY)
    torch.testing.assert_close(got.token_logp_BTt[:, 1:].double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind,cfg", [("gemma3_text", GEMMA), ("llama", LLAMA)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_support_output_is_the_logits_at_the_support(tmp_path, kind, cfg, dtype):
    """``output: support``: the head computes only the support's columns (its restricted
    weight has S rows), giving the full logits' values there (float32 outputs from bf16
    weights too, within the bf16 head's rounding), and no token log-probs."""
    V = 300
    path = _save(tmp_path, kind, cfg, V)
    cols = torch.tensor([0, 7, 8, 31, 150, 299])
    proj = torch.zeros(4, V)
    proj[[0, 1, 1, 2, 3, 3], cols] = torch.tensor([1.0, 0.5, 0.5, 1.0, 0.25, 0.75])
    common = dict(name="t", model=path, dtype=dtype, micro_batch_size=2)
    sup = TeacherWorker(TeacherConfig(output="support", **common), proj.to_sparse_csr())
    full = TeacherWorker(TeacherConfig(output="logits", **common))
    assert sup.split is not None and sup.split.V == len(cols)
    assert sup.info.support_size == len(cols)
    ids = torch.randint(0, V, (3, 11), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids, dtype=torch.bool)
    got = sup.forward(TeacherRequest(0, ids, mask))
    ref = full.forward(TeacherRequest(0, ids, mask)).logits_BTtV[..., cols]
    assert got.kind == "support" and got.token_logp_BTt is None
    assert got.support_logits_BTtS.dtype == torch.float32
    # float32: the restricted head is another GEMM shape, so its sums may differ by a few ulps
    # (1.4e-6 on a logit of 4.9 seen on an AMD EPYC); a wrong column differs by O(1)
    tol = 1e-6 if dtype == "float32" else 2.0 ** -8 * float(ref.abs().max())
    rtol = 1e-5 if dtype == "float32" else 0.0
    torch.testing.assert_close(got.support_logits_BTtS, ref, rtol=rtol, atol=tol)


def test_support_output_needs_a_projection_that_fits(tmp_path):
    from xdistill.errors import TeacherError

    path = _save(tmp_path, "llama", LLAMA, 300)
    with pytest.raises(TeacherError, match="output 'support' needs a projection"):
        TeacherWorker(TeacherConfig(name="t", model=path, output="support"))
    wide = torch.zeros(2, 400)
    wide[0, 350] = wide[1, 3] = 1.0
    with pytest.raises(TeacherError, match="400 teacher columns but the teacher model emits "
                                           "only 300"):
        TeacherWorker(TeacherConfig(name="t", model=path, output="support"), wide.to_sparse_csr())


@pytest.mark.gpu
@pytest.mark.parametrize("output", ["logits", "topk", "support"])
def test_a_gpu_teacher_writes_into_host_buffers(tmp_path, output):
    """A CUDA teacher behind the shm or Ray transport writes into host (CPU) slot buffers: each
    block is computed on the GPU and copied, the same values as into GPU buffers. (Needs a GPU:
    the device mismatch it guards against cannot occur on a CPU-only machine.)"""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    V = 300
    path = _save(tmp_path, "llama", LLAMA, V)
    proj = None
    if output == "support":
        proj = torch.zeros(V // 3, V)
        proj[torch.arange(V // 3), torch.arange(V // 3) * 3 + 1] = 1.0
        proj = proj.to_sparse_csr()
    worker = TeacherWorker(TeacherConfig(name="t", model=path, output=output, top_k=7,
                                         device="cuda", dtype="float32", micro_batch_size=2), proj)
    assert worker.split is not None
    ids = torch.randint(0, V, (3, 11), generator=torch.Generator().manual_seed(1))
    request = TeacherRequest(0, ids, torch.ones_like(ids, dtype=torch.bool))
    on_host, on_gpu = worker.forward(request, device="cpu"), worker.forward(request)
    for name, value in vars(on_host).items():
        if isinstance(value, torch.Tensor):
            assert value.device.type == "cpu", name
            torch.testing.assert_close(value, getattr(on_gpu, name).cpu(), rtol=1e-5, atol=1e-5)
