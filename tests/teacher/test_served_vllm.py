"""The served teacher against a real ``vllm serve`` (vLLM 0.32 CPU, the smollm2-135m asset in
float32): its top-K equals the in-process float32 Hugging Face teacher's, in both request forms,
and a short off-policy run trains with it (loss ``topk_kl``, same tokenizer).

Needs vLLM (``make vllm-env``; ``make test-vllm`` runs this file in ``.venv-vllm``); skipped
elsewhere. One server starts for the module (~40 s on 2 cores) in its own process group, which
is killed at the end.

Legend: B batch, Tt teacher tokens, K top-k.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from xdistill.assets.paths import model_dir
from xdistill.config import from_dict
from xdistill.errors import TeacherError
from xdistill.teacher import TeacherConfig, TeacherRequest, TeacherWorker
from xdistill.teacher.client import make_client
from xdistill.teacher.local_server import start_vllm_server

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vllm is not installed (make vllm-env; make test-vllm runs these)"),
]

REPO = Path(__file__).resolve().parents[2]
K = 20            # vLLM's default --max-logprobs
START_S = 300.0   # deadline for the server to answer /v1/models
# float32 vLLM (its CPU attention, fused q/k/v and gate/up matmuls) vs the float32 HF forward,
# measured on these rows: top-K log-probs and the prompt tokens' log-probs within 1e-4 (9.4e-5
# max), every top-K id equal. The tail, log(1 - sum of 20 probabilities), amplifies that by
# 1 / tail mass: 2e-3 measured where the tail holds >= 1% of the mass
ATOL, TAIL_ATOL = 1e-3, 2e-2
TEXTS = ("The quick brown fox jumps over the lazy dog. It was a sunny day in the park.",
         "To be, or not to be, that is the question:",
         "Once upon a time there lived a king who had three daughters and")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``(url, model folder)`` of a running vLLM server; killed (process group) afterwards."""
    folder = model_dir("smollm2-135m")
    if not (folder / "config.json").is_file():
        pytest.skip("the smollm2-135m asset is not fetched (tools/fetch_assets.py)")
    log = tmp_path_factory.mktemp("vllm_serve") / "serve.log"
    try:
        srv = start_vllm_server(folder, log=log, served_name="smollm2", max_model_len=512,
                                start_timeout_s=START_S)
    except TeacherError as e:
        pytest.fail(str(e))
    try:
        yield srv.url, str(folder)
    finally:
        srv.stop()


def _rows(folder: str):
    from xdistill.tokenization import load_tokenizer

    tok = load_tokenizer(folder)
    rows = [tok.encode(t).ids for t in TEXTS]
    ids = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for b, r in enumerate(rows):
        ids[b, :len(r)], mask[b, :len(r)] = torch.tensor(r), True
    return ids, mask


@pytest.mark.parametrize("protocol", ["vllm", "echo"])
def test_served_topk_equals_hf_teacher(server, protocol):
    url, folder = server
    ids, mask = _rows(folder)
    ref = TeacherWorker(TeacherConfig(name="t", model=folder, output="topk", top_k=K,
                                      dtype="float32")).forward(TeacherRequest(0, ids, mask))
    cfg = from_dict(TeacherConfig, {"name": "t", "model": folder, "placement": "served",
                                    "output": "topk", "top_k": K,
                                    "served": {"url": url, "protocol": protocol}})
    with make_client(cfg) as client, client.forward(TeacherRequest(0, ids, mask)) as lease:
        out = lease.output.clone()
    m = mask
    assert torch.equal(out.topk_idx_BTtK[m][:, 0], ref.topk_idx_BTtK[m][:, 0])
    same = (out.topk_idx_BTtK[m] == ref.topk_idx_BTtK[m]).float().mean().item()
    assert same > 0.98, same   # near-ties may swap places; the values must still agree
    torch.testing.assert_close(out.topk_logp_BTtK[m], ref.topk_logp_BTtK[m], rtol=0, atol=ATOL)
    torch.testing.assert_close(out.token_logp_BTt[m], ref.token_logp_BTt[m], rtol=0, atol=ATOL)
    big = m & (ref.tail_logmass_BTt > math.log(0.01))
    torch.testing.assert_close(out.tail_logmass_BTt[big], ref.tail_logmass_BTt[big], rtol=0,
                               atol=TAIL_ATOL)


def test_offpolicy_run_with_served_teacher(server, tmp_path):
    """Three steps of the off-policy trainer (fresh tiny student with the teacher's tokenizer,
    loss topk_kl) with the served smollm2 teacher."""
    import xdistill.tiny as mk

    url, folder = server
    train, _ = mk.make_corpus(tmp_path / "corpus", n_train=12, n_eval=2, max_chars=300)
    student = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                   tie_word_embeddings=True)
    cfg = {
        "student": {"model_type": "llama", "model_config": student, "init_seed": 0},
        "student_tokenizer": folder,
        "teachers": [{"name": "served", "tokenizer": folder,
                      "worker": {"model": folder, "placement": "served", "output": "topk",
                                 "top_k": K, "served": {"url": url}},
                      "loss": {"kind": "topk_kl", "weight": 1.0}}],
        "data": {"paths": [str(train)], "seq_len": 32, "batch_size": 2, "num_workers": 0},
        "loss": {"ce_weight": 0.1, "chunk_size": 64},
        "optim": {"lr": 1.0e-2, "weight_decay": 0.0, "grad_clip": 1.0},
        "scheduler": {"kind": "cosine", "warmup_steps": 1, "min_lr_ratio": 0.1},
        "train": {"steps": 3, "global_batch_size": 2, "out_dir": str(tmp_path / "run"),
                  "tensorboard": False, "num_threads": 1},
        "checkpoint": {"every": 0, "export_hf": False},
        "eval": {"every": -1},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "xdistill.cli", "train", "offpolicy", "--config",
                           str(path)], env=env, cwd=str(REPO), capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "teacher 'served' ready: served" in proc.stderr
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if "loss" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) and r["served/loss"] > 0 for r in records), records
