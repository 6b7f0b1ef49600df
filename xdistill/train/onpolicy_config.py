"""``OnPolicyConfig`` (``xdistill train onpolicy``): the student samples, teachers score.

Every field is documented by the comment above it (``xdistill config show onpolicy`` prints them).
``OnPolicyConfig`` is a :class:`xdistill.train.run_config.RunConfig` (student, optim, scheduler,
train, checkpoint: the sections every run has) plus its own; each teacher's ``worker`` is the
off-policy trainer's; ``rollout`` is :class:`xdistill.rollout.RolloutConfig`.
:func:`validate_onpolicy` checks what can be checked before any compute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from xdistill.data.config import DataConfig, validate_data
from xdistill.errors import ConfigError
from xdistill.losses.bytecredit import BYTE_CREDIT_KINDS
from xdistill.losses.onpolicy import CROSS_ROUTES, ONPOLICY_LOSSES, SAMPLED_LOSSES
from xdistill.rollout.engine import RolloutConfig
from xdistill.train.config import check_chunk_size
from xdistill.train.run_config import (RunConfig, RunTeacherConfig, check_loss_scale, check_path,
                                       check_teacher_names, default_out_dir, validate_run_sections,
                                       validate_student_source, validate_teacher_worker)

OnPolicyKind = Literal["reverse_kl", "topk_kl", "jsd", "k1", "k3", "strict_topk", "dpca",
                       "simple_opd", "bpm", "escd"]
OffPolicyKind = Literal["", "forward_kl", "reverse_kl", "jsd", "topk_kl", "exact_kl", "pkl", "uld",
                        "gold", "alm"]


@dataclass
class OnPolicyTeacherLoss:
    """How one teacher scores the student's samples (see xdistill.losses.onpolicy)."""

    # on-policy loss: reverse_kl (full distribution), topk_kl (teacher top-k + tail bucket, same
    # tokenizer and worker.output = topk), jsd, k1 (policy-gradient advantage), k3 (sampled), or
    # a 2026 cross-tokenizer method: strict_topk (reverse KL at exact 1:1 positions on the
    # student's top-k shared tokens), dpca (chunk log-ratio split by behaviour log-probs, PPO
    # clipped), simple_opd (advantage on exact 1:1 spans only, PPO clipped), bpm (teacher mass
    # mapped to student tokens by byte prefix, forward KL at chunk starts), escd (bpm + the
    # completion-set term at the visited child state); see xdistill/losses/onpolicy_kinds.py
    kind: OnPolicyKind = "reverse_kl"
    # static weight of this teacher's loss
    weight: float = 1.0
    # loss temperature (both sides; the teacher worker's temperature must be 1 or equal)
    temperature: float = 1.0
    # JSD beta (kind jsd): 1 = reverse-like, 0 = forward-like
    beta: float = 0.5
    # cross-tokenizer route of reverse_kl/jsd: projection (P-KL through loss.projection) or
    # exact (1:1 chunks over the shared vocabulary of identical token bytes)
    cross: Literal["projection", "exact"] = "projection"
    # projection artifact (.npz from `xdistill projection build`) for cross = projection
    projection: str = ""
    # strict_topk: size k of the student's top-k set inside the shared vocabulary
    top_k: int = 16
    # dpca / simple_opd: the PPO ratio is clipped below at 1 - clip_low (loss.loss_max is the
    # advantage clamp)
    clip_low: float = 0.2
    # dpca / simple_opd: the PPO ratio is clipped above at 1 + clip_high
    clip_high: float = 0.28
    # dpca / simple_opd: dual clip c: the loss of a negative advantage is at most -c * A
    dual_clip: float = 10.0
    # simple_opd: weight beta of the reference KL(q_theta || q_init) to the initial student
    # (SimpleOPD's published 0.5, one of its two stabilisers; > 0 keeps a frozen copy of the
    # initial student; 0 = off)
    ref_beta: float = 0.5
    # bpm / escd: drop chunk starts whose sampled student token is whitespace only (BPM's mask
    # against learning the teacher's whitespace habits)
    mask_whitespace: bool = False
    # bpm / escd: rule for student tokens longer than the teacher's token at a root (a digit-
    # splitting teacher's "2" vs the student's "23"): the teacher mass of the on-path token
    # followed by a suffix that makes a longer student token moves to that token (its covering
    # mass, one step ahead; xdistill/losses/byteprefix_long.py); false = BPM's plain map
    long_tokens: bool = True
    # loss of this teacher on mixed-in off-policy batches (loss.offpolicy_lambda > 0), an
    # off-policy kind; "" = derived from kind (same tokenizer: reverse_kl/jsd/topk_kl as is, k1/k3
    # -> forward_kl; cross: pkl (projection route) or exact_kl, k1/k3 -> alm)
    offpolicy_kind: OffPolicyKind = ""


