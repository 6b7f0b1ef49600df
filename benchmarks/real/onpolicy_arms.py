"""On-policy arms of the real-model evidence protocol (PROTOCOL.md, amendments 1 and 3).

The student (stock SmolLM2-135M) samples continuations of prompts cut from its own training slice;
the adapted Gemma-3-270M scores them and the trainer's on-policy mode (``xdistill train
onpolicy``) turns the scores into the loss:

* ``op_k1``       per-token reverse-KL advantage (k1: Thinking Machines' on-policy distillation,
                  Qwen3, verl), token credit across the two tokenizers;
* ``op_k1_byte_mean_clip``  k1 with byte-level credit (``loss.credit: byte``), the mean advantage
                  baseline and the advantage clamped to 2 nats (``LOSS_OPTIONS``): the estimator the
                  on-policy credit study confirmed (amendment 3; it replaces amendment 1's plain
                  ``op_k1_byte``).

**Equal student tokens.** An off-policy arm trains on ``steps x batch x seq_len`` student tokens;
an on-policy arm samples ``batch x NEW_TOKENS`` per step and takes
``steps x seq_len / NEW_TOKENS`` steps, so both see the same number of student tokens
(60 x 4 x 64 = 15,360 with the protocol's settings: 120 on-policy steps).
"""

from __future__ import annotations

import json
from pathlib import Path

ONPOLICY_ARMS = ("op_k1", "op_k1_byte_mean_clip")
# the ``loss`` keys of each on-policy arm beyond k1's defaults
LOSS_OPTIONS = {"op_k1": {},
                "op_k1_byte_mean_clip": {"credit": "byte", "advantage_baseline": "mean",
                                         "loss_max": 2.0}}
NEW_TOKENS = 32         # sampled student tokens per prompt
PROMPT_CHARS = 160      # a prompt is a passage's first <= 160 characters, cut at a space
MIN_PROMPT_CHARS = 40


def prompt_of(passage: str, max_chars: int = PROMPT_CHARS) -> str | None:
    """The start of ``passage`` up to the last whitespace before ``max_chars`` (None when that
    leaves fewer than ``MIN_PROMPT_CHARS`` characters)."""
    head = passage[:max_chars]
    if len(passage) > max_chars:
        cut = max(head.rfind(" "), head.rfind("\n"))
        head = head[:cut] if cut > 0 else head
    head = head.rstrip()
    return head if len(head) >= MIN_PROMPT_CHARS else None


def prompts(passages: list[str], limit: int | None = None) -> list[str]:
    out = [p for p in map(prompt_of, passages) if p is not None]
    return out if limit is None else out[:limit]


def write_prompts(passages: list[str], path: Path) -> str:
    """A prompts file (``{"prompt": ...}`` per line) of every usable passage start."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts(passages)),
                    encoding="utf-8")
    return str(path)


def onpolicy_steps(args) -> int:
    """Steps that sample as many student tokens as ``args.steps`` off-policy steps train on."""
    return max(1, args.steps * args.seq_len // NEW_TOKENS)


def onpolicy_config(arm: str, seed: int, args, a: dict, out: Path) -> dict:
    """The ``OnPolicyConfig`` of ``arm`` (module doc); ``a`` carries ``prompts`` (a prompts file),
    ``teacher``, ``student`` and optionally ``lr``."""
    if arm not in ONPOLICY_ARMS:
        raise SystemExit(f"unknown on-policy arm {arm!r}; choose from {', '.join(ONPOLICY_ARMS)}")
    steps = onpolicy_steps(args)
    gemma = {"name": "gemma", "tokenizer": "gemma3-270m", "add_bos": True,
             "worker": {"model": a["teacher"], "micro_batch_size": args.batch, "output": "logits"},
             "loss": {"kind": "k1", "weight": 1.0}}
    return {"student": {"path": a["student"]}, "student_tokenizer": "smollm2-135m",
            "teachers": [gemma],
            "prompts": {"paths": [a["prompts"]], "batch_size": args.batch, "shuffle": True},
            "rollout": {"backend": "hf", "temperature": 1.0, "top_p": 1.0,
                        "max_new_tokens": NEW_TOKENS, "max_prompt_len": 64, "seed": seed},
            "loss": {"chunk_size": 64, **LOSS_OPTIONS[arm]},
            "optim": {"lr": a.get("lr", args.lr), "weight_decay": 0.0},
            "scheduler": {"kind": "cosine", "warmup_steps": max(1, steps // 10)},
            "train": {"steps": steps, "seed": seed, "out_dir": str(out),
                      "num_threads": args.threads, "tensorboard": False},
            "checkpoint": {"export_hf": False, "resume": ""}}
