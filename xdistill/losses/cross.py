"""Cross-tokenizer losses over aligned chunks: exact-pair KL, P-KL, ULD, GOLD hybrid, ALM.

Legend: B batch, Ts/Tt student/teacher tokens, Vs/Vt vocabularies, C chunks, N selected chunks
(or shared vocabulary entries for ``shared_*_idx_N``), n rows of one block.

**Which distributions are compared.** A valid chunk ``k`` covers student tokens ``[a, b)`` and
teacher tokens ``[c, d)`` spelling identical bytes, and (chunks being ordered and gap-free on
aligned text) both sides have seen the same text before it. The only positions where both models
predict "what comes next" given the *same* text are the chunk starts, so every distribution-level
cross-tokenizer loss here compares, per chunk,

    p_k = softmax(z_s[a - 1] / tau)  (over Vs: the student's next token after the shared prefix)
    q_k = softmax(z_t[c - 1] / tau)  (over Vt: the teacher's next token after the same prefix)

i.e. both sides' *next-token distributions at the chunk start*. This is consistent: the same kind
of object (a distribution over the first token of the continuation) on both sides. Positions
inside a multi-token chunk have no counterpart on the other side (their prefixes end mid-chunk),
so they are not compared by these losses; ALM (below) covers them through chunk likelihoods.
NeMo-RL instead averages the student's *probabilities* and the teacher's *log-probabilities* over
the positions of a chunk, which is neither a chunk likelihood nor comparable across sides.

Chunks whose first token is token 0 on either side have no prediction and are dropped; a chunk
carries loss only if all its student tokens are in the student loss mask (and teacher tokens in
the teacher loss mask when given). Losses are sums over such chunks divided by ``num_valid`` (the
trainer's global count of loss chunks) or the local count (:func:`count_loss_chunks`). KL-type
terms are multiplied by ``tau**2``; L1 terms are not.
"""

from __future__ import annotations

import warnings

import torch

from xdistill.losses.chunks import ChunkAlignment, chunk_start_rows, loss_chunks, resolve_count
from xdistill.losses.divergences import forward_kl_rows, jsd_rows, reverse_kl_rows
from xdistill.losses.engine import DEFAULT_CHUNK_SIZE, log_softmax_safe, row_block_sum
from xdistill.losses.projection_ops import (PreparedProjection, gather_support_rows,
                                            prepare_projection, projected_forward_kl_gather,
                                            projected_logp, teacher_logq)

def projection_from_csr(indptr, indices, data, shape, *, check: bool = True,
                        atol: float = 1e-3) -> torch.Tensor:
    """Sparse CSR ``proj_VsVt`` (float32) from CSR arrays (numpy or torch; scipy's layout).

    Rows are student tokens, columns teacher tokens; entries must be non-negative and every row
    must sum to 1 (a mapped token) or 0 (an unmapped token). ``check`` validates this and raises
    ``ValueError`` naming the first offending row.
    """
    Vs, Vt = int(shape[0]), int(shape[1])
    crow = torch.as_tensor(indptr).long()
    col = torch.as_tensor(indices).long()
    val = torch.as_tensor(data).to(torch.float32)
    if check:
        if crow.numel() != Vs + 1 or int(crow[-1]) != col.numel() or col.numel() != val.numel():
            raise ValueError(f"projection CSR arrays disagree with shape {(Vs, Vt)}: indptr "
                             f"{crow.numel()}, indices {col.numel()}, data {val.numel()}")
        if col.numel() and (int(col.min()) < 0 or int(col.max()) >= Vt):
            raise ValueError(f"projection column index out of range [0, {Vt})")
        if col.numel() and float(val.min()) < 0:
            raise ValueError(f"projection has a negative weight at nnz {int(val.argmin())}")
        rows = torch.repeat_interleave(torch.arange(Vs), crow[1:] - crow[:-1])
        sums = torch.zeros(Vs, dtype=torch.float64).index_add_(0, rows, val.double())
        bad = ~(((sums - 1).abs() <= atol) | (sums == 0))
        if bool(bad.any()):
            r = int(torch.nonzero(bad)[0])
            raise ValueError(f"projection row {r} (student token {r}) sums to {float(sums[r]):.6f};"
                             " rows must sum to 1 (mapped) or 0 (unmapped)")
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, col, val, size=(Vs, Vt))


