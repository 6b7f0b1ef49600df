"""On-policy arms from the CE-trained student, against continuing it off-policy (same tokens).

Every published on-policy recipe starts from a warm (SFT / CE-trained) student, not from a random
one. In this protocol each seed's ``ce`` run (the CE-only arm, ``ArmSettings.steps`` steps on the
noisy student corpus) is the starting checkpoint of every arm below, which trains it for
``ArmSettings.cont_steps`` more optimizer steps with the same learning rate, schedule and about the
same number of student tokens per step (forward tokens: prompt + response on-policy, windows
off-policy; ``cont_prompts`` prompts per step are chosen to match ``batch x seq_len``):

==================  =============================================================================
arm                 what continues training the CE checkpoint
==================  =============================================================================
``cont_ce``         CE on the student corpus (the noisy labels alone)
``cont_ce_oracle``  CE on the teachers' corpus: the true answer of *every* training problem,
                    including those the student has no label for (a ceiling: what a teacher
                    that answered every prompt right could add through the prompts; issue-24
                    headroom check)
``cont_pkl_cont``   off-policy P-KL + continuation KL to the cross-tokenizer teacher, + CE (the
                    best off-policy distillation arm of the from-scratch protocol)
``op_k1``           on-policy, k1: policy gradient with the chunk log-ratio as advantage
``op_k3``           on-policy, k3 estimator of the reverse KL over chunks
``op_rkl``          on-policy reverse KL through the projection (P-KL at chunk starts)
``op_strict``       strict top-16 reverse KL at exact 1:1 positions (Hou et al. 2026)
``op_dpca``         DPCA: chunk log-ratio split by behaviour log-probs, PPO-clipped (Niu et al.)
``op_simple``       SimpleOPD: advantage at exact 1:1 spans only, PPO-clipped, stop tokens 0
``op_bpm``          BPM: teacher mass mapped to student tokens by byte prefix, forward KL
``op_escd``         ESCD: BPM + the completion-set term at the visited child state
``op_k1_mean``      ``op_k1`` with ``loss.advantage_baseline: mean`` (advantages centred on their
                    micro-batch mean: does centring stop the sampled-token arms' collapse?)
``op_dpca_mean``    ``op_dpca`` with the mean baseline
``op_simple_mean``  ``op_simple`` with the mean baseline
``op_k1_byte``      ``op_k1`` with byte-level credit (``loss.credit: byte``: each side's
                    probability of a unit's bytes and the student's boundary, the stop scored with
                    the content it ends; ``xdistill/losses/bytecredit.py``)
``op_k3_byte``      ``op_k3`` with byte-level credit
``op_dpca_byte``    ``op_dpca`` with byte-level credit
``op_simple_byte``  ``op_simple`` with byte-level credit
``op_k1_byte_mean`` ``op_k1_byte`` with the mean baseline (a control variate: each unit's
                    advantage minus the micro-batch's mean advantage)
``op_k1_byte_clip`` ``op_k1_byte`` with the advantage clamped to ``[-BYTE_CLIP, BYTE_CLIP]``
                    (``loss.loss_max``; the default clamp is 10)
``op_k1_byte_mean_clip``  both
``op_<k>_same``     ``op_<k>`` (k1, k3, rkl, strict, dpca, simple, bpm, escd) scored by the
                    same-tokenizer control teacher ``teacher_same_big`` (the student's tokenizer,
                    the cross teacher's size and training; issue-24 confirmation)
``op_k1_same_mean_clip``  ``op_k1_same`` with the mean baseline and the advantage clamp: the
                    same-tokenizer control of ``op_k1_byte_mean_clip`` (same estimator)
``op_k1_byte_tmean_clip``  ``op_k1_byte_mean_clip`` with the baseline taken per student token
                    (``loss.advantage_baseline: token_mean``: a unit's baseline is its student
                    tokens times the mean advantage per student token); its same-tokenizer
                    control is ``op_k1_same_mean_clip`` (one token per unit: the same baseline)
``op_k1_twin_byte_mean_clip``  ``op_k1_byte_mean_clip``'s whole estimator with the
                    same-tokenizer teacher ``teacher_same_big`` presented under a twin of the
                    student's tokenizer (identical tokenization, another fingerprint:
                    :func:`toyq.toks.twin_tokenizer`), so that the cross-tokenizer pipeline
                    (alignment, units with the stop merged, byte credit) scores it: one model
                    two ways. (``credit: byte`` alone does not do it: the trainer gives a
                    same-tokenizer teacher token credit, which is exact there.) Against
                    ``op_k1_same_mean_clip`` it measures the pipeline with the model held
                    fixed; against ``op_k1_byte_mean_clip``, the other model and its
                    tokenization's units with the pipeline held fixed
``op_k1_byte_cmean_clip``  ``op_k1_byte_mean_clip`` with ``loss.advantage_baseline:
                    clipped_mean`` (the log-ratios clamped to ``BYTE_CLIP`` first, then centred:
                    the wrong answers' extreme log-ratios cannot drag the baseline below
                    moderately wrong answers); ``op_k1_same_cmean_clip`` is its same-tokenizer
                    control
``op_k1_byte_tok_mean_clip``  ``op_k1_byte_mean_clip`` with student-token units
                    (``loss.byte_units: token``: each aligned chunk's byte-level probability
                    split by the chain rule over the student's token boundaries, so the
                    baseline and the clamp act on the student's own tokens, as with
                    ``op_k1_same_mean_clip``; ``xdistill/losses/bytecredit_tokens.py``)
``<arm>_g1``        ``op_k1_byte_mean_clip_g1``, ``op_k1_same_mean_clip_g1`` (and their ``_t<k>``
                    teachers): the arm with ``loss.discount: 1`` (each unit's advantage is the
                    log-ratio of all the text from the unit to the end of the sample, which
                    does not depend on how the teacher's tokenization cuts that text into
                    units; ``xdistill/losses/onpolicy.py``)
``<arm>_zstop``     ``op_k1_byte_mean_clip_zstop``, ``op_k1_same_mean_clip_zstop`` (and their
                    ``_t<k>`` teachers): the arm with ``loss.stop_advantage: zero`` (units that
                    hold the student's stop get no advantage, and under byte credit the stop is
                    not merged with the period: the teacher's view of where the text ends is out
                    of the credit)
``<arm>_t<k>``      ``op_k1_byte_mean_clip_t<k>``, ``op_k1_same_mean_clip_t<k>`` (k = 2, 3, 4)
                    and ``op_k1_byte_tok_mean_clip_t2``: the arm with the k-th teacher of its kind
                    (``teacher_big_t<k>`` / ``teacher_same_big_t<k>``: the same settings, data
                    and tokenizer, training seed k - 1), so that a gain's dependence on *which*
                    teacher is measured next to its tokenizer's
``<arm>_s<steps>``  ``op_k1_byte_mean_clip_s<steps>``, ``op_k1_same_mean_clip_s<steps>`` (and
                    their ``_t<k>``): the arm with its teacher trained for ``<steps>`` CE steps
                    instead of the big teacher's (``teacher_big_s<steps>`` /
                    ``teacher_same_big_s<steps>``, other settings and seeds alike): a teacher
                    of another training length, the tokenizer held fixed
==================  =============================================================================

On-policy arms sample ``cont_new_tokens`` tokens per prompt at temperature 1 from the current
student (rollouts of the student's training prompts) and use the cross-tokenizer teacher only
(the digit-splitting one), so they test the cross-tokenizer on-policy losses.
"""

