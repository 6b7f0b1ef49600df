"""Chunked evaluation machinery shared by every loss: bounded memory forward *and* backward.

Legend: B batch, T tokens (student or teacher), V vocabulary, N selected rows (positions),
n rows of one block.

Every divergence in this package is a sum over selected *rows* (model output positions) of a
per-row term that depends on one student logit row and on teacher data for that row. Such a sum is
evaluated by :func:`row_block_sum` in blocks of ``chunk_size`` rows. For each block the student
rows are gathered (a copy of ``n x V`` only), the term is evaluated under a small local autograd
graph and differentiated at once; the gradient rows are written into one ``[B, T, V]`` gradient
buffer (the same size as the gradient any implementation must return) and the graph is freed.
The backward of the loss is then ``grad_out * buffer``. So no ``[B, T, V]`` float32 temporary of
either side ever exists, neither in forward nor in backward, and nothing is recomputed.

Losses that are *non-linear* in sums of several rows (ALM chunk likelihoods, cross-entropy
normalisations) first reduce every row to one number, the log-probability of its target token, with
:func:`token_logprobs` (one chunked pass that also forms the gradient), then combine those numbers
with ordinary autograd on ``[B, T]``-sized tensors.

All arithmetic is float32 (float64 when the student logits are float64, for gradcheck), whatever
the input dtypes.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

# floor for a log-probability that stands in a denominator (log p in KL(q||p)): a probability of
# exactly 0 (a -inf logit) where the other side has mass gives a large finite term, never inf
LOGP_FLOOR = -1.0e4
DEFAULT_CHUNK_SIZE = 256


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """float64 for float64 inputs (gradcheck), float32 for everything else."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def safe_logsumexp(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``logsumexp`` that returns -inf for an all ``-inf`` slice with zero (not NaN) gradients.

    The fused ``torch.logsumexp`` is used unless some slice is entirely ``-inf``.
    """
    if not bool(torch.isneginf(x).all(dim).any()):
        return torch.logsumexp(x, dim)
    m = x.detach().amax(dim=dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    s = torch.exp(x - m).sum(dim=dim, keepdim=True)
    pos = s > 0
    out = torch.where(pos, torch.log(torch.where(pos, s, torch.ones_like(s))) + m,
                      torch.full_like(s, -math.inf))
    return out.squeeze(dim)


def log_softmax_safe(z: torch.Tensor) -> torch.Tensor:
    """log-softmax over the last axis; rows that are entirely ``-inf`` give ``-inf`` rows (no NaN).

    Uses the fused ``torch.log_softmax`` (which handles partial ``-inf`` rows) unless some row is
    entirely ``-inf``.
    """
    dead = torch.isneginf(z).all(-1, keepdim=True)
    if not bool(dead.any()):
        return torch.log_softmax(z, -1)
    out = torch.log_softmax(torch.where(dead, torch.zeros_like(z), z), -1)
    return torch.where(dead, torch.full_like(out, -math.inf), out)


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for ``x <= 0``, accurate at both ends, NaN-free gradients.

    ``x == 0`` gives ``-inf``; callers guard the products they form with it.
    """
    x = x.clamp_max(0.0)
    near = x > -math.log(2.0)
    xa = torch.where(near, x, torch.full_like(x, -1.0))
    xb = torch.where(near, torch.full_like(x, -1.0), x)
    ya = torch.log(-torch.expm1(torch.where(xa < 0, xa, torch.full_like(xa, -1.0))))
    ya = torch.where(xa < 0, ya, torch.full_like(ya, -math.inf))
    yb = torch.log1p(-torch.exp(xb))
    return torch.where(near, ya, yb)


