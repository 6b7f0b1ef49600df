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


def _grad_buffer(logits_BTV: torch.Tensor, used_R: torch.Tensor) -> torch.Tensor:
    """An uninitialised ``[B, T, V]`` gradient buffer whose rows *not* in ``used_R`` are zeroed.

    ``used_R`` (bool [B*T]) marks the rows the caller will overwrite; skipping their zero-fill
    saves one full pass over the buffer.
    """
    B, T, V = logits_BTV.shape
    grad_BTV = torch.empty_like(logits_BTV, memory_format=torch.contiguous_format)
    grad_BTV.view(B * T, V).index_fill_(0, torch.nonzero(~used_R).squeeze(1), 0)
    return grad_BTV


def _as_slice(r: torch.Tensor):
    """``r`` (sorted distinct row ids) as a slice when it is a contiguous run, else ``r``."""
    first, last = int(r[0]), int(r[-1])
    return slice(first, last + 1) if last - first + 1 == r.numel() else r


def _rows_view(logits_BTV: torch.Tensor) -> torch.Tensor | None:
    """``logits_BTV`` as ``[B*T, V]`` *without a copy*, or None when its strides do not allow it."""
    B, T, V = logits_BTV.shape
    try:
        return logits_BTV.view(B * T, V)
    except RuntimeError:
        return None


