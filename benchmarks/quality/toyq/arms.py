"""The arms: one generated trainer config (a YAML-able dict) per loss, identical otherwise.

Every arm trains the same fresh student (``student.init_seed = seed``: identical initial weights
across arms), on the same distillation corpus in the same order (``data.seed = seed``), for the
same number of steps. Each arm weights its terms as the method's source does ("published"
weighting); where that differs from the harness's earlier uniform weighting (CE 1 + teacher term
1), the uniform variant is kept under a second name (``alm_ce``, ``uld_1to1``, ``gold_ce``):

==============  ======================================================================  =========
arm             teacher term(s)                                                         CE weight
==============  ======================================================================  =========
``ce``          none (CE only: continued pre-training)                                  1
``same_kd``     forward KL to the weaker same-tokenizer teacher, weight 1 (Hinton KD)   1
``uld``         ULD (sorted-probability L1) to the cross teacher, weight lambda = 0.1   1
``uld_1to1``    ULD, weight 1 (the earlier arm: collapses to a wrong answer)            1
``gold``        GOLD hybrid: KL on the exact-bytes shared vocabulary + sorted L1 on     0
                the rest, weight 1, no CE (TRL's GOLD trainer defaults to
                ``uld_crossentropy_weight = 0``)
``gold_ce``     GOLD hybrid, weight 1 (the earlier arm)                                 1
``exact_kl``    KL over the shared vocabulary of exact 1:1 chunks, weight 1             1
``pkl_multi``   P-KL through a multitoken projection (top-4), weight 1                  1
``pkl_corpus``  P-KL through a corpus-statistics projection, weight 1                   1
``pkl_cont``    P-KL (multitoken) + the continuation KL inside multi-piece student      1
                tokens (``loss.continuation``: the teacher's digit-by-digit
                distributions inside a whole-number student token), weight 1
``alm``         ALM: binary CE of chunk likelihoods, tau = 100, weight 1, no CE         0
                (tokenkit trains ALM as pure distillation)
``alm_ce``      ALM, weight 1, plus CE (the earlier arm)                                1
``multi``       P-KL (multitoken) to the cross teacher + forward KL to the weak         1
                teacher, weight 1 each
``onpolicy``    on-policy reverse KL to the cross teacher (``xdistill train             1 (off-
                onpolicy``): the student samples answers to training prompts, the       policy
                teacher scores each aligned chunk, k1 policy-gradient form (advantage    half)
                = teacher minus student chunk log-likelihood); every other step
                (lambda = 0.5) is an off-policy step on the same corpus with CE + the
                teacher's derived off-policy term (ALM)
==============  ======================================================================  =========

Why the published weightings matter here: at tau = 100, ALM's gradient is ~1% of CE's, so
``alm_ce`` is CE-only in effect; ``uld_1to1`` has a stable state with a wrong answer token at 50%.
ULD's lambda = 0.1 is the weight the ULD paper is cited for in this project's issue tracker; we did
not re-check it against the paper, and the authors' released code (llm-recipes) defaults to a
distillation factor of 1.5 next to CE 1, i.e. closer to ``uld_1to1``. X-Token's P-KL adds lambda x
CE without a value we could confirm: the P-KL arms keep 1.
"""

from __future__ import annotations

from dataclasses import dataclass

ARMS = ("ce", "same_kd", "uld", "uld_1to1", "gold", "gold_ce", "exact_kl", "pkl_multi",
        "pkl_corpus", "pkl_cont", "alm", "alm_ce", "multi", "onpolicy")
# arm -> (CE weight, weight of each teacher term) where it is not (1, 1); see the module doc
WEIGHTS = {"uld": (1.0, 0.1), "gold": (0.0, 1.0), "alm": (0.0, 1.0)}
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
    # continuation protocol (benchmarks/quality/toyq/continued.py): optimizer steps after the CE
    # checkpoint, their peak learning rate, and the tokens each rollout may sample
    cont_steps: int = 300
    cont_lr: float = 1e-3
    cont_new_tokens: int = 4
    # the on-policy arms' prompts: "student" (the problems labeled in the student's corpus) or
    # "train" (also the unlabeled pool: training problems beyond ``TaskConfig.student_pairs``)
    prompt_pool: str = "student"
    # per-arm continuation learning rates ((arm, lr) pairs) that replace ``cont_lr`` for those
    # arms (a study that tunes each method's rate on validation runs them in one invocation)
    arm_lr: tuple = ()

    def cont_lr_of(self, arm: str) -> float:
        """The continuation learning rate of ``arm``."""
        return dict(self.arm_lr).get(arm, self.cont_lr)


