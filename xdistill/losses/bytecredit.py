"""Byte-level credit across tokenizers: each model's probability of a unit's *bytes* and boundary.

Legend: B batch, Ts/Tt student/teacher tokens, V vocabulary (either side), C chunks, N loss units,
K terms, R distinct logit rows, P path tokens (the unit tokens of one side, flattened), Vsort the
text tokens of a vocabulary sorted by bytes.

**Why.** Per-chunk credit compares ``sum log q(teacher tokens)`` with ``sum log p(student tokens)``.
A teacher token ``2`` that is merely a *prefix* of the teacher's answer ``23`` carries the
teacher's probability of every number starting with 2, so a student that writes the single
token ``2`` (a truncated answer) is rewarded; and a teacher whose ``.`` only ever ends a text puts
its whole "the text ends here" belief on ``.`` and none on its end token, so per-chunk credit
punishes the period and rewards the stop.

**What.** For a loss unit ``u`` with bytes ``beta`` (an aligned chunk: identical bytes on both
sides), the event is "*the text continues with ``beta``, followed by the boundary the student's
tokenization implies*": no byte string ``e`` in ``E(a)`` follows, where ``a`` is the unit's last
student token and ``E(a)`` the prefix-free set of minimal suffixes ``e`` such that ``bytes(a) + e``
is some student token (the student would have written that longer token). A unit that ends with
the student's stop token (the stop chunk merged with the content chunk it ends: "score the stop
together with the content it ends") has the event "*``beta`` and then the end of the text*".
Each model's probability of the event, from its state at the unit's start, follows the
Byte-Token Representation Lemma (Phan et al., arXiv 2410.09303): the sum, over token sequences
that *cover* the bytes (all tokens inside but the last, which may stick out), of their
probabilities (Hayase et al., arXiv 2506.14123, give an efficient algorithm for BPE).

**Bounded lookahead from one forward.** Exact covering needs the model's distribution after
*every* covering prefix; one forward gives it only along the model's own tokenization
``t_0 .. t_{n-1}`` of the unit (the on-path tokens; ``pi_m = prod_{i < m} q(t_i)``). At each
on-path level ``m`` (remaining bytes ``rho_m``) the token ``w`` taken there is classified:

* ``w`` sticks out past ``beta`` (``bytes(w) = rho_m + s``, ``s`` non-empty): the boundary is
  decided by ``s`` -- met (``s`` starts with no ``e`` and is no strict prefix of one: in the
  lower bound), violated (``s`` starts with an ``e``: 0), or open (``s`` a strict prefix of an
  ``e``: in the gap). With a stop, every such ``w`` violates "the text ends here";
* ``w`` is off the model's path and ends inside or exactly at ``beta`` (its continuation is not
  computed): in the gap, with weight <= 1;
* ``w = t_m``: recurse; after the whole unit, the boundary ``1 - sum_e P([e])`` is read from the
  next on-path row (tokens starting with an ``e``: violated; strict prefixes of an ``e``: gap),
  or, with a stop, the stop token's own probability.

A unit whose first token starts with bytes before the unit (a teacher token that straddles the
prompt/response edge, ``" Paris"`` after a prompt ending in a space: its phantom bytes) is
scored *given* those bytes: both bounds are divided by the covering probability of the phantom
bytes alone from the same state (its upper bound, exact for one byte; ``ByteTerms.den_N``).

So ``P_lb = sum_m pi_m ok_m + pi_n B_lb <= P_exact <= P_ub = P_lb + gap``; both bounds come from
the same forward, the measured error is ``log P_ub - log P_lb`` (counted), and ``P_lb`` is exact
whenever the model puts no mass off its own path (single-byte extensions, digit-splitting
vocabularies). The host side (:mod:`xdistill.rollout.bytecredit`) turns the bytes into the terms
(:class:`ByteTerms`); this module evaluates them in float64 (no gradient).

**Credit.** Both sides get the same treatment, so a teacher identical to the student gives zero:
the unit's effective teacher log-prob is ``log Q_T(u) - (log Q_S(u) - log p(u))`` with ``Q`` the
lower bounds and ``log p(u)`` the student's summed token log-probs (the policy's own action), so
``r_u = log Q_T(u) - log Q_S(u)``. It replaces the per-chunk teacher sum in k1/k3, DPCA and
SimpleOPD (:func:`chunk_teacher_logp`). Where a side has a role token inside a unit other than
its final stop, the unit falls back to that side's token credit (one term ``pi_all``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from xdistill.losses.chunks import ChunkAlignment, chunk_sum, loss_chunks
from xdistill.losses.engine import DEFAULT_CHUNK_SIZE, LOGP_FLOOR, shift_targets, token_logprobs
from xdistill.losses.ranges import range_log_masses, slot_logsumexp

# mass kinds of a term: a range of the byte-sorted text tokens, one token id, 1, the tokens
# outside the byte-sorted vocabulary (end, role and padding ids)
MASS_RANGE, MASS_ID, MASS_ONE, MASS_OTHER = 0, 1, 2, 3
# the log of a bound whose terms are all exactly 0 (every probability in it underflowed or had a
# logit of -inf): a finite stand-in for log 0 (the losses' LOGP_FLOOR), counted (CreditStats)
LOG_PROB_MIN = LOGP_FLOOR


@dataclass(frozen=True)
class ByteTerms:
    """One side's terms: ``P_lb[n] = sum_{k: unit n, lb} pi_k mass_k``, ``gap[n]`` likewise;
    every mass is a sum of probabilities (no term is subtracted).

    Built by :func:`xdistill.rollout.bytecredit.build_byte_terms`; int64 unless said.
    """

    # unit of each term, [K]
    unit_K: torch.Tensor
    # True: the term belongs to the gap (upper bound only); False: the lower bound, bool [K]
    gap_K: torch.Tensor
    # path prefix pi = exp(sum of path log-probs P[start : start + len]), [K] each
    path_start_K: torch.Tensor
    path_len_K: torch.Tensor
    # mass: kind (MASS_*), distinct row index (into row_b_R/row_t_R), lo/hi (range in the sorted
    # order, or lo = token id), [K] each
    kind_K: torch.Tensor
    row_K: torch.Tensor
    lo_K: torch.Tensor
    hi_K: torch.Tensor
    # distinct logit rows: (b, output position), [R] each
    row_b_R: torch.Tensor
    row_t_R: torch.Tensor
    # path tokens: (b, input position) whose log-probs pi multiplies, [P] each
    path_b_P: torch.Tensor
    path_t_P: torch.Tensor
    # text token ids sorted by bytes, [Vsort]
    sorted_V: torch.Tensor
    # number of units
    num_units: int
    # True: a gap term whose token re-spells the path's own token at that level (another id with
    # the same bytes: a byte-fallback id, an added duplicate); reported apart, bool [K]
    respell_K: torch.Tensor | None = None
    # units whose first token starts with phantom bytes (bytes before the unit: the prompt's
    # last space in a teacher token that straddles the prompt/response edge): their bounds are
    # divided by the covering probability of those bytes alone (unit ``num_units + den_N[n]``
    # of the terms; -1: none), so the unit is scored *given* them, int64 [num_units] or None
    den_N: torch.Tensor | None = None
    # number of such denominator units (their terms follow the num_units units')
    num_den: int = 0

    def to(self, device) -> "ByteTerms":
        return ByteTerms(**{f.name: (getattr(self, f.name).to(device)
                                     if torch.is_tensor(getattr(self, f.name))
                                     else getattr(self, f.name)) for f in fields(self)})


@dataclass(frozen=True)
class ByteCredit:
    """Both sides' terms of one teacher's batch (units: :func:`credit_units` order)."""

    teacher: ByteTerms
    student: ByteTerms
    # "chunk": one unit per aligned chunk (the stop merged with the content it ends); "token": one
    # sub-unit per student token of each chunk (xdistill/losses/bytecredit_tokens.py)
    units: str = "chunk"


def merge_stop_chunks(align: ChunkAlignment, stop_BTs, s_loss_mask_BTs=None,
                      t_loss_mask_BTt=None) -> ChunkAlignment:
    """The alignment with each stop chunk (holding a student stop token) merged into the loss
    chunk right before it (both must carry loss): one unit "the content, then the end"."""
    if stop_BTs is None or not bool(stop_BTs.any()) or align.num_chunks < 2:
        return align
    ok_BC = loss_chunks(align, s_loss_mask_BTs, t_loss_mask_BTt)
    C = align.num_chunks
    hit_BC = chunk_sum(stop_BTs.bool().to(torch.int64), align.s_chunk_BTs, C) > 0
    merge_BC = torch.zeros_like(hit_BC)
    merge_BC[:, 1:] = hit_BC[:, 1:] & ok_BC[:, 1:] & ok_BC[:, :-1]
    if not bool(merge_BC.any()):
        return align

    def relabel(chunk_BT):
        c = chunk_BT.clamp(min=0)
        moved = (chunk_BT >= 0) & merge_BC.gather(1, c)
        return torch.where(moved, chunk_BT - 1, chunk_BT)

    prev_BC = torch.zeros_like(merge_BC)
    prev_BC[:, :-1] = merge_BC[:, 1:]
    return ChunkAlignment(relabel(align.s_chunk_BTs), relabel(align.t_chunk_BTt),
                          align.chunk_valid_BC.bool() & ~merge_BC,
                          align.chunk_exact_BC.bool() & ~merge_BC & ~prev_BC)


CREDITS = ("token", "byte")
# what a byte-credit unit is: the aligned chunk, or each student token inside it (the chunk's
# covering probability split by the chain rule over the student's token boundaries)
BYTE_UNITS = ("chunk", "token")
# the kinds whose units take byte-level credit (spec.credit = "byte", cross-tokenizer teachers)
BYTE_CREDIT_KINDS = ("k1", "k3", "dpca", "simple_opd")


def uses_byte_credit(credit: str, kind: str, align) -> bool:
    """Byte-level credit applies: ``credit == "byte"``, a sampled-token kind, a cross-tokenizer
    alignment (a same-tokenizer teacher's token credit is already exact)."""
    return credit == "byte" and kind in BYTE_CREDIT_KINDS and align is not None


def credit_alignment(kind: str, stop_advantage: str, align: ChunkAlignment, stop_BTs,
                     s_loss_mask_BTs=None, t_loss_mask_BTt=None) -> ChunkAlignment:
    """The units' alignment under byte-level credit: the stop merged with the content it ends
    (:func:`merge_stop_chunks`) for k1/k3 with the teacher's stop credit and for dpca; unchanged
    for simple_opd and ``stop_advantage = "zero"`` (the stop gets no credit there)."""
    merge = (kind in ("k1", "k3") and stop_advantage == "teacher") or kind == "dpca"
    return merge_stop_chunks(align, stop_BTs, s_loss_mask_BTs, t_loss_mask_BTt) if merge else align


def credit_units(align: ChunkAlignment, s_loss_mask_BTs=None, t_loss_mask_BTt=None):
    """(b_N, c_N) of the units, in the order of the terms' unit ids (after the stop merge)."""
    return torch.nonzero(loss_chunks(align, s_loss_mask_BTs, t_loss_mask_BTt), as_tuple=True)


def _log_masses(logits_BTV, terms: ByteTerms, tau: float, block: int) -> torch.Tensor:
    """log mass_K in float64 from the distinct rows, ``block`` rows at a time (module doc).

    Each mass is a sum of probabilities with its relative precision: a token's is ``z -
    logsumexp z``, the tokens outside the sorted vocabulary are summed as a logsumexp of their
    own, and a range by :func:`xdistill.losses.ranges.range_log_masses` over the byte-sorted row
    (only rows with a range term are sorted)."""
    K = terms.unit_K.numel()
    log_mass_K = torch.zeros(K, dtype=torch.float64, device=logits_BTV.device)
    R = terms.row_b_R.numel()
    sorted_V = terms.sorted_V
    other = torch.ones(logits_BTV.shape[-1], dtype=torch.bool, device=logits_BTV.device)
    other[sorted_V] = False
    other_O = torch.nonzero(other, as_tuple=True)[0]
    for lo in range(0, R, block):
        hi = min(R, lo + block)
        sel = (terms.row_K >= lo) & (terms.row_K < hi) & (terms.kind_K != MASS_ONE)
        if not bool(sel.any()):
            continue
        raw_nV = logits_BTV[terms.row_b_R[lo:hi], terms.row_t_R[lo:hi]].detach()
        z_nV = _scaled(raw_nV, tau)
        lse_n = torch.logsumexp(z_nV, dim=-1)
        k = torch.nonzero(sel, as_tuple=True)[0]
        r, kind = terms.row_K[k] - lo, terms.kind_K[k]
        val = z_nV[r, terms.lo_K[k].clamp(max=z_nV.shape[1] - 1)] - lse_n[r]
        if bool((kind == MASS_OTHER).any()):
            lse_o = torch.logsumexp(z_nV[:, other_O], dim=-1) if other_O.numel() else \
                torch.full_like(lse_n, -math.inf)
            val = torch.where(kind == MASS_OTHER, (lse_o - lse_n)[r], val)
        rng = torch.nonzero(kind == MASS_RANGE, as_tuple=True)[0]
        if rng.numel():
            val[rng] = _range_log_masses(raw_nV, tau, lse_n, sorted_V, r[rng],
                                         terms.lo_K[k[rng]], terms.hi_K[k[rng]])
        log_mass_K[k] = val
    return log_mass_K


def _scaled(raw_nV, tau: float) -> torch.Tensor:
    """float64 logits over the temperature."""
    z_nV = raw_nV.double()                             # not a copy when already float64:
    return z_nV / tau if tau != 1.0 else z_nV          # never divided in place


def _range_log_masses(raw_nV, tau: float, lse_n, sorted_V, r_J, lo_J, hi_J) -> torch.Tensor:
    """[J] log-probability of the sorted positions ``[lo, hi)`` of row ``r`` (``raw_nV``: the
    rows' logits in their own dtype; sorted before the float64 copy, which is elementwise)."""
    rows, inv = torch.unique(r_J, return_inverse=True)
    raw_uV = raw_nV if rows.numel() == raw_nV.shape[0] else raw_nV[rows]
    lp_uV = _scaled(torch.gather(raw_uV, 1, sorted_V.expand(rows.numel(), -1)), tau)
    lp_uV.sub_(lse_n[rows, None])
    top = lp_uV.shape[1]
    return range_log_masses(lp_uV, inv, lo_J.clamp(max=top), hi_J.clamp(max=top))


def _log_sums(log_val_K, unit_K, sel_K, N: int) -> torch.Tensor:
    """[N] ``log sum exp(log_val_K)`` over each unit's selected terms, -inf for none."""
    return slot_logsumexp(log_val_K[sel_K], unit_K[sel_K], N)


def byte_logprob(logits_BTV, token_logp_BT, terms: ByteTerms, *, temperature: float = 1.0,
                 block: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """(``log P_lb`` [N], ``log P_ub`` [N]) of one side, float64, no gradient (module doc).

    ``token_logp_BT``: that side's log-probs of its own tokens at input positions (at the same
    temperature). Computed in log space; a ``P_lb`` of 0 is replaced by ``P_ub`` and a ``P_ub``
    of 0 by ``exp(LOG_PROB_MIN)`` (:func:`byte_bounds` flags them).
    """
    lb, ub, _, _ = byte_bounds(logits_BTV, token_logp_BT, terms, temperature=temperature,
                            block=block)
    return lb, ub


def byte_bounds(logits_BTV, token_logp_BT, terms: ByteTerms, *, temperature: float = 1.0,
                block: int = 64
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`byte_logprob`'s two bounds, ``log P_ub'`` [N] and which units' ``P_lb`` was 0
    (bool [N]). ``P_ub'`` is the upper bound without the re-spelling terms (``respell_K``). An
    untrained model can give a byte-fallback id with the bytes of a digit as much as a wrong
    digit, which makes ``P_ub`` loose although a path through it is one the tokenizer never
    writes; ``log P_ub' - log P_lb`` is the gap left by the other segmentations the one forward
    did not follow."""
    with torch.no_grad():
        log_pi_K = _path_logprobs(token_logp_BT, terms)
        log_val_K = log_pi_K + _log_masses(logits_BTV, terms, temperature, block)
        N, gap = terms.num_units, terms.gap_K
        M = N + terms.num_den
        lb_N = _log_sums(log_val_K, terms.unit_K, ~gap, M)
        ub_N = torch.logaddexp(lb_N, _log_sums(log_val_K, terms.unit_K, gap, M))
        seg = gap if terms.respell_K is None else gap & ~terms.respell_K.to(gap.device)
        seg_N = torch.logaddexp(lb_N, _log_sums(log_val_K, terms.unit_K, seg, M))
        if terms.num_den:
            lb_N, ub_N, seg_N = _given_phantom(terms, N, lb_N, ub_N, seg_N)
        zero = torch.isneginf(lb_N)
        lb_N = torch.where(zero, ub_N, lb_N).clamp_min(LOG_PROB_MIN)
        seg_N = torch.where(zero, ub_N, seg_N)         # lb <= P_ub' <= ub holds
        return lb_N, ub_N.clamp_min(LOG_PROB_MIN), seg_N.clamp_min(LOG_PROB_MIN), zero


def _given_phantom(terms: ByteTerms, N: int, lb_M, ub_M, seg_M):
    """The first ``N`` units' bounds divided by their denominator unit's upper bound (the
    phantom bytes' covering probability; exact for one byte: no token ends inside it)."""
    den = terms.den_N.to(lb_M.device)
    log_den_N = torch.where(den >= 0, ub_M[N + den.clamp_min(0)], 0.0)
    return lb_M[:N] - log_den_N, ub_M[:N] - log_den_N, seg_M[:N] - log_den_N


def _path_logprobs(token_logp_BT, terms: ByteTerms) -> torch.Tensor:
    """[K] ``log pi`` of each term: its path tokens' summed log-probs, from one cumulative sum
    over all path tokens; a ``-inf`` token makes only the terms whose path holds it ``-inf``
    (its own count, not ``-inf - -inf = NaN`` in every later term)."""
    lp_P = token_logp_BT.detach().double()[terms.path_b_P, terms.path_t_P]
    dead_P = torch.isneginf(lp_P)
    zero = lp_P.new_zeros(1)
    cum = torch.cat([zero, torch.where(dead_P, 0.0, lp_P).cumsum(0)])
    dead = torch.cat([zero, dead_P.double().cumsum(0)])
    a, b = terms.path_start_K, terms.path_start_K + terms.path_len_K
    return torch.where(dead[b] > dead[a], -math.inf, cum[b] - cum[a])


@dataclass(frozen=True)
class CreditStats:
    """Diagnostics of one byte-credit evaluation (python numbers)."""

    # units scored
    units: int
    # units whose teacher lower bound was 0 (byte_bounds: the upper bound stood in)
    teacher_floor: int
    # mean measured error log P_ub - log P_lb over the units, teacher / student side
    teacher_gap: float
    student_gap: float
    # the teacher's mean gap without the re-spelling terms (byte_bounds)
    teacher_gap_seg: float = math.nan
    # units whose student lower bound was 0
    student_floor: int = 0


def chunk_teacher_logp(credit: ByteCredit, align: ChunkAlignment, s_loss_mask_BTs,
                       t_loss_mask_BTt, student_logits_BTsV, student_token_logp_BTs,
                       teacher_logits_BTtV, teacher_token_logp_BTt, *, temperature: float = 1.0
                       ) -> tuple[torch.Tensor, CreditStats]:
    """[B, C] effective teacher log-prob ``log Q_T(u) - log Q_S(u) + log p(u)`` of each unit
    (``align`` is the stop-merged alignment; 0 off the units; no gradient) and the stats."""
    b_N, c_N = credit_units(align, s_loss_mask_BTs, t_loss_mask_BTt)
    N = int(b_N.numel())
    for side in (credit.teacher, credit.student):
        if side.num_units != N:
            raise ValueError(f"byte-credit terms for {side.num_units} units, the alignment has "
                             f"{N} loss units (build them from the same view, stop and masks)")
    tau = float(temperature)
    t_lb, t_ub, t_seg, t_zero = byte_bounds(teacher_logits_BTtV, teacher_token_logp_BTt,
                                            credit.teacher, temperature=tau)
    s_lb, s_ub, _, s_zero = byte_bounds(student_logits_BTsV, student_token_logp_BTs,
                                        credit.student, temperature=tau)
    s_tok_BC = chunk_sum(student_token_logp_BTs.detach().double(), align.s_chunk_BTs,
                         align.num_chunks)
    out_BC = torch.zeros(s_tok_BC.shape, dtype=torch.float64, device=s_tok_BC.device)
    out_BC[b_N, c_N] = t_lb - s_lb + s_tok_BC[b_N, c_N]
    return out_BC, credit_stats(t_lb, t_ub, t_seg, t_zero, s_lb, s_ub, s_zero)


def credit_stats(t_lb, t_ub, t_seg, t_zero, s_lb, s_ub, s_zero) -> CreditStats:
    """:class:`CreditStats` of both sides' :func:`byte_bounds` over the same units."""
    mean = (lambda x: float(x.mean()) if x.numel() else math.nan)  # noqa: E731
    return CreditStats(int(t_lb.numel()), int(t_zero.sum()), mean(t_ub - t_lb),
                       mean(s_ub - s_lb), mean(t_seg - t_lb), int(s_zero.sum()))


def _input_logprobs(logits_BTV, ids_BT, mask_BT, tau, chunk_size) -> torch.Tensor:
    """Detached log-probs of the row's own tokens at input positions (0 at position 0)."""
    with torch.no_grad():
        out = token_logprobs(logits_BTV.detach(), shift_targets(ids_BT, mask_BT), tau, chunk_size)
    return torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)


def prepare_byte_credit(kind: str, stop_advantage: str, credit: ByteCredit | None, align,
                        stop_BTs, student_logits_BTsV, student_ids_BTs, s_loss_mask_BTs,
                        teacher_logits_BTtV, teacher_ids_BTt, t_loss_mask_BTt=None, *,
                        temperature: float = 1.0, chunk_size=DEFAULT_CHUNK_SIZE):
    """(the units' alignment, student and teacher input log-probs, the terms on their devices),
    with clear errors for missing inputs: the common start of both unit choices."""
    if credit is None:
        raise ValueError(f"on-policy loss {kind!r} with credit 'byte' needs the byte-credit terms "
                         "(xdistill.rollout.bytecredit.build_byte_terms)")
    if teacher_logits_BTtV is None or teacher_ids_BTt is None:
        raise ValueError(f"on-policy loss {kind!r} with credit 'byte' needs the teacher's full "
                         "logits (worker.output: logits) and its token ids")
    merged = credit_alignment(kind, stop_advantage, align, stop_BTs, s_loss_mask_BTs,
                              t_loss_mask_BTt)
    tau = float(temperature)
    s_logp = _input_logprobs(student_logits_BTsV, student_ids_BTs, s_loss_mask_BTs, tau,
                             chunk_size)
    t_logp = _input_logprobs(teacher_logits_BTtV, teacher_ids_BTt, None, tau, chunk_size)
    credit = ByteCredit(credit.teacher.to(t_logp.device), credit.student.to(s_logp.device),
                        credit.units)
    return merged, s_logp, t_logp, credit


def evaluate_byte_credit(kind: str, stop_advantage: str, credit: ByteCredit | None, align,
                         stop_BTs, student_logits_BTsV, student_ids_BTs, s_loss_mask_BTs,
                         teacher_logits_BTtV, teacher_ids_BTt, t_loss_mask_BTt=None, *,
                         temperature: float = 1.0, chunk_size=DEFAULT_CHUNK_SIZE
                         ) -> tuple[ChunkAlignment, torch.Tensor, CreditStats]:
    """(the units' alignment, [B, C] effective teacher log-prob per unit, stats) of one
    cross-tokenizer teacher under byte-level credit; clear errors for missing inputs."""
    merged, s_logp, t_logp, credit = prepare_byte_credit(
        kind, stop_advantage, credit, align, stop_BTs, student_logits_BTsV, student_ids_BTs,
        s_loss_mask_BTs, teacher_logits_BTtV, teacher_ids_BTt, t_loss_mask_BTt,
        temperature=temperature, chunk_size=chunk_size)
    if credit.units != "chunk":
        raise ValueError(f"byte-credit terms built for {credit.units!r} units, the loss uses chunk "
                         "units (build them with the spec's byte_units)")
    t_chunk_BC, stats = chunk_teacher_logp(credit, merged, s_loss_mask_BTs, t_loss_mask_BTt,
                                           student_logits_BTsV, s_logp, teacher_logits_BTtV,
                                           t_logp, temperature=temperature)
    return merged, t_chunk_BC, stats


__all__ = ["BYTE_CREDIT_KINDS", "BYTE_UNITS", "CREDITS", "ByteCredit", "ByteTerms", "CreditStats", "MASS_ID", "MASS_ONE", "MASS_OTHER",
           "MASS_RANGE", "LOG_PROB_MIN", "byte_bounds", "byte_logprob", "evaluate_byte_credit", "chunk_teacher_logp", "credit_alignment", "credit_stats",
           "credit_units",
           "merge_stop_chunks", "prepare_byte_credit", "uses_byte_credit"]