def _take_rows(logits_BTV: torch.Tensor, r, dt) -> torch.Tensor:
    """A private compute-dtype copy of the flat rows ``r`` (``b * T + t``; a slice or ids)."""
    z_RV = _rows_view(logits_BTV)
    if z_RV is None:  # e.g. logits[:, :-1]: gather (b, t) pairs, never copy the whole tensor
        T = logits_BTV.shape[1]
        if isinstance(r, slice):
            r = torch.arange(r.start, r.stop, device=logits_BTV.device)
        return logits_BTV[r // T, r % T].to(dt)
    if isinstance(r, slice):
        return z_RV[r].to(dt, copy=True)
    return z_RV.index_select(0, r).to(dt)


def _put_rows(dst_RV: torch.Tensor, r, src_nV: torch.Tensor) -> None:
    if isinstance(r, slice):
        dst_RV[r] = src_nV
    else:
        dst_RV.index_copy_(0, r, src_nV.to(dst_RV.dtype))


def _run_blocks(logits_BTV, b_idx_N, t_idx_N, term_fn, chunk_size, need_grad, analytic):
    """(sum of the block terms as float64, gradient buffer [B, T, V] or None)."""
    dt = compute_dtype(logits_BTV)
    B, T, V = logits_BTV.shape
    rows_N = b_idx_N * T + t_idx_N
    grad_BTV = grad_RV = None
    if need_grad:
        used_R = torch.zeros(B * T, dtype=torch.bool, device=logits_BTV.device)
        used_R[rows_N] = True
        grad_BTV = _grad_buffer(logits_BTV, used_R)
        grad_RV = grad_BTV.view(B * T, V)
    total = torch.zeros((), dtype=torch.float64, device=logits_BTV.device)
    for lo in range(0, rows_N.numel(), chunk_size):
        r = rows_N[lo:lo + chunk_size]
        sl = slice(lo, lo + r.numel())
        r = _as_slice(r) if bool((r[1:] > r[:-1]).all()) else r
        rows_nV = _take_rows(logits_BTV, r, dt)
        g_nV = None
        if analytic:
            value, g_nV = term_fn(rows_nV, sl, need_grad)
        elif need_grad:
            with torch.enable_grad():
                rows_nV.requires_grad_(True)
                value = term_fn(rows_nV, sl)
                (g_nV,) = torch.autograd.grad(value, rows_nV, allow_unused=True)
        else:
            value = term_fn(rows_nV, sl)
        if need_grad:
            _put_rows(grad_RV, r, torch.zeros_like(rows_nV) if g_nV is None else g_nV.detach())
        total += value.detach().to(torch.float64)
    return total, grad_BTV


class _RowBlockSum(torch.autograd.Function):
    """sum over row blocks of ``term_fn(rows, block)``; gradient computed during the forward."""

    @staticmethod
    def forward(ctx, logits_BTV, b_idx_N, t_idx_N, term_fn, chunk_size, analytic):
        need_grad = ctx.needs_input_grad[0]
        total, grad_BTV = _run_blocks(logits_BTV, b_idx_N, t_idx_N, term_fn, chunk_size,
                                      need_grad, analytic)
        # The buffer is kept as an attribute (not saved) and *handed over* to autograd by the first
        # backward (scaled in place), so the caller's .grad or the lm-head backward takes it
        # without a copy. A later backward of the same graph (retain_graph, gradcheck) recomputes.
        ctx.grad_BTV = grad_BTV
        if need_grad:
            ctx.save_for_backward(logits_BTV)
            ctx.args = (b_idx_N, t_idx_N, term_fn, chunk_size)
            ctx.analytic = analytic
        return total.to(compute_dtype(logits_BTV))

    @staticmethod
    def backward(ctx, grad_out):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None, None
        grad_BTV, ctx.grad_BTV = ctx.grad_BTV, None
        if grad_BTV is None:
            (logits_BTV,) = ctx.saved_tensors
            _, grad_BTV = _run_blocks(logits_BTV, *ctx.args, need_grad=True,
                                      analytic=ctx.analytic)
        if not bool(grad_out == 1):
            grad_BTV.mul_(grad_out.to(grad_BTV.dtype))  # in place: no second [B, T, V] buffer
        return grad_BTV, None, None, None, None, None


def row_block_sum(logits_BTV: torch.Tensor, b_idx_N: torch.Tensor, t_idx_N: torch.Tensor,
                  term_fn: Callable, chunk_size: int | None = DEFAULT_CHUNK_SIZE, *,
                  analytic: bool = False) -> torch.Tensor:
    """``sum_blocks term_fn(logits_BTV[b_idx, t_idx][block], block_slice)`` with bounded memory.

    ``term_fn(rows_nV, sl)`` receives the student rows of one block in the compute dtype and the
    slice of the ``N`` selected rows it covers (to gather the matching teacher data); it returns
    the *sum* of the block's per-row terms (a 0-d tensor differentiable in ``rows_nV``). Rows must
    be distinct. ``chunk_size=None`` evaluates everything in one block (the unchunked reference).
    Returns a 0-d tensor in the compute dtype; its gradient flows to ``logits_BTV`` only.

    ``analytic=True``: ``term_fn(rows_nV, sl, need_grad)`` instead returns ``(value, grad_nV)``
    with the gradient of ``value`` w.r.t. ``rows_nV`` written out by hand (``None`` when
    ``need_grad`` is False); no autograd graph is built. ``rows_nV`` is then a private copy the
    function may overwrite (e.g. turn into its gradient in place).
    """
    n_rows = int(b_idx_N.numel())
    size = max(n_rows, 1) if chunk_size is None else int(chunk_size)
    if size <= 0:
        raise ValueError(f"chunk_size must be a positive number of rows, got {chunk_size}")
    return _RowBlockSum.apply(logits_BTV, b_idx_N, t_idx_N, term_fn, size, bool(analytic))


def _target_blocks(tgt_R: torch.Tensor, chunk_size: int):
    """Blocks of the rows with a target (>= 0): a slice when contiguous (no gather), else ids."""
    rows_R = torch.nonzero(tgt_R >= 0).squeeze(1)
    for lo in range(0, rows_R.numel(), chunk_size):
        yield _as_slice(rows_R[lo:lo + chunk_size])


def _tempered_block(logits_BTV, r, dt, temperature):
    """A private compute-dtype copy of the flat rows ``r``, divided by the temperature."""
    z = _take_rows(logits_BTV, r, dt)
    return z.div_(temperature) if temperature != 1.0 else z


def _exp_normalise_(z):
    """In place ``z -> e = exp(z - max)`` per row; returns ``(e, lse, 1 / sum e)``, each [n, 1]
    but ``e``. Rows entirely ``-inf`` give ``e = 0``, ``lse = 0`` and ``1 / sum = 0`` (all their
    probabilities 0, never NaN). Four passes: max, subtract, exp, sum."""
    m = z.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = z.sub_(m).exp_()
    s = e.sum(-1, keepdim=True)
    alive = s > 0
    s = torch.where(alive, s, torch.ones_like(s))
    lse = torch.where(alive, m + torch.log(s), torch.zeros_like(s))
    return e, lse, torch.where(alive, 1.0 / s, torch.zeros_like(s))


def _onehot_minus_(probs_scaled, tgt_n, scale):
    """``scale * onehot(tgt) - probs_scaled`` in place (``probs_scaled = scale * softmax``)."""
    g = probs_scaled.neg_()
    return g.scatter_add_(1, tgt_n.unsqueeze(1), torch.ones_like(g[:, :1]) * scale)


def _token_logprob_blocks(logits_BTV, tgt_R, temperature, chunk_size, need_grad):
    """(log-probs [B*T], d logprob / d logits [B, T, V] or None, logsumexp [B*T]) in one pass."""
    dt = compute_dtype(logits_BTV)
    B, T, V = logits_BTV.shape
    out_R = torch.zeros(B * T, dtype=dt, device=logits_BTV.device)
    lse_R = torch.zeros(B * T, dtype=dt, device=logits_BTV.device)
    grad_BTV = _grad_buffer(logits_BTV, tgt_R >= 0) if need_grad else None
    grad_RV = grad_BTV.view(B * T, V) if need_grad else None
    for r in _target_blocks(tgt_R, chunk_size):
        z = _tempered_block(logits_BTV, r, dt, temperature)
        tgt_n = tgt_R[r]
        z_tgt = z.gather(1, tgt_n.unsqueeze(1))
        e, lse, inv_s = _exp_normalise_(z)
        out_R[r] = (z_tgt - lse).squeeze(1)
        lse_R[r] = lse.squeeze(1)
        if need_grad:
            scale = 1.0 / temperature
            _put_rows(grad_RV, r, _onehot_minus_(e.mul_(inv_s * scale), tgt_n, scale))
    return out_R, grad_BTV, lse_R


def formed_forward(ctx, blocks, logits_BTV, target_BT, *args):
    """Forward of a per-row term whose gradient ``blocks(logits, target_R, *args, need_grad)
    -> (out_R, grad_BTV | None)`` forms in the same pass: the gradient is kept for the first
    backward (:func:`formed_backward`); the inputs are saved so that a repeated backward can
    recompute it."""
    need_grad = ctx.needs_input_grad[0]
    out_R, ctx.grad_BTV = blocks(logits_BTV, target_BT.reshape(-1), *args, need_grad)
    if need_grad:
        ctx.save_for_backward(logits_BTV, target_BT)
        ctx.args = args
    return out_R.view(target_BT.shape)


def formed_backward(ctx, blocks, grad_BT):
    """Backward of :func:`formed_forward`: the kept gradient scaled in place by the incoming one
    (recomputed by ``blocks`` on a repeated backward)."""
    grad_BTV, ctx.grad_BTV = ctx.grad_BTV, None
    if grad_BTV is None:
        logits_BTV, target_BT = ctx.saved_tensors
        _, grad_BTV = blocks(logits_BTV, target_BT.reshape(-1), *ctx.args, True)
    grad_BTV.mul_(grad_BT.unsqueeze(-1).to(grad_BTV.dtype))
    return grad_BTV, None, None, None


def _logprob_and_grad(logits_BTV, tgt_R, temperature, chunk_size, need_grad):
    return _token_logprob_blocks(logits_BTV, tgt_R, temperature, chunk_size, need_grad)[:2]


def formed_function(name: str, blocks, doc: str) -> type:
    """A :class:`torch.autograd.Function` ``(logits, target, temperature, chunk_size) -> per-row
    term`` whose gradient ``blocks`` forms in its forward pass (:func:`formed_forward`)."""
    def forward(ctx, logits_BTV, target_BT, temperature, chunk_size):
        return formed_forward(ctx, blocks, logits_BTV, target_BT, temperature, chunk_size)

    def backward(ctx, grad_BT):
        return formed_backward(ctx, blocks, grad_BT)

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                  "backward": staticmethod(backward),
                                                  "__doc__": doc})