def _prepare_projection(proj_VsVt: torch.Tensor, Vs: int, Vt: int, dtype: torch.dtype,
                        device=None) -> PreparedProjection:
    """W restricted to its support in the fast layouts, in ``dtype`` on ``device`` (cached on
    ``proj_VsVt``, see :mod:`xdistill.losses.projection_ops`), after checking its shape."""
    if tuple(proj_VsVt.shape) != (Vs, Vt):
        raise ValueError(f"projection shape {tuple(proj_VsVt.shape)} does not match student x "
                         f"teacher vocabularies {(Vs, Vt)}")
    return prepare_projection(proj_VsVt, dtype, device)


def count_loss_chunks(align: ChunkAlignment, s_loss_mask_BTs=None, t_loss_mask_BTt=None, *,
                      exact_only: bool = False) -> int:
    """Chunks that carry a cross-tokenizer loss (the local ``num_valid``); see module doc."""
    return int(loss_chunks(align, s_loss_mask_BTs, t_loss_mask_BTt, exact_only=exact_only).sum())


def _loss_chunk_rows(student_logits_BTsVs, teacher_BTtX, align, s_loss_mask, t_loss_mask,
                     exact_only):
    """Shapes checked; (batch, student row, teacher row) [N] of every loss chunk's start."""
    B, Ts, _ = student_logits_BTsVs.shape
    if tuple(align.s_chunk_BTs.shape) != (B, Ts) or align.t_chunk_BTt.shape[0] != B:
        raise ValueError(f"alignment s_chunk {tuple(align.s_chunk_BTs.shape)} / t_chunk "
                         f"{tuple(align.t_chunk_BTt.shape)} do not fit student logits [B,T]="
                         f"{(B, Ts)}")
    if teacher_BTtX.shape[:2] != align.t_chunk_BTt.shape:
        raise ValueError(f"teacher tensor {tuple(teacher_BTtX.shape)} does not fit t_chunk "
                         f"{tuple(align.t_chunk_BTt.shape)}")
    ok_BC = loss_chunks(align, s_loss_mask, t_loss_mask, exact_only=exact_only)
    return chunk_start_rows(align, ok_BC)


def _chunk_start_loss(student_logits_BTsVs, teacher_BTtX, align, s_loss_mask, t_loss_mask,
                      rows_fn, *, exact_only, num_valid, chunk_size, scale):
    """``scale / count * sum_k rows_fn(student row a_k - 1, teacher row c_k - 1)``."""
    b_N, s_row_N, t_row_N = _loss_chunk_rows(student_logits_BTsVs, teacher_BTtX, align,
                                             s_loss_mask, t_loss_mask, exact_only)

    def term(rows_nV, sl):
        teacher_nX = teacher_BTtX[b_N[sl], t_row_N[sl]].to(rows_nV.dtype)
        return rows_fn(rows_nV, teacher_nX).sum()

    total = row_block_sum(student_logits_BTsVs, b_N, s_row_N, term, chunk_size)
    return total * scale / resolve_count(num_valid, b_N.numel())


def _divergence(direction: str, beta: float = 0.5):
    if direction == "forward":
        return forward_kl_rows
    if direction == "reverse":
        return reverse_kl_rows
    if direction == "jsd":
        return lambda lp, lq: jsd_rows(lp, lq, beta)
    raise ValueError(f"direction must be 'forward', 'reverse' or 'jsd', got {direction!r}")


def _restricted_logp(z_nV: torch.Tensor, idx_N: torch.Tensor) -> torch.Tensor:
    """log of softmax(z) restricted to the ids ``idx_N`` and renormalised there, [n, N]."""
    return log_softmax_safe(z_nV.index_select(1, idx_N))