from __future__ import annotations

import re
from pathlib import Path

CONT_ARMS = ("cont_ce", "cont_ce_oracle", "cont_pkl_cont", "op_k1", "op_k3", "op_rkl",
             "op_strict", "op_dpca", "op_simple", "op_bpm", "op_escd", "op_k1_mean", "op_dpca_mean", "op_simple_mean",
             "op_k1_byte", "op_k3_byte", "op_dpca_byte", "op_simple_byte", "op_k1_byte_mean",
             "op_k1_byte_clip", "op_k1_byte_mean_clip", "op_k1_byte_tmean_clip",
             "op_k1_byte_cmean_clip")
SAME_ARMS = tuple(f"op_{k}_same" for k in ("k1", "k3", "rkl", "strict", "dpca", "simple", "bpm",
                                           "escd")) + ("op_k1_same_mean_clip",
                                                       "op_k1_same_cmean_clip")
# the same-tokenizer teacher through the cross-tokenizer pipeline (its tokenizer's twin)
TWIN_ARMS = ("op_k1_twin_byte_mean_clip",)
# arms read by a further teacher of their kind, ``<arm>_t<k>`` (toyq.prepare.SECOND_TEACHERS)
TEACHER_SUFFIXES = ("_t2", "_t3", "_t4")
SAME_ARMS = SAME_ARMS + tuple(f"op_k1_same_mean_clip{sfx}" for sfx in TEACHER_SUFFIXES)
# byte credit on student-token units (loss.byte_units: token), with either cross teacher
TOKEN_UNIT_ARMS = ("op_k1_byte_tok_mean_clip", "op_k1_byte_tok_mean_clip_t2")
# k1 with loss.discount 1 (flag g1), for every teacher of each kind
DISCOUNT_SAME_ARMS = tuple(f"op_k1_same_mean_clip_g1{sfx}" for sfx in ("",) + TEACHER_SUFFIXES)
DISCOUNT_ARMS = (tuple(f"op_k1_byte_mean_clip_g1{sfx}" for sfx in ("",) + TEACHER_SUFFIXES)
                 + DISCOUNT_SAME_ARMS)