_TokenLogProbs = formed_function("_TokenLogProbs", _logprob_and_grad, """\
``log softmax(z / tau)[target]`` per row; 0 where the target is negative.

The per-row gradient ``(onehot(target) - softmax(z / tau)) / tau`` is computed in the same pass as
the forward and handed over (scaled in place by the incoming gradient) by the first backward; a
repeated backward recomputes it.""")


class _TokenLogProbsOverwrite(torch.autograd.Function):
    """:class:`_TokenLogProbs` that writes its gradient *into the logits' storage* in backward.

    Forward keeps only the per-row logsumexp (``[B*T]``); backward re-reads each block of logit
    rows, forms ``grad_out * (onehot - softmax) / tau`` and stores it over those rows, then returns
    an alias of the logits as the gradient. No ``[B, T, V]`` buffer is ever allocated. The write
    bumps the logits' version counter, so any *other* autograd node that saved the logits for its
    backward raises "modified by an inplace operation" instead of reading the gradient as logits
    (a second backward through this node raises the same way).
    """

    @staticmethod
    def forward(ctx, logits_BTV, target_BT, temperature, chunk_size):
        tgt_R = target_BT.reshape(-1)
        out_R, _, lse_R = _token_logprob_blocks(logits_BTV, tgt_R, temperature, chunk_size,
                                                need_grad=False)
        ctx.save_for_backward(logits_BTV, tgt_R, lse_R)
        ctx.args = (temperature, chunk_size)
        return out_R.view(target_BT.shape)

    @staticmethod
    def backward(ctx, grad_BT):
        logits_BTV, tgt_R, lse_R = ctx.saved_tensors
        temperature, chunk_size = ctx.args
        dt = compute_dtype(logits_BTV)
        B, T, V = logits_BTV.shape
        scale_R = grad_BT.reshape(-1).to(dt) / temperature
        with torch.no_grad():
            z_RV = logits_BTV.view(B * T, V)
            for r in _target_blocks(tgt_R, chunk_size):
                z = _tempered_block(logits_BTV, r, dt, temperature)
                scale = scale_R[r].unsqueeze(1)
                probs = z.sub_(lse_R[r].unsqueeze(1)).exp_()  # dead rows: exp(-inf - 0) = 0
                _put_rows(z_RV, r, _onehot_minus_(probs.mul_(scale), tgt_R[r], scale))
            z_RV.index_fill_(0, torch.nonzero(tgt_R < 0).squeeze(1), 0)
        return logits_BTV.detach(), None, None, None