def exact_kl(student_logits_BTsVs, teacher_logits_BTtVt, align: ChunkAlignment, shared_s_idx_N,
             shared_t_idx_N, *, s_loss_mask_BTs=None, t_loss_mask_BTt=None, direction="forward",
             beta=0.5, temperature=1.0, teacher_temperature=None, num_valid=None,
             chunk_size=DEFAULT_CHUNK_SIZE):
    """KL on the shared vocabulary over exact (1:1, identical bytes) chunks.

    ``shared_s_idx_N[n]`` and ``shared_t_idx_N[n]`` are a student and a teacher token with
    identical bytes. Both next-token distributions at the chunk start are restricted to the shared
    ids and renormalised there (``p'_n = p[s_n] / sum_m p[s_m]``, likewise ``q'``), then
    ``tau^2 * D(q' , p')`` with D the forward KL (default), reverse KL or JSD(beta). Only chunks
    with ``chunk_exact_BC`` count (and ``num_valid`` counts those).
    """
    tau = float(temperature)
    tau_t = tau if teacher_temperature is None else float(teacher_temperature)
    s_idx, t_idx = shared_s_idx_N.long(), shared_t_idx_N.long()
    if s_idx.shape != t_idx.shape or s_idx.numel() == 0:
        raise ValueError(f"shared index maps must be equal-length and non-empty, got "
                         f"{tuple(s_idx.shape)} and {tuple(t_idx.shape)}")
    div = _divergence(direction, beta)

    def rows_fn(z_s, z_t):
        return div(_restricted_logp(z_s / tau, s_idx), _restricted_logp(z_t / tau_t, t_idx))

    return _chunk_start_loss(student_logits_BTsVs, teacher_logits_BTtVt, align, s_loss_mask_BTs,
                             t_loss_mask_BTt, rows_fn, exact_only=True, num_valid=num_valid,
                             chunk_size=chunk_size, scale=tau ** 2)


def projected_kl(student_logits_BTsVs, teacher_logits_BTtVt, align: ChunkAlignment, proj_VsVt,
                 *, s_loss_mask_BTs=None, t_loss_mask_BTt=None, direction="forward", beta=0.5,
                 temperature=1.0, teacher_temperature=None, num_valid=None,
                 chunk_size=DEFAULT_CHUNK_SIZE, teacher_on_support=False):
    """P-KL: chunk-start distributions compared in teacher space through ``proj_VsVt`` (W).

    ``W[s, t] >= 0`` with rows summing to 1 (or 0 for unmapped student tokens) is read as
    ``P(teacher token t | student token s)``, so ``m = W^T p`` is the student's next-token
    distribution pushed into teacher space. Teacher tokens no student token maps to (columns of W
    with no weight) get ``m_t = 0`` and would make any KL infinite, so both sides are restricted to
    the support ``S`` of W's columns and renormalised there:
    ``P~ = m|_S / sum_S m``, ``Q~ = q|_S / sum_S q``, loss ``tau^2 * D(Q~, P~)`` per chunk (D =
    forward KL by default, reverse or JSD(beta)). Mass on unmapped student tokens is dropped by the
    renormalisation. With W the identity and 1:1 chunks this is exactly the plain token KL.
    Computed on ``[n, S]`` with closed-form gradients (:mod:`xdistill.losses.projection_ops`;
    the prepared W, moved to the logits' device, is cached on ``proj_VsVt``, so pass the same
    tensor, e.g. the CPU one, every step).

    ``teacher_on_support``: ``teacher_logits_BTtVt`` holds only the support's columns,
    ``[B, Tt, S]`` in increasing teacher id order (a ``support`` teacher output); the same loss,
    without the ``[.., Vt]`` rows.
    """
    tau = float(temperature)
    tau_t = tau if teacher_temperature is None else float(teacher_temperature)
    Vs = student_logits_BTsVs.shape[2]
    Vt = proj_VsVt.shape[1] if teacher_on_support else teacher_logits_BTtVt.shape[2]
    dt = torch.float64 if student_logits_BTsVs.dtype == torch.float64 else torch.float32
    prep = _prepare_projection(proj_VsVt, Vs, Vt, dt, student_logits_BTsVs.device)
    if teacher_on_support and teacher_logits_BTtVt.shape[2] != prep.n_support:
        raise ValueError(f"teacher support logits have {teacher_logits_BTtVt.shape[2]} columns "
                         f"but the projection's support has {prep.n_support}: the teacher "
                         "worker was given another projection than the loss")
    div = _divergence(direction, beta)
    fused = direction == "forward" or (direction == "jsd" and float(beta) == 0.0)
    on = bool(teacher_on_support)

    def rows_fn(z_s, teacher, b_n, t_n):
        if fused:
            return projected_forward_kl_gather(z_s, teacher, b_n, t_n, prep, tau, tau_t, on)
        zt_nS = gather_support_rows(teacher, b_n, t_n, prep, z_s.dtype, on)
        return div(projected_logp(z_s, prep, tau), teacher_logq(zt_nS, tau_t)).sum()

    return _support_chunk_loss(student_logits_BTsVs, teacher_logits_BTtVt, align, prep,
                               s_loss_mask_BTs, t_loss_mask_BTt, rows_fn, num_valid=num_valid,
                               chunk_size=chunk_size, scale=tau ** 2)


