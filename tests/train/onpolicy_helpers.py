"""Helpers of the on-policy trainer tests: sharp tiny teachers, prompt files, run configs.

Legend: V vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)

PROMPTS = ["To be, or not to be", "What light through yonder window", "Now is the winter",
           "Friends, Romans, countrymen", "All the world's a stage", "Once more unto the breach",
           "If music be the food of love", "Shall I compare thee", "The quality of mercy",
           "Double, double toil", "O Romeo, Romeo", "A horse! a horse!"]


def save_lm(out: Path, tokenizer: str, *, seed: int, logit_scale: float = 1.0, **overrides) -> str:
    """A tiny untied Llama over ``tokenizer``'s vocabulary; ``logit_scale`` sharpens its output
    distributions (a teacher the student can measurably move towards). Tokenizer saved with it."""
    from xdistill.student.model import build_causal_lm
    from xdistill.tokenization import load_tokenizer

    tok = load_tokenizer(tokenizer)
    model = build_causal_lm("llama", dict(TINY, vocab_size=tok.vocab_size, **overrides), seed=seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    model.save_pretrained(str(out))
    tok.hf.save_pretrained(str(out))
    return str(out)


def write_prompts(path: Path, prompts=PROMPTS) -> str:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    return str(path)


def teacher(name: str, tokenizer: str, model: str, kind: str = "reverse_kl", **loss) -> dict:
    worker = {"model": model}
    if kind == "topk_kl":
        worker.update(output="topk", top_k=8)
    return {"name": name, "tokenizer": tokenizer, "worker": worker, "loss": {"kind": kind, **loss}}


def onpolicy_dict(student_tok: str, teachers: list, prompts: str, out_dir: Path, *,
                  student_path: str = "", steps: int = 4) -> dict:
    student = ({"path": student_path} if student_path else
               {"model_type": "llama", "model_config": dict(TINY), "init_seed": 0})
    return {
        "student": student,
        "student_tokenizer": student_tok,
        "teachers": teachers,
        "prompts": {"paths": [prompts], "batch_size": 4},
        "rollout": {"max_new_tokens": 12, "max_prompt_len": 32, "seed": 5},
        "loss": {"chunk_size": 64},
        "optim": {"lr": 1.0e-2, "weight_decay": 0.0, "grad_clip": 1.0},
        "scheduler": {"kind": "constant"},
        "train": {"steps": steps, "out_dir": str(out_dir), "log_samples": True, "num_threads": 1},
        "checkpoint": {"every": 0, "resume": "auto", "export_hf": False},
    }