# k1 with loss.stop_advantage zero (flag zstop), for every teacher of each kind
ZSTOP_SAME_ARMS = tuple(f"op_k1_same_mean_clip_zstop{sfx}" for sfx in ("",) + TEACHER_SUFFIXES)
ZSTOP_ARMS = (tuple(f"op_k1_byte_mean_clip_zstop{sfx}" for sfx in ("",) + TEACHER_SUFFIXES)
              + ZSTOP_SAME_ARMS)
SAME_ARMS = SAME_ARMS + DISCOUNT_SAME_ARMS + ZSTOP_SAME_ARMS
CONT_ARMS = (CONT_ARMS + tuple(f"op_k1_byte_mean_clip{sfx}" for sfx in TEACHER_SUFFIXES)
             + SAME_ARMS + TWIN_ARMS + TOKEN_UNIT_ARMS + DISCOUNT_ARMS[:4] + ZSTOP_ARMS[:4])


# a big teacher of another training budget (seventeenth protocol on): ``<base>_s<steps>{,_t<k>}``
# reads ``teacher_big_s<steps>{,_t<k>}`` (cross-tokenizer base) or
# ``teacher_same_big_s<steps>{,_t<k>}`` (same-tokenizer base): the big teacher's settings,
# ``<steps>`` CE steps (:func:`toyq.prepare.budget_teacher`)
BUDGET_BASE = "op_k1_byte_mean_clip"
SAME_BUDGET_BASE = "op_k1_same_mean_clip"
_BUDGET_ARM = re.compile(rf"^({BUDGET_BASE}|{SAME_BUDGET_BASE})_s([1-9][0-9]*)(_t[234])?$")


def budget_of(arm: str) -> int | None:
    """The teacher's training steps of a budget arm (``..._s<steps>[_t<k>]``), else ``None``."""
    m = _BUDGET_ARM.match(arm)
    return int(m.group(2)) if m else None


def budget_arm(steps: int, suffix: str = "", base: str = BUDGET_BASE) -> str:
    """The budget arm of ``base`` whose teacher is trained for ``steps`` (``suffix``: ``_t<k>``
    or "")."""
    return f"{base}_s{steps}{suffix}"


def is_cont_arm(arm: str) -> bool:
    """A continuation arm: one of ``CONT_ARMS`` or a budget arm."""
    return arm in CONT_ARMS or budget_of(arm) is not None


def is_same_arm(arm: str) -> bool:
    """An arm read by a same-tokenizer control teacher (its budget ones too)."""
    return arm in SAME_ARMS or (budget_of(arm) is not None
                                and arm.startswith(SAME_BUDGET_BASE + "_s"))


def k1_teacher(arm: str) -> str:
    """The prepared teacher a k1 arm of either kind reads: ``teacher_big`` or
    ``teacher_same_big``, its budget's ``_s<steps>`` and its ``_t<k>``."""
    steps = budget_of(arm)
    kind = "teacher_same_big" if is_same_arm(arm) else "teacher_big"
    return f"{kind}{'' if steps is None else f'_s{steps}'}{teacher_suffix(arm)}"


def teacher_suffix(arm: str) -> str:
    """``_t<k>`` when ``arm`` reads a further teacher of its kind, else ``""``."""
    return next((sfx for sfx in TEACHER_SUFFIXES if arm.endswith(sfx)), "")
ONPOLICY_KIND = {"op_k1": "k1", "op_k3": "k3", "op_rkl": "reverse_kl", "op_strict": "strict_topk",
                 "op_dpca": "dpca", "op_simple": "simple_opd", "op_bpm": "bpm", "op_escd": "escd"}
for _arm in CONT_ARMS:                       # op_k1_byte_mean_clip, op_k1_same -> op_k1's kind
    if _arm.startswith("op_"):
        ONPOLICY_KIND.setdefault(_arm, ONPOLICY_KIND["op_" + _arm.split("_")[1]])
# student forward tokens of one prompt + response here: "Q: 12+7=? A:" is ~8 tokens, the answer,
# "." and what follows up to cont_new_tokens: ~4 (measured and reported per run)
TOKENS_PER_ROLLOUT = 12
# the advantage clamp of the ``_clip`` variants (nats per unit; the trainer's default is 10)
BYTE_CLIP = 2.0
# an arm name's baseline flag -> loss.advantage_baseline
BASELINE_FLAGS = {"mean": "mean", "tmean": "token_mean", "cmean": "clipped_mean"}