def token_logprobs(logits_BTV: torch.Tensor, target_BT: torch.Tensor, temperature: float = 1.0,
                   chunk_size: int | None = DEFAULT_CHUNK_SIZE, *,
                   overwrite_logits: bool = False) -> torch.Tensor:
    """``out[b, t] = log softmax(logits[b, t] / temperature)[target[b, t]]``, 0 where target < 0.

    Output positions: row ``t`` of ``logits`` is paired with ``target[b, t]`` as given (callers
    apply the next-token shift). Chunked over rows; the gradient is formed in the same pass.
    Differentiable in ``logits`` only.

    ``overwrite_logits=True`` (opt-in, for a caller that does not need the logits after this
    loss's backward): the gradient is written over the logits tensor itself during backward
    (:class:`_TokenLogProbsOverwrite`), so the only ``[B, T, V]`` memory is the logits' own.
    After backward the logits tensor holds the gradient (and, for a leaf, ``.grad`` shares its
    storage). Other loss terms on the same logits stay correct: terms that form their gradient
    in forward (every loss in this package) never re-read the logits, and a node that does need
    them raises autograd's in-place error. Requires contiguous logits (else the ordinary path is
    used).
    """
    size = max(int(target_BT.numel()), 1) if chunk_size is None else int(chunk_size)
    if overwrite_logits and logits_BTV.requires_grad and logits_BTV.is_contiguous():
        return _TokenLogProbsOverwrite.apply(logits_BTV, target_BT.long(), float(temperature), size)
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
