"""What a teacher returns, and the math that turns logits into it.

Legend: B batch, Tt teacher tokens, V teacher vocabulary (the model's logit width, which may exceed
the tokenizer's), Vs student vocabulary, K top-k, N flattened positions (B*Tt or a chunk of them).

Three output kinds (``TeacherConfig.output``), all at temperature ``T`` (recorded in the output):

* ``logits``: ``logits_BTtV = z / T`` in the configured logits dtype; ``softmax`` of it is the
  teacher distribution at temperature T.
* ``topk``: with ``logp = log_softmax(z / T)`` (float32), the K largest ``topk_logp_BTtK`` (sorted,
  descending) and their token ids ``topk_idx_BTtK`` (int64), plus ``tail_logmass_BTt =
  log(1 - sum_k exp(topk_logp))``, the log-mass of every token outside the top K, computed as
  ``logsumexp`` of the log-probs outside the top K (not from ``1 - sum``, which loses all
  precision in float32 once the tail is below ~1e-6).
* ``projected``: the teacher distribution mapped into student space through the sparse,
  non-negative projection ``proj_VsVt`` (rows = student tokens, columns = teacher tokens):
  ``q = softmax(z / T)`` over teacher tokens, ``m = proj_VsVt @ q`` (mass each student token
  receives), ``q_s = m / sum(m)`` (renormalised, so the result is a distribution even when the
  projection drops mass), ``proj_logp_BTtVs = log(q_s)``. Teacher logit columns beyond the
  projection's Vt (padded embedding rows) carry no mapping and are dropped before renormalising.
* ``support``: ``support_logits_BTtS = z[..., S] / T``, the logits at the projection's *support*
  ``S`` only (:func:`support_columns`: the teacher ids some student token maps to with positive
  weight, increasing), in the configured logits dtype. P-KL restricts and renormalises both sides
  to ``S`` (``xdistill.losses.projection_ops``), so these columns are all it reads; the worker's
  head computes only them (``xdistill.teacher.head``).

Every kind but ``support`` also carries ``token_logp_BTt``: the log-probability (at temperature
T, float32) of the teacher's own next input token, at *input* positions: ``token_logp_BTt[b, j] =
log softmax(z[b, j-1] / T)[ids[b, j]]`` and 0 at ``j = 0`` (a cheap gather: ``z_id / T -
logsumexp(z / T)``). The sampled
on-policy estimators (k1, k3) need only this, so they work with top-k and projected teachers too.
(``support`` outputs leave it out: it needs the normaliser over every column, which is the cost
that kind avoids.)

Zero probabilities (an empty tail, a student token that receives no mass, a position whose mass is
all dropped) are floored at :data:`LOGP_TINY` = log(float32 tiny) ~ -87.3 instead of ``-inf``, so
no ``-inf`` reaches a reverse KL. Values at padding positions are computed like any other and
carry no meaning; mask them with the view's attention mask.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace

import torch

from xdistill.losses.projection_ops import projection_support

# log of float32's smallest normal number (~ -87.3): the floor of teacher log-probs that would be
# -inf (not the losses' LOGP_FLOOR, -1e4, which floors log p inside a divergence)
LOGP_TINY = math.log(torch.finfo(torch.float32).tiny)
# bytes of float32 temporaries the post-processing allows itself per chunk of positions
_CHUNK_BYTES = 1 << 28

TENSOR_FIELDS = ("logits_BTtV", "topk_logp_BTtK", "topk_idx_BTtK", "tail_logmass_BTt",
                 "proj_logp_BTtVs", "support_logits_BTtS", "token_logp_BTt")


@dataclass(frozen=True)
class TeacherOutput:
    """One teacher's output for one batch (only the fields of its ``kind`` are set)."""

    # teacher name
    name: str
    # "logits" | "topk" | "projected" | "support"
    kind: str
    # softmax temperature the outputs are taken at
    temperature: float
    # z / T, [B, Tt, V] (kind "logits")
    logits_BTtV: torch.Tensor | None = None
    # top-K log-probs at temperature T, descending, float32 [B, Tt, K] (kind "topk")
    topk_logp_BTtK: torch.Tensor | None = None
    # teacher token ids of the top-K entries, int64 [B, Tt, K] (kind "topk")
    topk_idx_BTtK: torch.Tensor | None = None
    # log(1 - sum exp(topk_logp)), float32 [B, Tt] (kind "topk")
    tail_logmass_BTt: torch.Tensor | None = None
    # log of the teacher distribution projected into student space, float32 [B, Tt, Vs]
    proj_logp_BTtVs: torch.Tensor | None = None
    # z / T at the projection's support columns S (increasing teacher ids), [B, Tt, S]
    # (kind "support")
    support_logits_BTtS: torch.Tensor | None = None
    # log q(ids[j] | ids[<j]) at temperature T at input positions (0 at j = 0), float32 [B, Tt]
    # (every kind but "support")
    token_logp_BTt: torch.Tensor | None = None
    # request number this output answers (increases by one per forward of this teacher)
    step: int = -1

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensor fields that are set, by name."""
        return {n: getattr(self, n) for n in TENSOR_FIELDS if getattr(self, n) is not None}

    def clone(self) -> "TeacherOutput":
        """A copy that owns its memory (outlives the transport slot it was read from)."""
        return replace(self, **{n: t.clone() for n, t in self.tensors().items()})

    def to(self, device, non_blocking: bool = False) -> "TeacherOutput":
        return replace(self, **{n: t.to(device, non_blocking=non_blocking)
                                for n, t in self.tensors().items()})


def output_spec(kind: str, B: int, Tt: int, V: int, *, top_k: int = 0, Vs: int = 0, S: int = 0,
                logits_dtype: torch.dtype = torch.float32) -> dict[str, tuple[tuple, torch.dtype]]:
    """Shapes and dtypes of the tensor fields of a ``kind`` output for a [B, Tt] batch (``S``:
    the support width of kind ``support``)."""
    if kind == "support":
        return {"support_logits_BTtS": ((B, Tt, S), logits_dtype)}
    token = {"token_logp_BTt": ((B, Tt), torch.float32)}
    if kind == "logits":
        return {"logits_BTtV": ((B, Tt, V), logits_dtype), **token}
    if kind == "topk":
        K = min(top_k, V)
        return {"topk_logp_BTtK": ((B, Tt, K), torch.float32),
                "topk_idx_BTtK": ((B, Tt, K), torch.int64),
                "tail_logmass_BTt": ((B, Tt), torch.float32), **token}
    if kind == "projected":
        return {"proj_logp_BTtVs": ((B, Tt, Vs), torch.float32), **token}
    raise ValueError(f"unknown teacher output kind {kind!r}")


def _chunk_rows(width: int) -> int:
    return max(1, _CHUNK_BYTES // (4 * max(width, 1)))


def topk_logprobs(logits_NV: torch.Tensor, k: int, temperature: float):
    """Top-k log-probs, ids and tail log-mass of ``log_softmax(logits / T)`` (see module doc)."""
    N, V = logits_NV.shape
    k = min(k, V)
    vals_NK = torch.empty(N, k, dtype=torch.float32, device=logits_NV.device)
    idx_NK = torch.empty(N, k, dtype=torch.int64, device=logits_NV.device)
    tail_N = torch.empty(N, dtype=torch.float32, device=logits_NV.device)
    step = _chunk_rows(V)
    for a in range(0, N, step):
        logp = torch.log_softmax(logits_NV[a:a + step].float() / temperature, dim=-1)
        v, i = torch.topk(logp, k, dim=-1, sorted=True)
        vals_NK[a:a + step] = v
        idx_NK[a:a + step] = i
        rest = logp.scatter_(-1, i, float("-inf"))
        tail_N[a:a + step] = torch.logsumexp(rest, dim=-1).clamp(min=LOGP_TINY)
    return vals_NK, idx_NK, tail_N


def next_token_logprobs(logits_nTV: torch.Tensor, ids_nT: torch.Tensor,
                        temperature: float) -> torch.Tensor:
    """``out[b, j] = log softmax(logits[b, j-1] / T)[ids[b, j]]``, 0 at ``j = 0`` (float32).

    Computed per block of rows as ``z_id / T - logsumexp(z / T)`` (one float32 temporary of
    ``rows x V`` per block), floored at :data:`LOGP_TINY`.
    """
    n, T, V = logits_nTV.shape
    out_nT = torch.zeros(n, T, dtype=torch.float32, device=logits_nTV.device)
    if T < 2:
        return out_nT
    flat_NV = logits_nTV[:, :-1].reshape(n * (T - 1), V)
    tgt_N = ids_nT[:, 1:].reshape(-1).to(logits_nTV.device).clamp(0, V - 1)
    res_N = torch.empty(n * (T - 1), dtype=torch.float32, device=logits_nTV.device)
    step = _chunk_rows(V)
    for a in range(0, flat_NV.shape[0], step):
        z = flat_NV[a:a + step].float() / temperature
        picked = z.gather(1, tgt_N[a:a + step, None]).squeeze(1)
        res_N[a:a + step] = (picked - torch.logsumexp(z, dim=-1)).clamp(min=LOGP_TINY)
    out_nT[:, 1:] = res_N.view(n, T - 1)
    return out_nT


def projected_logprobs(logits_NV: torch.Tensor, proj_VsVt: torch.Tensor,
                       temperature: float) -> torch.Tensor:
    """``log(normalise(proj_VsVt @ softmax(logits / T)))`` per position (see module doc)."""
    N, V = logits_NV.shape
    Vs, Vt = proj_VsVt.shape
    if Vt > V:
        raise ValueError(f"projection has {Vt} teacher columns but the teacher model emits only "
                         f"{V} logits; it was built for another teacher vocabulary")
    out_NVs = torch.empty(N, Vs, dtype=torch.float32, device=logits_NV.device)
    step = _chunk_rows(max(V, Vs))
    for a in range(0, N, step):
        # over the projection's columns only: a padded vocabulary's extra (untrained) rows could
        # otherwise hold all the mass and underflow every real column (the result is
        # renormalised, so the dropped columns change nothing else)
        q_nV = torch.softmax(logits_NV[a:a + step, :Vt].float() / temperature, dim=-1)
        m_Vsn = torch.sparse.mm(proj_VsVt, q_nV.T.contiguous())
        m_nVs = m_Vsn.T
        total_n1 = m_nVs.sum(dim=-1, keepdim=True)
        q_s = m_nVs / total_n1.clamp(min=torch.finfo(torch.float32).tiny)
        out_NVs[a:a + step] = torch.log(q_s).clamp(min=LOGP_TINY)
    return out_NVs


def projection_on_device(proj_VsVt: torch.Tensor, device) -> torch.Tensor:
    """Check a projection (2-D, non-negative) and return it as float32 CSR on ``device``."""
    if proj_VsVt.dim() != 2:
        raise ValueError(f"projection must be 2-D [Vs, Vt], got shape {tuple(proj_VsVt.shape)}")
    coo = proj_VsVt.to_sparse_coo() if proj_VsVt.layout != torch.sparse_coo else proj_VsVt
    coo = coo.coalesce().to(torch.float32)
    if coo._nnz() and float(coo.values().min()) < 0:
        raise ValueError("projection has negative entries; it must map probability mass")
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return coo.to_sparse_csr().to(device)


def support_columns(proj_VsVt: torch.Tensor, V: int | None = None) -> torch.Tensor:
    """The support ``S`` of a projection: the teacher ids (columns) holding some positive weight,
    increasing, int64 on the projection's device: the columns P-KL reads. ``V`` (the teacher's
    logit width), when given, is checked to cover them."""
    if proj_VsVt.dim() != 2:
        raise ValueError(f"projection must be 2-D [Vs, Vt], got shape {tuple(proj_VsVt.shape)}")
    Vt = int(proj_VsVt.shape[1])
    if V is not None and Vt > V:
        raise ValueError(f"projection has {Vt} teacher columns but the teacher model emits only "
                         f"{V} logits; it was built for another teacher vocabulary")
    return projection_support(proj_VsVt)  # the very columns the loss restricts to


def fill_output(kind: str, logits_nTV: torch.Tensor, out: dict[str, torch.Tensor], rows: slice,
                *, temperature: float, top_k: int = 0, proj_VsVt=None, ids_nT=None,
                support_S=None) -> None:
    """Write the ``kind`` output for rows ``rows`` of the batch from their logits into ``out``.

    ``ids_nT`` (the rows' input ids) is needed when ``out`` holds ``token_logp_BTt``;
    ``support_S`` (:func:`support_columns`) for kind ``support``.
    """
    n, T, V = logits_nTV.shape
    if kind == "support":
        z = logits_nTV.index_select(-1, support_S.to(logits_nTV.device))
        out["support_logits_BTtS"][rows].copy_(z if temperature == 1.0 else z.float() / temperature)
        return
    if "token_logp_BTt" in out:
        if ids_nT is None:
            raise ValueError("fill_output: token_logp_BTt needs the rows' input ids (ids_nT)")
        out["token_logp_BTt"][rows].copy_(next_token_logprobs(logits_nTV, ids_nT, temperature))
    flat_NV = logits_nTV.reshape(n * T, V)
    if kind == "logits":
        dst = out["logits_BTtV"][rows]
        dst.copy_(logits_nTV if temperature == 1.0 else logits_nTV.float() / temperature)
    elif kind == "topk":
        v, i, tail = topk_logprobs(flat_NV, top_k, temperature)
        K = v.shape[-1]
        out["topk_logp_BTtK"][rows].copy_(v.view(n, T, K))
        out["topk_idx_BTtK"][rows].copy_(i.view(n, T, K))
        out["tail_logmass_BTt"][rows].copy_(tail.view(n, T))
    elif kind == "projected":
        lp = projected_logprobs(flat_NV, proj_VsVt, temperature)
        out["proj_logp_BTtVs"][rows].copy_(lp.view(n, T, -1))
    else:
        raise ValueError(f"unknown teacher output kind {kind!r}")


def check_fields(output: TeacherOutput) -> None:
    """Raise ValueError when an output lacks the fields of its kind (a worker bug)."""
    need = {"logits": ("logits_BTtV",), "projected": ("proj_logp_BTtVs",),
            "support": ("support_logits_BTtS",),
            "topk": ("topk_logp_BTtK", "topk_idx_BTtK", "tail_logmass_BTt")}[output.kind]
    missing = [n for n in need if getattr(output, n) is None]
    if missing:
        raise ValueError(f"teacher {output.name!r} output of kind {output.kind!r} lacks {missing}")


__all__ = ["TeacherOutput", "LOGP_TINY", "output_spec", "topk_logprobs", "projected_logprobs",
           "next_token_logprobs",
           "projection_on_device", "support_columns", "fill_output", "check_fields",
           "TENSOR_FIELDS"]