@dataclass
class OnPolicyTeacherConfig(RunTeacherConfig):
    """One teacher of an on-policy run: the shared part (:class:`RunTeacherConfig`: name,
    tokenizer, max_len, add_bos, worker) and its on-policy loss."""

    # the on-policy loss of this teacher
    loss: OnPolicyTeacherLoss = field(default_factory=OnPolicyTeacherLoss)


@dataclass
class PromptsConfig:
    """Where prompts come from and how they are batched."""

    # prompt files: .jsonl ({"prompt": str} or {"messages": [...]}) or arrow/parquet
    paths: list[str] = field(default_factory=list)
    # column/key of plain-text prompts
    prompt_column: str = "prompt"
    # column/key of chat prompts (a list of {role, content})
    messages_column: str = "messages"
    # per-sample teacher routing (.jsonl prompts): the key holding the name of the one teacher
    # that scores each prompt (multi-teacher, one teacher per sample); "" = every teacher
    # scores every sample
    route_column: str = ""
    # prompts per rank per micro-batch (one rollout each); train.global_batch_size (prompts per
    # optimizer step over all ranks) may ask for several micro-batches per step
    batch_size: int = 8
    # shuffle the prompts every epoch (permutation seeded by train.seed and the epoch)
    shuffle: bool = True
    # loader worker processes (0 = in the training process)
    num_workers: int = 0
    # passes over the prompts (null = endless); finite passes that end before train.steps stop
    # the run with a checkpoint of the last step (one process; use null with several ranks)
    epochs: int | None = None


@dataclass
class ScoringConfig:
    """Re-tokenization and alignment of the responses for each teacher."""

    # chunking of the aligner: minimal (smallest common byte chunks) or space
    chunks: Literal["minimal", "space"] = "minimal"
    # aligner method: auto, exact or dp
    method: Literal["auto", "exact", "dp"] = "auto"


@dataclass
class OnPolicyLossConfig:
    """How the teachers' on-policy losses combine, clamps, reward weighting, off-policy mixing."""

    # teacher weighting (static weights from each teacher's loss.weight)
    weighting: Literal["static"] = "static"
    # sequence positions per block when computing losses (bounds memory), >= 1; null = no
    # blocking
    chunk_size: int | None = 256
    # k1/k3: floor of every sampled-token log-prob (both sides) before the log-ratio; null = off
    # (default: a floor makes a unit both models find impossible score ~0, the best advantage
    # on offer, and k1/k3 collapse into it; not in verl's or Thinking Machines' k1)
    logp_min: float | None = None
    # k1/k3: symmetric clamp of the per-unit loss (k3) or the advantage (k1); null = off
    loss_max: float | None = 10.0
    # k3: clip of the log-ratio inside exp; null = off
    exp_clip: float | None = 20.0
    # student tokens a cross-tokenizer teacher read but no chunk pairs (bytes it cannot spell):
    # floor (a policy-gradient penalty as if the teacher gave them log-prob logp_min, or -10
    # when logp_min is null; one loss unit each) or ignore (no loss, not counted)
    unpaired: Literal["floor", "ignore"] = "floor"
    # the student's stop token in k1 and k3: teacher (scored against the teacher's own end token
    # like any unit) or zero (zero advantage, SimpleOPD's guard against length blow-up). Other
    # kinds keep their own rule: simple_opd always zeroes its stop units, dpca scores the stop
    # with the content it ends, full-distribution kinds treat it like any token
    stop_advantage: Literal["teacher", "zero"] = "teacher"
    # sampled-token kinds (k1, dpca, simple_opd): advantage baseline, none, mean (advantages
    # minus their mean over the micro-batch's units: same expected gradient, less variance when
    # the teacher rates every sample below the student's own likelihood) or token_mean (a unit's
    # baseline = its student tokens x the mean advantage per student token: independent of how a
    # cross-tokenizer teacher's chunks group the student's tokens; = mean for a same-tokenizer
    # teacher, and for dpca / simple_opd, whose units are student tokens) or clipped_mean (the
    # advantages clamped first -- k1: loss_max, dpca / simple_opd: their advantage clamp -- then
    # centred on their own mean, so a few extreme units cannot drag the baseline down; = mean
    # without a clamp)
    advantage_baseline: Literal["none", "mean", "token_mean", "clipped_mean"] = "none"
    # credit of the sampled-token kinds (k1, k3, dpca, simple_opd) from a cross-tokenizer teacher:
    # token (each side's summed token log-probs per aligned chunk) or byte (each side's
    # probability of the unit's bytes followed by the boundary the student's tokenization
    # implies, the stop scored with the content it ends; needs worker.output = logits; see
    # xdistill/losses/bytecredit.py). A same-tokenizer teacher always uses token credit (exact)
    credit: Literal["token", "byte"] = "token"
    # units of byte credit for k1/k3: chunk (one advantage per aligned chunk, the stop merged with
    # the content it ends) or token (one per student token: the chunk's byte-level probability
    # split by the chain rule over the student's token boundaries, so the baseline and the clamp
    # act on the student's own units; xdistill/losses/bytecredit_tokens.py). Needs credit = byte;
    # applies to the cross-tokenizer k1/k3 teachers (other kinds are unaffected; dpca and
    # simple_opd teachers are an error)
    byte_units: Literal["chunk", "token"] = "chunk"
    # k1: discount gamma in [0, 1] of each unit's advantage over the later units of its sample:
    # the advantage is sum_{v >= u} gamma^(v - u) r_v before the baseline and the clamp. 0 = the
    # per-unit log-ratio (Thinking Machines' default kl_discount_factor); 1 = the log-ratio of
    # all the text from the unit to the end, which does not depend on how a cross-tokenizer
    # teacher cuts that text into units (xdistill/losses/onpolicy.py). Every teacher must be k1
    discount: float = 0.0
    # reward weighting of samples: weight N * softmax(reward / reward_beta) over the N samples
    # of the whole step (every micro-batch and rank) when the rollouts carry rewards; 0 = off
    reward_beta: float = 0.0
    # fraction lambda of optimizer steps that train on an off-policy batch from offpolicy.data
    # instead of rollouts (0 = pure on-policy)
    offpolicy_lambda: float = 0.0
    # how steps are picked for lambda: ratio (deterministic: step s is off-policy when
    # floor(s * lambda) > floor((s - 1) * lambda)) or probability (seeded by train.seed and s)
    offpolicy_mode: Literal["ratio", "probability"] = "ratio"