def _teacher(name: str, model: str, tokenizer: str, kind: str, settings: ArmSettings,
             projection: str = "", continuation: bool = False, weight: float = 1.0) -> dict:
    loss = {"kind": kind, "weight": weight, "temperature": settings.temperature}
    if projection:
        loss["projection"] = projection
    if continuation:
        loss["continuation"] = True
    return {"name": name, "tokenizer": tokenizer,
            # float32 pinned (not dtype auto): the published results were measured in float32
            "worker": {"model": model, "placement": "inprocess", "output": "logits",
                       "micro_batch_size": settings.batch, "dtype": "float32"},
            "loss": loss}


def arm_weights(arm: str) -> tuple[float, float]:
    """``(CE weight, teacher-term weight)`` of ``arm`` (module doc)."""
    return WEIGHTS.get(arm, (1.0, 1.0))


# cross-tokenizer arms with one teacher term and no projection: arm -> loss kind
_CROSS_KIND = {"uld": "uld", "uld_1to1": "uld", "gold": "gold", "gold_ce": "gold",
               "exact_kl": "exact_kl", "alm": "alm", "alm_ce": "alm"}


def teachers_for(arm: str, assets: dict, s: ArmSettings) -> list[dict]:
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; choose from {', '.join(ARMS)}")
    big = assets["teacher_big"]["model"] if arm not in ("ce", "same_kd") else ""
    weak = assets["teacher_weak"]["model"] if arm in ("same_kd", "multi") else ""
    tok_t, tok_s = assets["tok_teacher"], assets["tok_student"]
    proj = assets["projections"]
    w = arm_weights(arm)[1]
    if arm == "ce":
        return []
    if arm == "same_kd":
        return [_teacher("weak", weak, tok_s, "forward_kl", s)]
    if arm in _CROSS_KIND:
        return [_teacher("cross", big, tok_t, _CROSS_KIND[arm], s, weight=w)]
    if arm == "pkl_multi":
        return [_teacher("cross", big, tok_t, "pkl", s, proj["multitoken"])]
    if arm == "pkl_corpus":
        return [_teacher("cross", big, tok_t, "pkl", s, proj["corpus"])]
    if arm == "pkl_cont":
        return [_teacher("cross", big, tok_t, "pkl", s, proj["multitoken"], continuation=True)]
    return [_teacher("cross", big, tok_t, "pkl", s, proj["multitoken"]),  # multi
            _teacher("weak", weak, tok_s, "forward_kl", s)]


def log_every(steps: int) -> int:
    """Metrics every 10 steps at most (the harness's progress lines read them as they come)."""
    return max(1, min(10, steps // 30))


def arm_command(arm: str) -> str:
    """The ``xdistill train`` subcommand of ``arm``."""
    return "onpolicy" if arm == "onpolicy" or arm.startswith("op_") else "offpolicy"


def arm_config(arm: str, seed: int, assets: dict, s: ArmSettings, out_dir: str) -> dict:
    """The full run config of ``arm`` with ``seed`` (see the module docstring)."""
    from toyq.prepare import model_config

    from toyq.continued import cont_config, is_cont_arm

    if arm == "onpolicy":
        return onpolicy_config(seed, assets, s, out_dir)
    if is_cont_arm(arm):
        return cont_config(arm, seed, assets, s, out_dir)
    corpus = assets["corpus"]
    return {
        "student": {"model_type": "llama", "model_config": model_config(s.layers, s.hidden),
                    "init_seed": seed, "param_dtype": "float32"},
        "student_tokenizer": assets["tok_student"],
        "teachers": teachers_for(arm, assets, s),
        "data": {"paths": [corpus["student"]], "seq_len": s.seq_len, "batch_size": s.batch,
                 "num_workers": 0, "seed": seed},
        "loss": {"ce_weight": arm_weights(arm)[0], "chunk_size": s.seq_len},
        "optim": {"lr": s.lr, "weight_decay": 0.01, "grad_clip": 1.0},
        "scheduler": {"kind": "cosine", "warmup_steps": max(1, s.steps // 20),
                      "min_lr_ratio": 0.1},
        "train": {"steps": s.steps, "global_batch_size": s.batch, "seed": seed,
                  "out_dir": out_dir, "log_every": log_every(s.steps), "tensorboard": False,
                  "num_threads": s.threads},
        "checkpoint": {"every": s.eval_every, "keep_last": 0, "resume": "", "export_hf": True},
        "eval": {"every": s.eval_every, "paths": [corpus["eval_text"]],
                 "batches": s.eval_batches},
    }


def onpolicy_config(seed: int, assets: dict, s: ArmSettings, out_dir: str) -> dict:
    """The ``onpolicy`` arm: same student, steps, optimiser and corpus (on the off-policy half)."""
    from toyq.prepare import model_config, prompts_file

    off = arm_config("ce", seed, assets, s, out_dir)
    cross = _teacher("cross", assets["teacher_big"]["model"], assets["tok_teacher"], "k1", s)
    cross["loss"] = {"kind": "k1", "weight": 1.0, "temperature": 1.0}
    return {
        "student": {"model_type": "llama", "model_config": model_config(s.layers, s.hidden),
                    "init_seed": seed, "param_dtype": "float32"},
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