def xlogx_minus_xlogy(logq: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """Elementwise ``q (log q - log p)`` with ``q = exp(logq)``; exactly 0 where ``q == 0``.

    ``log p`` is floored at :data:`LOGP_FLOOR`, so ``q > 0`` against ``p == 0`` is large but finite.
    Gradients are finite everywhere (the masked branch is replaced *before* the product).
    """
    q = torch.exp(logq)
    has = q > 0
    diff = torch.where(has, logq - logp.clamp_min(LOGP_FLOOR), torch.zeros_like(logq))
    return q * diff


def _run_blocks(logits_BTV, b_idx_N, t_idx_N, term_fn, chunk_size, need_grad):
    """(sum of the block terms as float64, gradient buffer [B, T, V] or None)."""
    dt = compute_dtype(logits_BTV)
    grad_BTV = torch.zeros_like(logits_BTV) if need_grad else None
    total = torch.zeros((), dtype=torch.float64, device=logits_BTV.device)
    for lo in range(0, b_idx_N.numel(), chunk_size):
        bi, ti = b_idx_N[lo:lo + chunk_size], t_idx_N[lo:lo + chunk_size]
        rows_nV = logits_BTV[bi, ti].to(dt)
        sl = slice(lo, lo + bi.numel())
        if need_grad:
            with torch.enable_grad():
                rows_nV.requires_grad_(True)
                value = term_fn(rows_nV, sl)
                (g_nV,) = torch.autograd.grad(value, rows_nV, allow_unused=True)
            if g_nV is not None:
                grad_BTV[bi, ti] = g_nV.to(grad_BTV.dtype)
        else:
            value = term_fn(rows_nV, sl)
        total += value.detach().to(torch.float64)
    return total, grad_BTV


class _RowBlockSum(torch.autograd.Function):
    """sum over row blocks of ``term_fn(rows, block)``; gradient computed during the forward."""

    @staticmethod
    def forward(ctx, logits_BTV, b_idx_N, t_idx_N, term_fn, chunk_size):
        need_grad = ctx.needs_input_grad[0]
        total, grad_BTV = _run_blocks(logits_BTV, b_idx_N, t_idx_N, term_fn, chunk_size,
                                      need_grad)
        # The buffer is kept as an attribute (not saved) and *handed over* to autograd by the first
        # backward (scaled in place), so the caller's .grad or the lm-head backward takes it
        # without a copy. A later backward of the same graph (retain_graph, gradcheck) recomputes.
        ctx.grad_BTV = grad_BTV
        if need_grad:
            ctx.save_for_backward(logits_BTV)
            ctx.args = (b_idx_N, t_idx_N, term_fn, chunk_size)
        return total.to(compute_dtype(logits_BTV))

    @staticmethod
    def backward(ctx, grad_out):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        grad_BTV, ctx.grad_BTV = ctx.grad_BTV, None
        if grad_BTV is None:
            (logits_BTV,) = ctx.saved_tensors
            _, grad_BTV = _run_blocks(logits_BTV, *ctx.args, need_grad=True)
        if not bool(grad_out == 1):
            grad_BTV.mul_(grad_out.to(grad_BTV.dtype))  # in place: no second [B, T, V] buffer
        return grad_BTV, None, None, None, None


def row_block_sum(logits_BTV: torch.Tensor, b_idx_N: torch.Tensor, t_idx_N: torch.Tensor,
                  term_fn: Callable[[torch.Tensor, slice], torch.Tensor],
                  chunk_size: int | None = DEFAULT_CHUNK_SIZE) -> torch.Tensor:
    """``sum_blocks term_fn(logits_BTV[b_idx, t_idx][block], block_slice)`` with bounded memory.

    ``term_fn(rows_nV, sl)`` receives the student rows of one block in the compute dtype and the
    slice of the ``N`` selected rows it covers (to gather the matching teacher data); it returns
    the *sum* of the block's per-row terms (a 0-d tensor differentiable in ``rows_nV``). Rows must
    be distinct. ``chunk_size=None`` evaluates everything in one block (the unchunked reference).
    Returns a 0-d tensor in the compute dtype; its gradient flows to ``logits_BTV`` only.
    """
    n_rows = int(b_idx_N.numel())
    size = max(n_rows, 1) if chunk_size is None else int(chunk_size)
    if size <= 0:
        raise ValueError(f"chunk_size must be a positive number of rows, got {chunk_size}")
    return _RowBlockSum.apply(logits_BTV, b_idx_N, t_idx_N, term_fn, size)


def _token_logprob_blocks(logits_BTV, tgt_R, temperature, chunk_size, need_grad):
    """(log-probs [B*T], d logprob / d logits [B, T, V] or None), one pass over row blocks."""
    dt = compute_dtype(logits_BTV)
    B, T, V = logits_BTV.shape
    z_RV = logits_BTV.reshape(B * T, V)
    out_R = torch.zeros(B * T, dtype=dt, device=logits_BTV.device)
    grad_BTV = torch.zeros_like(logits_BTV) if need_grad else None
    grad_RV = grad_BTV.view(B * T, V) if need_grad else None
    rows_R = torch.nonzero(tgt_R >= 0).squeeze(1)
    for lo in range(0, rows_R.numel(), chunk_size):
        r = rows_R[lo:lo + chunk_size]
        first, last = int(r[0]), int(r[-1])
        if last - first + 1 == r.numel():  # contiguous rows: a slice, no gather
            r = slice(first, last + 1)
        z = z_RV[r].to(dt, copy=True)  # a private copy: scaled in place
        if temperature != 1.0:
            z.div_(temperature)
        lse = torch.logsumexp(z, -1, keepdim=True)
        lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))  # dead rows: p = 0
        out_R[r] = (z.gather(1, tgt_R[r].unsqueeze(1)) - lse).squeeze(1)
        if need_grad:
            g = z.sub_(lse).exp_().neg_()  # -softmax, in place (z is no longer needed)
            g.scatter_add_(1, tgt_R[r].unsqueeze(1), torch.ones_like(g[:, :1]))
            if temperature != 1.0:
                g.div_(temperature)
            grad_RV[r] = g.to(grad_RV.dtype)
    return out_R, grad_BTV


