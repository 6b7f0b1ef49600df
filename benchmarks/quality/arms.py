"""The arms: one generated ``OffPolicyConfig`` (as a YAML-able dict) per loss, identical otherwise.

Every arm trains the same fresh student (``student.init_seed = seed``: identical initial weights
across arms), on the same distillation corpus in the same order (``data.seed = seed``), for the
same number of steps, with ``loss.ce_weight = 1`` plus its teacher term(s) of weight 1:

==============  =====================================================================
``ce``          no teacher (CE only: continued pre-training)
``same_kd``     forward KL to the weaker same-tokenizer teacher
``uld``         ULD (sorted-probability L1) to the cross-tokenizer teacher
``gold``        GOLD hybrid: KL on the exact-bytes shared vocabulary + sorted L1 on the rest
``exact_kl``    KL over the shared vocabulary of exact 1:1 chunks
``pkl_multi``   P-KL through a multitoken projection (top-4)
``pkl_corpus``  P-KL through a corpus-statistics projection
``pkl_cont``    P-KL (multitoken) + the continuation KL inside multi-piece student tokens
                (``loss.continuation``: the teacher's digit-by-digit distributions inside a
                whole-number student token, :mod:`xdistill.losses.continuation`)
``alm``         ALM: binary CE of chunk likelihoods, tau = 100
``multi``       P-KL (multitoken) to the cross teacher + forward KL to the weak teacher
``onpolicy``    on-policy reverse KL to the cross teacher (``xdistill train onpolicy``): the
                student samples answers to training prompts, the teacher scores each aligned
                chunk, k1 policy-gradient form (advantage = teacher minus student chunk
                log-likelihood); every other step (lambda = 0.5) is an off-policy step on the
                same corpus with CE + the teacher's derived off-policy term (ALM)
==============  =====================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

ARMS = ("ce", "same_kd", "uld", "gold", "exact_kl", "pkl_multi", "pkl_corpus", "pkl_cont", "alm",
        "multi", "onpolicy")
XTOKEN_ARMS = ("gold", "ce", "same_kd", "pkl_multi")  # the paper's ordering, worst to best


@dataclass(frozen=True)
class ArmSettings:
    """The shared optimisation budget of every arm."""

    steps: int = 1000
    batch: int = 16
    seq_len: int = 32
    lr: float = 3e-3
    layers: int = 2
    hidden: int = 48
    # evaluate bits per byte, and save a checkpoint whose held-out accuracy is scored after the
    # run, every this many steps (learning curves); 0 = only at the end
    eval_every: int = 0
    eval_batches: int = 4
    threads: int = 1
    # distillation temperature on both sides
    temperature: float = 1.0


def _teacher(name: str, model: str, tokenizer: str, kind: str, settings: ArmSettings,
             projection: str = "", continuation: bool = False) -> dict:
    loss = {"kind": kind, "weight": 1.0, "temperature": settings.temperature}
    if projection:
        loss["projection"] = projection
    if continuation:
        loss["continuation"] = True
    return {"name": name, "tokenizer": tokenizer,
            "worker": {"model": model, "placement": "inprocess", "output": "logits",
                       "micro_batch_size": settings.batch},
            "loss": loss}


def teachers_for(arm: str, assets: dict, s: ArmSettings) -> list[dict]:
    big = assets["teacher_big"]["model"] if arm not in ("ce", "same_kd") else ""
    weak = assets["teacher_weak"]["model"] if arm in ("same_kd", "multi") else ""
    tok_t, tok_s = assets["tok_teacher"], assets["tok_student"]
    proj = assets["projections"]
    cross = {"uld": "uld", "gold": "gold", "exact_kl": "exact_kl", "alm": "alm"}
    if arm == "ce":
        return []
    if arm == "same_kd":
        return [_teacher("weak", weak, tok_s, "forward_kl", s)]
    if arm in cross:
        return [_teacher("cross", big, tok_t, cross[arm], s)]
    if arm == "pkl_multi":
        return [_teacher("cross", big, tok_t, "pkl", s, proj["multitoken"])]
    if arm == "pkl_corpus":
        return [_teacher("cross", big, tok_t, "pkl", s, proj["corpus"])]
    if arm == "pkl_cont":
        return [_teacher("cross", big, tok_t, "pkl", s, proj["multitoken"], continuation=True)]
    if arm == "multi":
        return [_teacher("cross", big, tok_t, "pkl", s, proj["multitoken"]),
                _teacher("weak", weak, tok_s, "forward_kl", s)]
    raise ValueError(f"unknown arm {arm!r}; choose from {', '.join(ARMS)}")


def arm_command(arm: str) -> str:
    """The ``xdistill train`` subcommand of ``arm``."""
    return "onpolicy" if arm == "onpolicy" else "offpolicy"


def arm_config(arm: str, seed: int, assets: dict, s: ArmSettings, out_dir: str) -> dict:
    """The full run config of ``arm`` with ``seed`` (see the module docstring)."""
    from benchmarks.quality.prepare import model_config

    if arm == "onpolicy":
        return onpolicy_config(seed, assets, s, out_dir)
    corpus = assets["corpus"]
    return {
        "student": {"model_type": "llama", "model_config": model_config(s.layers, s.hidden),
                    "init_seed": seed},
        "student_tokenizer": assets["tok_student"],
        "teachers": teachers_for(arm, assets, s),
        "data": {"paths": [corpus["student"]], "seq_len": s.seq_len, "batch_size": s.batch,
                 "num_workers": 0, "seed": seed},
        "loss": {"ce_weight": 1.0, "chunk_size": s.seq_len},
        "optim": {"lr": s.lr, "weight_decay": 0.01, "grad_clip": 1.0},
        "scheduler": {"kind": "cosine", "warmup_steps": max(1, s.steps // 20),
                      "min_lr_ratio": 0.1},
        "train": {"steps": s.steps, "global_batch_size": s.batch, "seed": seed,
                  "out_dir": out_dir, "log_every": max(1, s.steps // 30), "tensorboard": False,
                  "num_threads": s.threads},
        "checkpoint": {"every": s.eval_every, "keep_last": 0, "resume": "", "export_hf": True},
        "eval": {"every": s.eval_every, "paths": [corpus["eval_text"]],
                 "batches": s.eval_batches},
    }


def onpolicy_config(seed: int, assets: dict, s: ArmSettings, out_dir: str) -> dict:
    """The ``onpolicy`` arm: same student, steps, optimiser and corpus (on the off-policy half)."""
    from benchmarks.quality.prepare import model_config, prompts_file

    off = arm_config("ce", seed, assets, s, out_dir)
    cross = _teacher("cross", assets["teacher_big"]["model"], assets["tok_teacher"], "k1", s)
    cross["loss"] = {"kind": "k1", "weight": 1.0, "temperature": 1.0}
    return {
        "student": {"model_type": "llama", "model_config": model_config(s.layers, s.hidden),
                    "init_seed": seed},
        "student_tokenizer": assets["tok_student"],
        "teachers": [cross],
        "prompts": {"paths": [prompts_file(assets)], "batch_size": s.batch * 2},
        "rollout": {"backend": "hf", "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 3,
                    "max_prompt_len": 32, "seed": seed},
        "loss": {"chunk_size": s.seq_len, "offpolicy_lambda": 0.5},
        "offpolicy": {"data": off["data"], "ce_weight": 1.0},
        "optim": off["optim"], "scheduler": off["scheduler"],
        "train": {k: v for k, v in off["train"].items()
                  if k in ("steps", "seed", "out_dir", "log_every", "num_threads")},
        "checkpoint": off["checkpoint"],
    }
