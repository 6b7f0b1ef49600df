"""On-policy losses: the student's own samples scored by a teacher of any tokenizer.

Legend: B batch, Ts/Tt student/teacher tokens, Vs/Vt vocabularies, K top-k, C chunks, N loss units
(tokens for a same-tokenizer teacher, aligned chunks for a cross-tokenizer one), n rows of a block.

Notation (docs/architecture.md §6): student ``p`` (the sampling policy), teacher ``q``; ``y`` the sampled
tokens. For a loss unit ``u`` (a student token with its identical teacher token, or an aligned
chunk covering identical bytes on both sides) the log-ratio is

    r_u = sum_{teacher tokens j in u} log q(t_j | t_<j)  -  sum_{student tokens i in u} log p(y_i | y_<i)

so for a same-tokenizer teacher ``r_t = log q(y_t) - log p(y_t)`` and for a cross-tokenizer chunk
``r`` compares the two sides' likelihoods of the chunk's bytes (each side's own segmentation).
That is ``credit = "token"``. With ``credit = "byte"`` (cross tokenizer; k1, k3, dpca,
simple_opd) ``r_u = log Q_T(u) - log Q_S(u)``: each side's probability of the unit's bytes
followed by the boundary the student's tokenization implies, a stop merged with the content it
ends (:mod:`xdistill.losses.bytecredit`); a teacher token that is merely a prefix of a longer
answer no longer rewards a truncated one.

Sampled estimators of ``KL(p || q)`` (samples from ``p``):

* ``k1``: ``-r``. Its gradient ignores the teacher when backpropagated, so it is used only as a
  policy-gradient advantage with stop-gradient: ``loss_u = -sg(A_u) * log p(u)``, ``A_u = r_u``
  (``log p(u)`` = the summed student log-probs of the unit). Minimising raises the likelihood of
  units the teacher likes more than the student does.
* ``k3``: ``e^r - 1 - r`` (>= 0, unbiased since ``E_p[e^r] = 1``), backpropagated directly:
  ``d k3 / d log p = 1 - e^r``.

Full-distribution losses reuse :mod:`xdistill.losses.divergences` / :mod:`xdistill.losses.cross`:
``reverse_kl`` (``KL(p || q)``: same tokenizer over the full vocabulary, cross tokenizer through
the projection (P-KL, chunk starts) or over exact 1:1 chunks on the shared vocabulary),
``topk_kl`` (forward KL on the teacher's top-k with a tail bucket; same tokenizer only) and
``jsd`` (JSD(beta), TRL convention: beta=1 reverse-like, 0 forward-like).

Clamps of the sampled estimators (None disables one), with counters of how often each fires:

* ``logp_min`` (default **off**): floors every sampled-token log-prob on both sides before forming
  ``r``. It is not part of the published k1 (Thinking Machines' on-policy distillation, verl's
  ``kl_penalty``: no floor) and it breaks k1/k3: a unit both models find impossible scores
  ``r ~ 0``, the best advantage available when merely unlikely units score -6 to -11, and the
  policy gradient walks the student into output both models reject. Kept as an option.
* ``exp_clip`` (20): clips ``r`` into ``[-20, 20]`` before ``e^r`` (k3), and
* ``loss_max`` (10): clamps the per-unit loss value (k3) or the advantage (k1) symmetrically
  into ``[-10, 10]`` -- these two are verl's ``low_var_kl`` (k3) clamps (``kl.clamp(-20, 20)``
  before ``exp``, the result clamped to ``[-10, 10]``), reused for the k1 advantage.

A clamp that fires blocks the gradient through that value (``torch.clamp``), as in verl.

Unpaired tokens (``unpaired_BTs``): student loss tokens whose bytes the teacher read but that no
chunk pairs with it (bytes the teacher's vocabulary cannot spell, e.g. a control byte missing from
its byte alphabet, or a region the aligner could not pair). Without a penalty such bytes would
escape all supervision, and a sampling student drifts into them. With ``unpaired = "floor"``
(default) each such token is one more loss unit whose teacher log-prob is taken to be
``logp_min`` when that floor is set, else ``UNPAIRED_LOGP`` (-10: "the teacher deems these bytes
near impossible"), trained in the policy-gradient form ``loss_i = -sg(A_i) * log p(y_i)`` with
``A_i = clamp(that log-prob - log p(y_i), +-loss_max)`` for every kind (full-distribution kinds have no teacher distribution there);
``"ignore"`` leaves them out (and out of the counts).

Stop tokens (``stop_BTs``: the student's final EOS / end-of-turn token of responses that
stopped): with ``stop_advantage = "zero"`` (SimpleOPD) the units that contain one get zero
advantage in the sampled estimators (they still count in the normalisation), so the teacher's
view of where to stop cannot drive the length; ``"teacher"`` (default) treats them like any
other unit (the scorer pairs them with the teacher's own end token). This applies to k1 and k3;
simple_opd always zeroes its stop units and dpca scores the stop with the content it ends.

Advantage baseline (``baseline = "mean"``; dpca / simple_opd: ``params.baseline``): the
sampled-token advantages minus their mean over the micro-batch's units, before the clamp
(``"token_mean"``: minus the unit's student-token count times the mean advantage per student
token, so that the baseline does not depend on how the teacher's tokenization groups the
student's tokens into units; ``"clipped_mean"``: the advantages clamped to ``loss_max`` first,
then centred on their own mean, so that a few units a sharp teacher scores at -20 nats cannot
drag the baseline below moderately wrong samples; :func:`xdistill.losses.policy.center_advantages`). A
constant baseline leaves the expected gradient unchanged (``E_p[grad log p] = 0``) and cuts its
variance when a teacher rates nearly every sample below the student's own likelihood (uncentred,
every advantage is negative and each update pushes down whatever was sampled). In the quality
harness it does not, by itself, stop the sampled-token arms from learning to never stop
(``benchmarks/quality/RESULTS.md``, on-policy section).

Discount (``discount = gamma``, k1 only; default 0, Thinking Machines' ``kl_discount_factor``):
the advantage of unit ``u`` becomes the discounted return ``G_u = sum_{v >= u} gamma^(v - u) r_v``
over the units of its sample (``v - u`` counted in units), before the baseline and the clamp.
``gamma = 0`` is the per-unit k1 above. ``gamma = 1`` is the policy gradient of the
*sequence-level* reverse KL with the causal (reward-to-go) credit: ``G_u`` is the log-ratio of all
the text from ``u`` to the end, which under exact byte-level credit is the same whichever
tokenization cuts that text into units, so a cross-tokenizer teacher's coarser or shifted units
(a stop merged with the period it ends) no longer change what the earlier units are credited
with; its cost is variance (every later unit's log-ratio lands on each earlier one). Zeroed stop
units add no log-ratio; unpaired tokens keep their own per-token penalty
(:func:`xdistill.losses.onpolicy_sampled.discounted_returns`).

Reward weighting: an optional per-sample weight ``w_b`` multiplies every unit of sample ``b``
(:func:`reward_weights` gives HJSang's ``B * softmax(reward / beta)``). Normalisation: the weighted
sum over units divided by ``num_valid`` (the trainer's global count of units, from
:func:`count_onpolicy_units` summed over ranks and micro-batches) or the local count.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from xdistill.losses import bytecredit as _bc
from xdistill.losses.bytecredit_tokens import count_token_units, evaluate_token_credit
from xdistill.losses import cross as _cross
from xdistill.losses import onpolicy_full as _onfull
from xdistill.losses import divergences as _div
from xdistill.losses.chunks import ChunkAlignment, resolve_count
from xdistill.losses.engine import DEFAULT_CHUNK_SIZE, shift_targets, token_logprobs
from xdistill.losses.onpolicy_kinds import (KIND_COUNTERS, KINDS_2026, KindParams,
                                            count_kind_units, kind_loss)
from xdistill.losses.onpolicy_sampled import (  # noqa: F401  (re-exported)
    Clamps, OnPolicyLossOutput, sampled_loss, sampled_unit_losses, unit_flags, unit_logprobs,
    unit_token_counts)
from xdistill.losses.policy import BASELINES

ONPOLICY_LOSSES = ("reverse_kl", "topk_kl", "jsd", "k1", "k3") + KINDS_2026
SAMPLED_LOSSES = ("k1", "k3")
CROSS_ROUTES = ("projection", "exact")
UNPAIRED = ("floor", "ignore")
STOP_ADVANTAGE = ("teacher", "zero")
# the teacher log-prob assumed for unpaired student tokens when no logp_min floor is set
UNPAIRED_LOGP = -10.0
COUNTERS = ("logp_floor_student", "logp_floor_teacher", "exp_clip", "loss_clamp", "zero_stop",
            "unpaired")


@dataclass(frozen=True)
class OnPolicyLossSpec:
    """Which on-policy loss, and its knobs."""

    # one of ONPOLICY_LOSSES: "reverse_kl" | "topk_kl" | "jsd" | "k1" | "k3"
    kind: str = "k3"
    # JSD beta (kind "jsd")
    beta: float = 0.5
    # softmax temperature of the full-distribution losses and of the sampled log-probs
    temperature: float = 1.0
    # cross-tokenizer route of reverse_kl/jsd: "projection" (P-KL at chunk starts) | "exact"
    cross: str = "projection"
    # clamps of the sampled estimators
    clamps: Clamps = field(default_factory=Clamps)
    # unpaired student tokens: "floor" (penalty at the log-prob floor) | "ignore" (module doc)
    unpaired: str = "floor"
    # stop tokens in k1/k3: "teacher" (scored like any unit) | "zero" advantage (module doc)
    stop_advantage: str = "teacher"
    # knobs of the 2026 kinds (strict_topk, dpca, simple_opd, bpm, escd)
    params: KindParams = field(default_factory=KindParams)
    # k1: advantage baseline, "none", "mean" over the micro-batch's units or "token_mean" (per
    # student token; policy.center_advantages); dpca / simple_opd take theirs from params.baseline
    baseline: str = "none"
    # credit of k1/k3/dpca/simple_opd units from a cross-tokenizer teacher: "token" (summed
    # token log-probs of each side) or "byte" (each side's probability of the unit's bytes and
    # boundary; needs the teacher's full logits; xdistill/losses/bytecredit.py)
    credit: str = "token"
    # units of byte-level credit (k1/k3): "chunk" (the aligned chunk, the stop merged with the
    # content it ends) or "token" (each student token of the chunk: the chunk's covering
    # probability split by the chain rule; xdistill/losses/bytecredit_tokens.py)
    byte_units: str = "chunk"
    # k1: discount gamma in [0, 1] of the advantage's return over the sample's later units
    # (module doc); 0 = the per-unit advantage
    discount: float = 0.0

    def __post_init__(self):
        if self.unpaired not in UNPAIRED:
            raise ValueError(f"unknown unpaired policy {self.unpaired!r}; allowed: {UNPAIRED}")
        if self.baseline not in BASELINES or self.params.baseline not in BASELINES:
            raise ValueError(f"unknown advantage baseline; allowed: {BASELINES}")
        if self.stop_advantage not in STOP_ADVANTAGE:
            raise ValueError(f"unknown stop_advantage {self.stop_advantage!r}; allowed: "
                             f"{STOP_ADVANTAGE}")
        if self.kind not in ONPOLICY_LOSSES:
            raise ValueError(f"unknown on-policy loss {self.kind!r}; allowed: {ONPOLICY_LOSSES}")
        if self.cross not in CROSS_ROUTES:
            raise ValueError(f"unknown cross route {self.cross!r}; allowed: {CROSS_ROUTES}")
        if self.credit not in _bc.CREDITS:
            raise ValueError(f"unknown credit {self.credit!r}; allowed: {_bc.CREDITS}")
        if self.byte_units not in _bc.BYTE_UNITS:
            raise ValueError(f"unknown byte_units {self.byte_units!r}; allowed: {_bc.BYTE_UNITS}")
        if self.byte_units == "token" and self.kind not in SAMPLED_LOSSES:
            raise ValueError(f"byte_units 'token' applies to k1 and k3; on-policy loss "
                             f"{self.kind!r} takes chunk units")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0.0 <= self.discount <= 1.0:
            raise ValueError(f"discount must lie in [0, 1], got {self.discount}")
        if self.discount and self.kind != "k1":
            raise ValueError(f"discount applies to k1 only, not to on-policy loss {self.kind!r}")


def reward_weights(rewards_B: torch.Tensor, beta: float, *, count: int | None = None,
                   log_norm: float | None = None) -> torch.Tensor:
    """Per-sample weights ``N * softmax(rewards / beta)`` (mean 1 over the N samples; HJSang's
    reward-weighted OPD). By default the N samples are ``rewards_B``; a step split into
    micro-batches (or ranks) passes the whole step's ``count`` N and ``log_norm`` =
    ``log sum exp(r / beta)`` over all N samples, so a sample's weight does not depend on the
    split."""
    if beta <= 0:
        raise ValueError(f"reward weighting beta must be > 0, got {beta}")
    r = rewards_B.detach().double() / beta
    if log_norm is None:
        return (r.numel() * torch.softmax(r, dim=0)).float()
    return (int(count) * torch.exp(r - log_norm)).float()


def input_token_logprobs(logits_BTV: torch.Tensor, ids_BT: torch.Tensor, mask_BT=None, *,
                         temperature: float = 1.0, chunk_size=DEFAULT_CHUNK_SIZE) -> torch.Tensor:
    """``out[b, i] = log softmax(logits[b, i-1] / tau)[ids[b, i]]`` at *input* positions.

    0 at ``i = 0`` and where ``mask_BT`` is False. Differentiable in ``logits_BTV`` (chunked).
    """
    out_BT = token_logprobs(logits_BTV, shift_targets(ids_BT, mask_BT), temperature, chunk_size)
    return torch.cat([torch.zeros_like(out_BT[:, :1]), out_BT[:, :-1]], dim=1)


def count_onpolicy_units(spec: OnPolicyLossSpec, s_loss_mask_BTs: torch.Tensor,
                         align: ChunkAlignment | None = None, t_loss_mask_BTt=None,
                         unpaired_BTs=None, *, student_ids_BTs=None, tables=None,
                         stop_BTs=None) -> int:
    """Local loss units of one teacher: tokens (same tokenizer) or loss chunks (cross), or those
    of a 2026 kind (:mod:`xdistill.losses.onpolicy_kinds`), plus the unpaired student tokens under
    ``unpaired = "floor"`` (once: simple_opd's units already hold every student loss token, so
    its unpaired tokens add a penalty term but no unit). Under byte-level credit a stop merged
    with the content it ends is one unit (``stop_BTs``: :func:`xdistill.losses.bytecredit.
    credit_alignment`)."""
    if _bc.uses_byte_credit(spec.credit, spec.kind, align):
        align = _bc.credit_alignment(spec.kind, spec.stop_advantage, align, stop_BTs,
                                     s_loss_mask_BTs, t_loss_mask_BTt)
        if spec.byte_units == "token":
            return (count_token_units(align, s_loss_mask_BTs, t_loss_mask_BTt)
                    + count_unpaired(spec, s_loss_mask_BTs, unpaired_BTs))
    if spec.kind in KINDS_2026:
        if align is None:
            raise ValueError(f"on-policy loss {spec.kind!r} needs a chunk alignment (the identity "
                             "view's for a same-tokenizer teacher)")
        n = count_kind_units(spec.kind, align, s_loss_mask_BTs, t_loss_mask_BTt,
                             student_ids_BTs=student_ids_BTs, tables=tables, params=spec.params)
        if spec.kind == "simple_opd":  # its units are every loss token, unpaired ones included
            return n
        return n + count_unpaired(spec, s_loss_mask_BTs, unpaired_BTs)
    if align is None:
        return _div.count_valid_tokens(s_loss_mask_BTs)
    exact = spec.kind in ("reverse_kl", "jsd") and spec.cross == "exact"
    n = _cross.count_loss_chunks(align, s_loss_mask_BTs, t_loss_mask_BTt, exact_only=exact)
    return n + count_unpaired(spec, s_loss_mask_BTs, unpaired_BTs)


def _unpaired_sel(s_loss_mask_BTs, unpaired_BTs) -> torch.Tensor:
    sel = unpaired_BTs.bool() & s_loss_mask_BTs.bool()
    sel = sel.clone()
    sel[:, 0] = False  # token 0 has no prediction
    return sel


def count_unpaired(spec: OnPolicyLossSpec, s_loss_mask_BTs, unpaired_BTs) -> int:
    """Unpaired student loss tokens that are loss units (``unpaired = "floor"``)."""
    if unpaired_BTs is None or spec.unpaired != "floor":
        return 0
    return int(_unpaired_sel(s_loss_mask_BTs, unpaired_BTs).sum())


def unpaired_penalty(spec: OnPolicyLossSpec, student_logits_BTsV, student_ids_BTs,
                     s_loss_mask_BTs, unpaired_BTs, *, chunk_size=DEFAULT_CHUNK_SIZE,
                     weight_BTs=None):
    """(sum of the floor penalty over the unpaired tokens, their number; module doc).
    ``weight_BTs`` (broadcastable to ``[B, Ts]``) weights each token (reward weighting)."""
    sel = _unpaired_sel(s_loss_mask_BTs, unpaired_BTs)
    n = int(sel.sum())
    if n == 0:
        return student_logits_BTsV[..., :0].sum().float(), 0   # -inf padding * 0 is NaN
    logp = input_token_logprobs(student_logits_BTsV, student_ids_BTs, sel,
                                temperature=spec.temperature, chunk_size=chunk_size)[sel]
    floor = spec.clamps.logp_min if spec.clamps.logp_min is not None else UNPAIRED_LOGP
    adv = (floor - logp.detach())
    if spec.clamps.loss_max is not None:
        adv = adv.clamp(-spec.clamps.loss_max, spec.clamps.loss_max)
    pen = -adv * logp
    if weight_BTs is not None:
        pen = pen * weight_BTs.expand_as(sel)[sel].to(pen.dtype)
    return pen.sum(), n


# ---------------------------------------------------------------------------- sampled estimators
def onpolicy_loss(spec: OnPolicyLossSpec, student_logits_BTsV, student_ids_BTs, s_loss_mask_BTs,
                  *, align: ChunkAlignment | None = None, t_loss_mask_BTt=None,
                  teacher_logits_BTtV=None, teacher_ids_BTt=None, teacher_token_logp_BTt=None,
                  topk_logp_BTtK=None, topk_idx_BTtK=None, tail_logmass_BTt=None, projection=None,
                  shared_s_idx_N=None, shared_t_idx_N=None, sample_weight_B=None,
                  unpaired_BTs=None, stop_BTs=None, behaviour_logp_BTs=None,
                  ref_logp_BTs=None, tables=None, byte_credit=None, long_tables=None,
                  num_valid=None,
                  chunk_size=DEFAULT_CHUNK_SIZE) -> OnPolicyLossOutput:
    """One teacher's on-policy loss (``align`` None = same tokenizer; see module doc).

    Teacher inputs by kind: ``k1``/``k3`` need ``teacher_token_logp_BTt`` (log q of the teacher's
    own tokens at input positions) or ``teacher_logits_BTtV`` + ``teacher_ids_BTt`` (the student
    ids for a same-tokenizer teacher); ``reverse_kl``/``jsd`` need ``teacher_logits_BTtV`` (plus
    ``projection`` or the ``shared_*_idx_N`` maps across tokenizers); ``topk_kl`` needs
    ``topk_logp_BTtK``/``topk_idx_BTtK`` at the loss temperature. Teacher logits are outputs at
    temperature 1 (divide them beforehand if the worker tempered them). ``unpaired_BTs`` (cross
    tokenizer) and ``stop_BTs``: see the module doc. The 2026 kinds
    (:mod:`xdistill.losses.onpolicy_kinds`) also take ``behaviour_logp_BTs`` (rollout-time
    log-probs; dpca, simple_opd), ``ref_logp_BTs`` (simple_opd's reference KL) and ``tables``
    (bpm, escd; with ``params.long_tokens`` also ``long_tables`` and ``teacher_ids_BTt``); they
    do not take per-sample weights. ``spec.credit = "byte"`` (cross tokenizer,
    k1/k3/dpca/simple_opd) needs ``byte_credit`` (:class:`xdistill.losses.bytecredit.ByteCredit`),
    ``teacher_logits_BTtV`` and ``teacher_ids_BTt``.
    """
    units = count_onpolicy_units(spec, s_loss_mask_BTs, align, t_loss_mask_BTt,
                                 unpaired_BTs if align is not None else None,
                                 student_ids_BTs=student_ids_BTs, tables=tables, stop_BTs=stop_BTs)
    count = resolve_count(num_valid, units)
    t_chunk, credit_counters, gaps = None, {}, (float("nan"), float("nan"))
    cross, unit_mask_BTs, t_loss_mask = align is not None, s_loss_mask_BTs, t_loss_mask_BTt
    if _bc.uses_byte_credit(spec.credit, spec.kind, align):
        args = (spec, byte_credit, align, stop_BTs, student_logits_BTsV, student_ids_BTs,
                s_loss_mask_BTs, teacher_logits_BTtV, teacher_ids_BTt, t_loss_mask_BTt,
                chunk_size)
        if spec.byte_units == "token":    # student-token units: as with the student's tokenizer
            teacher_token_logp_BTt, unit_mask_BTs, credit_counters, gaps = _byte_credit(
                *args, tokens=True)
            align, t_loss_mask = None, None
        else:
            align, t_chunk, credit_counters, gaps = _byte_credit(*args)
    kw = dict(align=align, t_loss_mask_BTt=t_loss_mask, sample_weight_B=sample_weight_B,
              count=count, chunk_size=chunk_size)
    teacher = {"logits_BTtV": teacher_logits_BTtV, "ids_BTt": teacher_ids_BTt,
               "token_logp_BTt": teacher_token_logp_BTt, "chunk_logp_BC": t_chunk,
               "topk_logp_BTtK": topk_logp_BTtK, "topk_idx_BTtK": topk_idx_BTtK,
               "tail": tail_logmass_BTt, "projection": projection,
               "shared_s_idx_N": shared_s_idx_N, "shared_t_idx_N": shared_t_idx_N}
    if spec.kind in KINDS_2026:
        out = _kind_2026(spec, student_logits_BTsV, student_ids_BTs, s_loss_mask_BTs, teacher, kw,
                         units, behaviour_logp_BTs=behaviour_logp_BTs, stop_BTs=stop_BTs,
                         ref_logp_BTs=ref_logp_BTs, tables=tables, long_tables=long_tables)
    elif spec.kind in SAMPLED_LOSSES:
        zero = stop_BTs if spec.stop_advantage == "zero" else None
        out = _sampled(spec, student_logits_BTsV, student_ids_BTs, unit_mask_BTs,
                       teacher_token_logp_BTt, teacher_logits_BTtV, teacher_ids_BTt, zero,
                       t_chunk, **kw)
    else:
        out = OnPolicyLossOutput(_onfull.full_loss(spec, student_logits_BTsV, s_loss_mask_BTs,
                                                   teacher, **kw), 0, {})
    loss, counters = out.loss, {**out.counters, **credit_counters}
    if cross:
        pen, n = _unpaired_term(spec, student_logits_BTsV, student_ids_BTs, s_loss_mask_BTs,
                                unpaired_BTs, sample_weight_B, chunk_size)
        loss, counters = (loss + pen / count if n else loss), {**counters, "unpaired": n}
    return OnPolicyLossOutput(loss, units, counters, out.mean_logratio, *gaps)



def _kind_2026(spec, s_logits, s_ids, s_mask, teacher: dict, kw: dict, units: int, *,
               behaviour_logp_BTs, stop_BTs, ref_logp_BTs, tables, long_tables):
    """A 2026 kind's loss (:mod:`xdistill.losses.onpolicy_kinds`) from :func:`onpolicy_loss`'s
    resolved teacher inputs and keyword arguments ``kw``."""
    if kw["sample_weight_B"] is not None:
        raise ValueError(f"on-policy loss {spec.kind!r} takes no per-sample reward weights")
    loss, counters = kind_loss(
        spec.kind, spec.params, s_logits, s_ids, s_mask, align=kw["align"],
        t_loss_mask_BTt=kw["t_loss_mask_BTt"], teacher_logits_BTtV=teacher["logits_BTtV"],
        teacher_token_logp_BTt=teacher["token_logp_BTt"], behaviour_logp_BTs=behaviour_logp_BTs,
        stop_BTs=stop_BTs, ref_logp_BTs=ref_logp_BTs, shared_s_idx_N=teacher["shared_s_idx_N"],
        shared_t_idx_N=teacher["shared_t_idx_N"], tables=tables, temperature=spec.temperature,
        count=kw["count"], chunk_size=kw["chunk_size"],
        teacher_chunk_logp_BC=teacher["chunk_logp_BC"], teacher_ids_BTt=teacher["ids_BTt"],
        long_tables=long_tables)
    return OnPolicyLossOutput(loss, units, counters)

def _byte_credit(spec, byte_credit, align, stop_BTs, s_logits, s_ids, s_mask, t_logits, t_ids,
                 t_mask, chunk_size, tokens: bool = False):
    """Byte-level credit: (re-cut alignment, teacher chunk log-probs, counters, summed gaps);
    ``tokens``: (effective teacher log-prob per student token, the unit tokens, counters, gaps)."""
    evaluate = evaluate_token_credit if tokens else _bc.evaluate_byte_credit
    first, second, cstats = evaluate(
        spec.kind, spec.stop_advantage, byte_credit, align, stop_BTs, s_logits, s_ids, s_mask,
        t_logits, t_ids, t_mask, temperature=spec.temperature, chunk_size=chunk_size)
    gaps = ((cstats.teacher_gap * cstats.units, cstats.teacher_gap_seg * cstats.units)
            if cstats.units else (0.0, 0.0))
    return first, second, {"credit_floor": cstats.teacher_floor,
                           "credit_floor_student": cstats.student_floor}, gaps


def _unpaired_term(spec, s_logits, s_ids, s_mask, unpaired_BTs, sample_weight_B, chunk_size):
    """(summed penalty, count) of the student's unpaired tokens; (0, 0) where there are none."""
    if count_unpaired(spec, s_mask, unpaired_BTs) == 0:
        return 0.0, 0
    w_BTs = None
    if sample_weight_B is not None:
        w_BTs = sample_weight_B.to(s_logits.device, torch.float32)[:, None]
    return unpaired_penalty(spec, s_logits, s_ids, s_mask, unpaired_BTs, chunk_size=chunk_size,
                            weight_BTs=w_BTs)


def _sampled(spec, s_logits, s_ids, s_mask, t_token_logp, t_logits, t_ids, zero_BTs, t_chunk,
             *, align, t_loss_mask_BTt, sample_weight_B, count, chunk_size) -> OnPolicyLossOutput:
    tau = spec.temperature
    s_logp = input_token_logprobs(s_logits, s_ids, s_mask, temperature=tau, chunk_size=chunk_size)
    t_logp = t_token_logp
    if t_chunk is not None:  # byte-level credit: the per-chunk values replace the token sums
        t_logp = torch.zeros(align.t_chunk_BTt.shape, dtype=s_logp.dtype, device=s_logp.device)
    elif t_logp is None:
        ids = s_ids if (align is None and t_ids is None) else t_ids
        if t_logits is None or ids is None:
            raise ValueError(f"on-policy loss {spec.kind!r} needs teacher_token_logp_BTt or "
                             "teacher_logits_BTtV with the teacher ids")
        t_logp = input_token_logprobs(t_logits.detach(), ids, temperature=tau,
                                      chunk_size=chunk_size)
    return sampled_loss(spec.kind, s_logp, t_logp.detach(), s_mask, align=align,
                        t_loss_mask_BTt=t_loss_mask_BTt, clamps=spec.clamps,
                        sample_weight_B=sample_weight_B, num_valid=count, zero_BTs=zero_BTs,
                        baseline=spec.baseline, t_chunk_logp_BC=t_chunk,
                        discount=spec.discount)


def counter_keys(spec: OnPolicyLossSpec, cross: bool) -> tuple[str, ...]:
    """The integer counters :func:`onpolicy_loss` reports for ``spec`` (always the same keys)."""
    keys: tuple[str, ...] = ()
    if spec.kind in SAMPLED_LOSSES:
        keys = ("logp_floor_student", "logp_floor_teacher", "exp_clip", "loss_clamp")
        if spec.stop_advantage == "zero":
            keys += ("zero_stop",)
    elif spec.kind in KINDS_2026:
        keys = KIND_COUNTERS[spec.kind]
    if cross and spec.credit == "byte" and spec.kind in _bc.BYTE_CREDIT_KINDS:
        keys += ("credit_floor", "credit_floor_student")
    return keys + (("unpaired",) if cross else ())