class _TokenLogProbs(torch.autograd.Function):
    """``log softmax(z / tau)[target]`` per row; 0 where the target is negative.

    The per-row gradient ``(onehot(target) - softmax(z / tau)) / tau`` is computed in the same
    pass as the forward and handed over (scaled in place by the incoming gradient) by the first
    backward; a repeated backward recomputes it.
    """

    @staticmethod
    def forward(ctx, logits_BTV, target_BT, temperature, chunk_size):
        need_grad = ctx.needs_input_grad[0]
        tgt_R = target_BT.reshape(-1)
        out_R, grad_BTV = _token_logprob_blocks(logits_BTV, tgt_R, temperature, chunk_size,
                                                need_grad)
        ctx.grad_BTV = grad_BTV
        if need_grad:
            ctx.save_for_backward(logits_BTV, tgt_R)
            ctx.args = (temperature, chunk_size)
        return out_R.view(target_BT.shape)

    @staticmethod
    def backward(ctx, grad_BT):
        grad_BTV, ctx.grad_BTV = ctx.grad_BTV, None
        if grad_BTV is None:
            logits_BTV, tgt_R = ctx.saved_tensors
            _, grad_BTV = _token_logprob_blocks(logits_BTV, tgt_R, *ctx.args, need_grad=True)
        grad_BTV.mul_(grad_BT.unsqueeze(-1).to(grad_BTV.dtype))
        return grad_BTV, None, None, None


def token_logprobs(logits_BTV: torch.Tensor, target_BT: torch.Tensor, temperature: float = 1.0,
                   chunk_size: int | None = DEFAULT_CHUNK_SIZE) -> torch.Tensor:
    """``out[b, t] = log softmax(logits[b, t] / temperature)[target[b, t]]``, 0 where target < 0.

    Output positions: row ``t`` of ``logits`` is paired with ``target[b, t]`` as given (callers
    apply the next-token shift). Chunked over rows; the gradient is formed in the same pass.
    Differentiable in ``logits`` only.
    """
    size = max(int(target_BT.numel()), 1) if chunk_size is None else int(chunk_size)
    return _TokenLogProbs.apply(logits_BTV, target_BT.long(), float(temperature), size)


def shift_targets(ids_BT: torch.Tensor, mask_BT: torch.Tensor | None = None) -> torch.Tensor:
    """Targets at *output* positions: ``out[:, t] = ids[:, t + 1]`` (-1 where masked or at the end).

    Token positions are input positions (see ``xdistill.data.batch``): the output at ``t``
    predicts token ``t + 1``; the last output predicts nothing.
    """
    out = torch.full_like(ids_BT, -1, dtype=torch.long)
    nxt = ids_BT[:, 1:].long()
    if mask_BT is not None:
        nxt = torch.where(mask_BT[:, 1:].bool(), nxt, torch.full_like(nxt, -1))
    out[:, :-1] = nxt
    return out