@dataclass
class OffPolicyMixConfig:
    """The corpus of mixed-in off-policy batches (loss.offpolicy_lambda > 0)."""

    # corpus, packing and collation (same format as train offpolicy's data section)
    data: DataConfig = field(default_factory=DataConfig)
    # weight of the student's own next-token CE on off-policy batches
    ce_weight: float = 0.0


@dataclass
class OnPolicyConfig(RunConfig):
    """``xdistill train onpolicy``: the student samples responses, teachers score them (the
    shared sections: :class:`RunConfig`)."""

    # teachers, each with its own tokenizer, worker and on-policy loss
    teachers: list[OnPolicyTeacherConfig] = field(default_factory=list)
    # prompt sources and batching
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    # rollout engine and sampling (temperature 1 recommended)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    # re-tokenization and alignment for the teachers
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    # loss combination, clamps, reward weighting, off-policy mixing
    loss: OnPolicyLossConfig = field(default_factory=OnPolicyLossConfig)
    # off-policy batches mixed in when loss.offpolicy_lambda > 0
    offpolicy: OffPolicyMixConfig = field(default_factory=OffPolicyMixConfig)


def validate_onpolicy(cfg: OnPolicyConfig) -> OnPolicyConfig:
    """Checks that need no compute; raises ConfigError naming the key. Fills derived defaults."""
    validate_run_sections(cfg)
    default_out_dir(cfg, "onpolicy")
    validate_student_source(cfg)
    if cfg.train.data_ranks:
        raise ConfigError("train.data_ranks: off-policy only (on-policy prompts are sharded over "
                          "the world size); leave it 0")
    if not cfg.prompts.paths:
        raise ConfigError("prompts.paths: no prompt files given")
    for i, p in enumerate(cfg.prompts.paths):
        check_path(p, f"prompts.paths.{i}")
    if cfg.prompts.batch_size < 1:
        raise ConfigError(f"prompts.batch_size must be >= 1, got {cfg.prompts.batch_size}")
    if not cfg.teachers:
        raise ConfigError("teachers: an on-policy run needs at least one teacher")
    check_teacher_names(cfg.teachers)
    for i, t in enumerate(cfg.teachers):
        _validate_teacher(t, f"teachers.{i}")
    lam = cfg.loss.offpolicy_lambda
    if not 0.0 <= lam <= 1.0:
        raise ConfigError(f"loss.offpolicy_lambda must lie in [0, 1], got {lam}")
    if lam > 0 and not cfg.offpolicy.data.paths:
        raise ConfigError("offpolicy.data.paths: loss.offpolicy_lambda > 0 needs a corpus")
    if lam > 0:
        validate_data(cfg.offpolicy.data, "offpolicy.data")
    if not cfg.offpolicy.ce_weight >= 0:    # NaN too
        raise ConfigError(f"offpolicy.ce_weight must be >= 0, got {cfg.offpolicy.ce_weight}")
    if cfg.prompts.num_workers < 0:
        raise ConfigError(f"prompts.num_workers must be >= 0, got {cfg.prompts.num_workers}")
    if not cfg.loss.reward_beta >= 0:    # NaN too
        raise ConfigError(f"loss.reward_beta must be >= 0, got {cfg.loss.reward_beta}")
    for name in ("loss_max", "exp_clip"):
        value = getattr(cfg.loss, name)
        if value is not None and not value >= 0:
            raise ConfigError(f"loss.{name} must be >= 0 or null (off), got {value}")
    if cfg.loss.logp_min is not None and not cfg.loss.logp_min <= 0:
        raise ConfigError(f"loss.logp_min must be <= 0 (a log-probability) or null, got "
                          f"{cfg.loss.logp_min}")
    check_chunk_size(cfg.loss.chunk_size)
    _validate_discount(cfg)
    if cfg.loss.byte_units == "token":
        chunk_only = set(BYTE_CREDIT_KINDS) - set(SAMPLED_LOSSES)   # dpca, simple_opd
        bad = [t.loss.kind for t in cfg.teachers if t.loss.kind in chunk_only]
        if cfg.loss.credit != "byte" or bad:
            raise ConfigError("loss.byte_units = 'token' needs loss.credit = 'byte' (got "
                              f"{cfg.loss.credit!r}) and applies to k1/k3 teachers; dpca and "
                              f"simple_opd take chunk units (got {bad})")
    if cfg.loss.credit == "byte":
        for i, t in enumerate(cfg.teachers):
            if t.loss.kind in BYTE_CREDIT_KINDS and t.worker.output != "logits":
                raise ConfigError(f"teachers.{i}.worker.output: loss.credit = 'byte' needs the "
                                  f"teacher's full logits (worker.output = 'logits', got "
                                  f"{t.worker.output!r}) for its {t.loss.kind!r} loss")
    return cfg