def _support_chunk_loss(student_logits_BTsVs, teacher_logits_BTtVt, align, prep, s_loss_mask,
                        t_loss_mask, rows_fn, *, num_valid, chunk_size, scale):
    """:func:`_chunk_start_loss` for P-KL: ``rows_fn(student rows [n, Vs], teacher_BTtVt, b_n,
    t_n)`` gathers the teacher rows itself, at the support columns only and by small row groups
    (no ``[n, Vt]`` teacher copy per block)."""
    b_N, s_row_N, t_row_N = _loss_chunk_rows(student_logits_BTsVs, teacher_logits_BTtVt, align,
                                             s_loss_mask, t_loss_mask, False)

    def term(rows_nV, sl):
        if prep.n_support == 0:  # no teacher token reachable: both restrictions are empty
            return rows_nV[:, :0].sum()   # 0, attached; a -inf logit must not make it NaN
        return rows_fn(rows_nV, teacher_logits_BTtVt, b_N[sl], t_row_N[sl])

    total = row_block_sum(student_logits_BTsVs, b_N, s_row_N, term, chunk_size)
    return total * scale / resolve_count(num_valid, b_N.numel())


def student_space_kl(student_logits_BTsVs, teacher_proj_logp_BTtVs, align: ChunkAlignment, *,
                     s_loss_mask_BTs=None, t_loss_mask_BTt=None, direction="forward", beta=0.5,
                     temperature=1.0, num_valid=None, chunk_size=DEFAULT_CHUNK_SIZE):
    """P-KL in student space: the teacher was already projected by its worker (``W q``, kind
    ``projected`` in ``xdistill.teacher.outputs``, at temperature tau); ``tau^2 * D(q_s, p)`` at
    the chunk starts."""
    tau = float(temperature)
    div = _divergence(direction, beta)

    def rows_fn(z_s, logq_s):
        return div(log_softmax_safe(z_s / tau), logq_s)

    return _chunk_start_loss(student_logits_BTsVs, teacher_proj_logp_BTtVs, align,
                             s_loss_mask_BTs, t_loss_mask_BTt, rows_fn, exact_only=False,
                             num_valid=num_valid, chunk_size=chunk_size, scale=tau ** 2)


def sorted_l1_rows(a_nV: torch.Tensor, b_nW: torch.Tensor) -> torch.Tensor:
    """``sum_r |sort_desc(a)_r - sort_desc(b)_r|`` per row, the shorter zero-padded, [n]."""
    a = torch.sort(a_nV, dim=-1, descending=True).values
    b = torch.sort(b_nW, dim=-1, descending=True).values
    m = min(a.shape[-1], b.shape[-1])
    out = (a[:, :m] - b[:, :m]).abs().sum(-1)
    return out + a[:, m:].abs().sum(-1) + b[:, m:].abs().sum(-1)
