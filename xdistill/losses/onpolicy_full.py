"""Full-distribution on-policy losses of one teacher: reverse_kl, topk_kl and jsd, with weights.

Legend: B batch, Ts/Tt student/teacher tokens, V vocabulary, K top-k.

The math is :mod:`xdistill.losses.divergences` (same tokenizer) and :mod:`xdistill.losses.cross`
(across tokenizers: P-KL through the projection, or exact 1:1 chunks on the shared vocabulary);
this module gives them :func:`xdistill.losses.onpolicy.onpolicy_loss`'s contract, including
per-sample reward weights (one call per distinct weight, other rows masked out).
"""

from __future__ import annotations

import torch

from xdistill.losses import cross as _cross
from xdistill.losses import divergences as _div

def _full_loss(spec, s_logits, s_mask, align, t_mask, teacher: dict,
               num_valid, chunk_size) -> torch.Tensor:
    tau = spec.temperature
    if align is None:
        if spec.kind == "topk_kl":
            return _div.topk_forward_kl(s_logits, teacher["topk_logp_BTtK"], teacher["topk_idx_BTtK"],
                                        s_mask, teacher_tail_logmass_BT=teacher.get("tail"),
                                        temperature=tau, num_valid=num_valid,
                                        chunk_size=chunk_size)
        fn = _div.reverse_kl if spec.kind == "reverse_kl" else (
            lambda *a, **k: _div.jsd(*a, beta=spec.beta, **k))
        return fn(s_logits, teacher["logits_BTtV"], s_mask, temperature=tau, num_valid=num_valid,
                  chunk_size=chunk_size)
    if spec.kind == "topk_kl":
        raise ValueError("topk_kl needs a same-tokenizer teacher; use reverse_kl/jsd through the "
                         "projection or k1/k3 over chunks for a cross-tokenizer teacher")
    direction = "reverse" if spec.kind == "reverse_kl" else "jsd"
    kw = dict(s_loss_mask_BTs=s_mask, t_loss_mask_BTt=t_mask, direction=direction, beta=spec.beta,
              temperature=tau, num_valid=num_valid, chunk_size=chunk_size)
    if spec.cross == "exact":
        return _cross.exact_kl(s_logits, teacher["logits_BTtV"], align, teacher["shared_s_idx_N"],
                               teacher["shared_t_idx_N"], **kw)
    return _cross.projected_kl(s_logits, teacher["logits_BTtV"], align, teacher["projection"], **kw)


def _need(teacher: dict, name: str, spec):
    if teacher.get(name) is None:
        raise ValueError(f"on-policy loss {spec.kind!r} needs teacher input {name!r}")
    return teacher[name]


def full_loss(spec, s_logits, s_mask, teacher: dict, *, align, t_loss_mask_BTt, sample_weight_B,
          count, chunk_size) -> torch.Tensor:
    """The weighted full-distribution loss (normalised by ``count``)."""
    needed = (("topk_logp_BTtK", "topk_idx_BTtK") if spec.kind == "topk_kl" else ("logits_BTtV",))
    if align is not None and spec.kind != "topk_kl":
        needed += (("projection",) if spec.cross == "projection"
                   else ("shared_s_idx_N", "shared_t_idx_N"))
    for name in needed:
        _need(teacher, name, spec)
    args = (spec, s_logits, s_mask, align, t_loss_mask_BTt, teacher, count, chunk_size)
    if sample_weight_B is None:
        return _full_loss(*args)
    # per-sample weights: one call per distinct weight, rows of other weights masked out
    w_B = sample_weight_B.detach().to(torch.float64)
    total = None
    for w in torch.unique(w_B):
        if float(w) == 0.0:
            continue
        rows_B = (w_B == w).to(s_mask.device)
        mask = s_mask.bool() & rows_B[:, None]
        term = float(w) * _full_loss(spec, s_logits, mask, align, t_loss_mask_BTt, teacher,
                                     count, chunk_size)
        total = term if total is None else total + term
    if total is None:
        total = s_logits[..., :0].sum().float()   # 0 with a graph; -inf padding * 0 is NaN
    return total