def _validate_discount(cfg: OnPolicyConfig) -> None:
    gamma = cfg.loss.discount
    if not 0.0 <= gamma <= 1.0:    # NaN too
        raise ConfigError(f"loss.discount must lie in [0, 1], got {gamma}")
    for i, t in enumerate(cfg.teachers):
        if gamma and t.loss.kind != "k1":
            raise ConfigError(f"teachers.{i}.loss.kind: loss.discount = {gamma} applies to k1 "
                              f"teachers only; teacher {t.name!r} is {t.loss.kind!r}")


def _validate_teacher(t: OnPolicyTeacherConfig, key: str) -> None:
    validate_teacher_worker(t, key)
    if t.worker.cache_mb > 0:
        raise ConfigError(f"{key}.worker.cache_mb: on-policy rollouts are new every step, so a "
                          "teacher output cache never hits; leave it at 0")
    lc = t.loss
    if lc.kind not in ONPOLICY_LOSSES or lc.cross not in CROSS_ROUTES:
        raise ConfigError(f"{key}.loss: unknown kind {lc.kind!r} or cross route {lc.cross!r}")
    check_loss_scale(lc, key)
    if t.worker.temperature != 1.0 and t.worker.temperature != lc.temperature:
        raise ConfigError(f"{key}.worker.temperature ({t.worker.temperature}) must be 1 or equal "
                          f"to loss.temperature ({lc.temperature})")
    full = lc.kind in ("reverse_kl", "jsd", "strict_topk", "bpm", "escd")
    if lc.kind in ("dpca", "simple_opd") and t.worker.output == "projected":
        raise ConfigError(f"{key}: loss {lc.kind!r} needs the teacher's token log-probs "
                          "(worker.output logits or topk)")
    if lc.top_k < 1 or not lc.ref_beta >= 0 or not (0 <= lc.clip_low < 1) \
            or not lc.clip_high >= 0 or not lc.dual_clip > 1 or not 0 <= lc.beta <= 1:  # NaN too
        raise ConfigError(f"{key}.loss: top_k must be >= 1, ref_beta >= 0, clip_low in [0, 1), "
                          "clip_high >= 0, dual_clip > 1 and beta in [0, 1]")
    if full and t.worker.output != "logits":
        raise ConfigError(f"{key}: loss {lc.kind!r} needs worker.output = 'logits' "
                          f"(got {t.worker.output!r}); use k1/k3 with top-k teachers")
    if lc.kind == "topk_kl" and t.worker.output != "topk":
        raise ConfigError(f"{key}: loss 'topk_kl' needs worker.output = 'topk'")
    if t.worker.output == "support":
        raise ConfigError(f"{key}.worker.output: 'support' outputs (logits at a projection's "
                          "support, no token log-probs) are not used on-policy; use 'logits'")
    if t.worker.output == "projected":
        raise ConfigError(f"{key}.worker.output: 'projected' outputs are not used on-policy; use "
                          "logits (reverse_kl/jsd through loss.projection) or topk (k1/k3/topk_kl)")
    if full and lc.cross == "projection" and lc.projection:
        check_path(lc.projection, f"{key}.loss.projection")
