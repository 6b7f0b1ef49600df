"""The uniform term of label smoothing: ``-mean_v log softmax(z / tau)[v]`` per row.

Legend: B batch, T tokens, V vocabulary, R = B*T flat rows, n rows of one block.

Label-smoothed cross-entropy (Szegedy et al. 2016; ``torch.nn.functional.cross_entropy``'s
``label_smoothing``) is ``(1 - eps) * (-log p(y)) + eps * (-1/V sum_v log p(v))``.
:func:`uniform_nll` is the second bracket. ``-inf`` logits (a masked vocabulary) are left out of
the mean: the uniform target covers the tokens the model can emit (torch's definition would be
infinite there). Like the package's other token terms the gradient, ``(softmax(z/tau) - u) / tau``
with ``u`` uniform over the finite entries, is formed block by block in the forward pass.
"""

from __future__ import annotations

import torch

from xdistill.losses.engine import (_exp_normalise_, _grad_buffer, _put_rows, _target_blocks,
                                    _tempered_block, compute_dtype, formed_function)


def _uniform_blocks(logits_BTV, tgt_R, temperature, chunk_size, need_grad):
    """(per-row uniform NLL [R], gradient [B, T, V] or None) over the rows with a target."""
    dt = compute_dtype(logits_BTV)
    B, T, V = logits_BTV.shape
    out_R = torch.zeros(B * T, dtype=dt, device=logits_BTV.device)
    grad_BTV = _grad_buffer(logits_BTV, tgt_R >= 0) if need_grad else None
    for r in _target_blocks(tgt_R, chunk_size):
        z = _tempered_block(logits_BTV, r, dt, temperature)
        finite = torch.isfinite(z)
        n_fin = finite.sum(-1, keepdim=True).clamp_min(1).to(dt)
        mean = torch.where(finite, z, torch.zeros_like(z)).sum(-1, keepdim=True) / n_fin
        e, lse, inv_s = _exp_normalise_(z)
        out_R[r] = (lse - mean).squeeze(1)
        if need_grad:
            g = e.mul_(inv_s).sub_(finite.to(dt) / n_fin).div_(temperature)
            _put_rows(grad_BTV.view(B * T, V), r, g)
    return out_R, grad_BTV


_UniformNLL = formed_function("_UniformNLL", _uniform_blocks,
                              "``-mean_v log softmax(z / tau)[v]`` per row (module doc).")


def uniform_nll(logits_BTV: torch.Tensor, target_BT: torch.Tensor, temperature: float = 1.0,
                chunk_size: int | None = 256) -> torch.Tensor:
    """``out[b, t] = -mean_v log softmax(logits[b, t] / tau)[v]`` over the finite logits, 0 where
    ``target[b, t] < 0`` (rows paired with targets as given: callers apply the next-token shift)."""
    size = max(int(target_BT.numel()), 1) if chunk_size is None else int(chunk_size)
    return _UniformNLL.apply(logits_BTV, target_BT.long(), float(temperature), size)