def loss_options(arm: str) -> dict:
    """The ``loss`` keys an on-policy arm's name asks for beyond its kind: ``_byte`` byte-level
    credit (``_byte_tok``: on student-token units), ``_mean`` the mean advantage baseline
    (``_tmean``: per student token; ``_cmean``: clipped_mean), ``_clip`` the advantage clamp
    ``BYTE_CLIP``, ``_g1`` the discount 1 (``loss.discount``), ``_zstop`` no advantage on the
    stop (``loss.stop_advantage: zero``)."""
    flags = arm.split("_")[2:]             # op_<kind>_<flag>_...
    baseline = BASELINE_FLAGS.get(next((f for f in flags if f in BASELINE_FLAGS), ""))
    return {**({"advantage_baseline": baseline} if baseline else {}),
            **({"credit": "byte"} if "byte" in flags else {}),
            **({"byte_units": "token"} if "tok" in flags else {}),
            **({"loss_max": BYTE_CLIP} if "clip" in flags else {}),
            **({"discount": 1.0} if "g1" in flags else {}),
            **({"stop_advantage": "zero"} if "zstop" in flags else {})}


def twin_path(assets: dict) -> str:
    """The twin of the student's tokenizer (``<root>/tok_student_twin``), written on first use."""
    from toyq.toks import twin_tokenizer

    root = Path(assets["root"])
    return str(twin_tokenizer(Path(assets["tok_student"]), root / "tok_student_twin"))


def ce_checkpoint(out_dir: str, seed: int) -> Path:
    """The exported CE-only student of ``seed`` (``<out>/runs/ce/seed<k>/export``)."""
    return Path(out_dir).parents[1] / "ce" / f"seed{seed}" / "export"


def cont_prompts(s) -> int:
    """Prompts per on-policy step so that its forward tokens match an off-policy step's."""
    return max(1, round(s.batch * s.seq_len / TOKENS_PER_ROLLOUT))


def cont_config(arm: str, seed: int, assets: dict, s, out_dir: str) -> dict:
    """The run config of a continuation arm (module doc)."""
    from toyq.arms import _teacher, arm_config
    from toyq.prepare import prompts_file

    ce = str(ce_checkpoint(out_dir, seed))
    base = arm_config("pkl_cont" if arm == "cont_pkl_cont" else "ce", seed, assets, s, out_dir)
    base["student"] = {"path": ce, "param_dtype": "float32"}
    base["train"]["steps"] = s.cont_steps
    base["train"]["log_every"] = max(1, min(10, s.cont_steps // 30))
    base["scheduler"]["warmup_steps"] = max(1, s.cont_steps // 20)
    base["optim"]["lr"] = s.cont_lr_of(arm)
    base["checkpoint"]["every"] = s.eval_every and min(s.eval_every, s.cont_steps)
    base["eval"]["every"] = base["checkpoint"]["every"]
    if arm == "cont_ce_oracle":
        base["data"]["paths"] = [assets["corpus"]["teacher"]]
    if arm in ("cont_ce", "cont_ce_oracle", "cont_pkl_cont"):
        return base
    kind = ONPOLICY_KIND[arm if arm in ONPOLICY_KIND else BUDGET_BASE]   # budget arms: k1
    loss = {"kind": kind, "weight": 1.0, "temperature": 1.0}
    if is_same_arm(arm):      # the same-tokenizer control teacher: no projection, identity view
        cross = _teacher("same", assets[k1_teacher(arm)]["model"], assets["tok_student"],
                         kind, s)
    elif arm in TWIN_ARMS:    # the same model under a twin tokenizer: the cross pipeline
        cross = _teacher("twin", assets["teacher_same_big"]["model"], twin_path(assets), kind, s)
    else:
        if kind == "reverse_kl":
            loss["projection"] = assets["projections"]["multitoken"]
        cross = _teacher("cross", assets[k1_teacher(arm)]["model"], assets["tok_teacher"],
                         kind, s)
    cross["loss"] = loss
    cross["worker"]["micro_batch_size"] = cont_prompts(s)
    return {
        "student": {"path": ce, "param_dtype": "float32"}, "student_tokenizer": assets["tok_student"],
        "teachers": [cross],
        "prompts": {"paths": [prompts_file(assets, s.prompt_pool)], "batch_size": cont_prompts(s),
                    "shuffle": True},
        "rollout": {"backend": "hf", "temperature": 1.0, "top_p": 1.0,
                    "max_new_tokens": s.cont_new_tokens, "max_prompt_len": 32, "seed": seed},
        "loss": {"chunk_size": s.seq_len,
                 "stop_advantage": "zero" if kind == "simple_opd" else "teacher",
                 **loss_options(arm)},
        "optim": base["optim"], "scheduler": base["scheduler"],
        "train": {k: v for k, v in base["train"].items() if k != "global_batch_size"},
        "checkpoint": base["checkpoint"],
    }
