"""The real pair through the trainers: SmolLM2-135M student, Gemma-3-270M teacher.

* off-policy: P-KL, ALM, exact-pair KL (Gemma, three workers, each with its own <bos>) and a
  same-tokenizer teacher (SmolLM2 itself) in one multi-teacher run: every term finite with units;
* resume: 2 steps + checkpoint, then a fresh process resuming to 3 == 3 steps in one go (bitwise);
* the Hugging Face export reloads in plain transformers and greedy-generates the same text as the
  student of the last checkpoint;
* on-policy: the student samples, Gemma scores its own rendering of each sample (dpca and escd).

Short sequences keep each step at a few seconds on 2 cores.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from xdistill.assets import model_dir
from xdistill.config import from_dict
from xdistill.metrics import read_metrics

pytestmark = [pytest.mark.real, pytest.mark.integration]

STUDENT, TEACHER = "smollm2-135m", "gemma3-270m"


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    from xdistill.projection import BuildConfig, build_projection, save_projection
    from xdistill.tiny import make_corpus
    from xdistill.tokenization import load_tokenizer

    root = tmp_path_factory.mktemp("real_train")
    train, evald = make_corpus(root / "corpus", n_train=24, n_eval=4, max_chars=300)
    proj = build_projection(load_tokenizer(STUDENT), load_tokenizer(TEACHER),
                            BuildConfig(methods=("multitoken", "exact"), top_k=4))
    save_projection(proj, root / "proj.npz")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in (
        "The capital of France is", "Two plus two equals", "Once upon a time,",
        "The opposite of hot is")), encoding="utf-8")
    return {"train": str(train), "eval": str(evald), "proj": str(root / "proj.npz"),
            "prompts": str(prompts), "student": str(model_dir(STUDENT)),
            "teacher": str(model_dir(TEACHER))}


def _teacher(name: str, r: dict, kind: str, **loss) -> dict:
    if kind == "pkl":
        loss["projection"] = r["proj"]
    return {"name": name, "tokenizer": TEACHER, "add_bos": True,
            "worker": {"model": r["teacher"], "micro_batch_size": 2},
            "loss": {"kind": kind, **loss}}


def _offpolicy(r: dict, out: Path, teachers: list, steps: int = 2, **train) -> dict:
    return {"student": {"path": r["student"]}, "student_tokenizer": STUDENT,
            "teachers": teachers,
            "data": {"paths": [r["train"]], "seq_len": 24, "batch_size": 2, "num_workers": 0},
            "loss": {"ce_weight": 0.1, "chunk_size": 32},
            "optim": {"lr": 1e-4}, "scheduler": {"kind": "constant"},
            "train": {"steps": steps, "out_dir": str(out), "tensorboard": False,
                      "num_threads": 2, **train},
            "checkpoint": {"every": 0, "resume": "auto", "export_hf": False}}


def test_offpolicy_multi_teacher_every_cross_loss(tmp_path, real):
    from xdistill.train.config import OffPolicyConfig
    from xdistill.train.offpolicy import run_offpolicy

    same = {"name": "self", "tokenizer": STUDENT, "worker": {"model": real["student"]},
            "loss": {"kind": "forward_kl", "weight": 0.5}}
    teachers = [_teacher("pkl", real, "pkl"), _teacher("alm", real, "alm"),
                _teacher("exact", real, "exact_kl"), same]
    run_offpolicy(from_dict(OffPolicyConfig, _offpolicy(real, tmp_path, teachers)))
    recs = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        for name in ("pkl", "alm", "exact", "self"):
            assert math.isfinite(r[f"{name}/loss"]) and r[f"units/{name}"] > 0, (name, r)
        assert r["pkl/coverage"] > 0.8 and r["skipped"] == 0.0


def test_resume_is_bitwise_and_export_generates_like_the_student(tmp_path, real):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from xdistill.student.model import load_causal_lm
    from xdistill.train.checkpoint import latest_checkpoint, load_checkpoint
    from xdistill.train.config import OffPolicyConfig
    from xdistill.train.offpolicy import run_offpolicy

    def cfg(out, steps):
        d = _offpolicy(real, out, [_teacher("pkl", real, "pkl")], steps=steps)
        d["checkpoint"].update(every=2, export_hf=True)
        return from_dict(OffPolicyConfig, d)

    run_offpolicy(cfg(tmp_path / "full", 3))
    run_offpolicy(cfg(tmp_path / "cut", 2))
    run_offpolicy(cfg(tmp_path / "cut", 3))
    wa = load_file(str(tmp_path / "full" / "export" / "model.safetensors"))
    wb = load_file(str(tmp_path / "cut" / "export" / "model.safetensors"))
    assert sorted(wa) == sorted(wb) and all(torch.equal(wa[k], wb[k]) for k in wa)
    # the exported folder in plain transformers vs the last checkpoint's student
    export = str(tmp_path / "full" / "export")
    plain, tok = AutoModelForCausalLM.from_pretrained(export), AutoTokenizer.from_pretrained(export)
    # exported in SmolLM2's own bfloat16 (checkpoint.export_dtype: auto), not float32 at twice
    # the stock size: the trained float32 student cast to bfloat16 generates the same
    assert {v.dtype for v in wa.values()} == {torch.bfloat16}
    assert json.loads((tmp_path / "full" / "export" / "config.json").read_text())["dtype"] \
        == "bfloat16"
    student = load_causal_lm(real["student"])
    load_checkpoint(latest_checkpoint(tmp_path / "full" / "checkpoints"), student,
                    restore_rng=False)
    student, plain = student.to(torch.bfloat16), plain.to(torch.bfloat16)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        a = plain.eval().generate(ids, max_new_tokens=8, do_sample=False)
        b = student.eval().generate(ids, max_new_tokens=8, do_sample=False)
    assert a.tolist() == b.tolist()
    assert plain.generation_config.eos_token_id is not None


def test_onpolicy_steps_with_gemma_scoring_its_own_rendering(tmp_path, real):
    from xdistill.train.onpolicy import run_onpolicy
    from xdistill.train.onpolicy_config import OnPolicyConfig

    teachers = [_teacher("dpca", real, "dpca"), _teacher("escd", real, "escd")]
    d = {"student": {"path": real["student"]}, "student_tokenizer": STUDENT,
         "teachers": teachers,
         "prompts": {"paths": [real["prompts"]], "batch_size": 2},
         "rollout": {"max_new_tokens": 8, "max_prompt_len": 32, "seed": 1},
         "loss": {"chunk_size": 32}, "optim": {"lr": 1e-5}, "scheduler": {"kind": "constant"},
         "train": {"steps": 2, "out_dir": str(tmp_path), "tensorboard": False, "num_threads": 2},
         "checkpoint": {"every": 0, "resume": "", "export_hf": False}}
    run_onpolicy(from_dict(OnPolicyConfig, d))
    recs = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        for name in ("dpca", "escd"):
            assert math.isfinite(r[f"{name}/loss"]) and r[f"units/{name}"] > 0, (name, r)
        assert r["onpolicy/unaligned_frac"] < 0.05
