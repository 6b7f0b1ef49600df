"""Fast P-KL kernels: the sparse projection ``m = W^T p`` and its closed-form gradients.

Legend: Vs/Vt student/teacher vocabularies, S the support of W (teacher tokens with some positive
weight, in increasing id order), n rows of one block, N non-zeros.

P-KL (:func:`xdistill.losses.cross.projected_kl`) compares, per row, the student distribution
pushed into teacher space, ``m = W^T p`` with ``p = softmax(z_s / tau)``, against the teacher
distribution ``q``, both restricted to the support ``S`` and renormalised there:
``log P~_t = log m_t - log M`` with ``M = sum_S m``, ``log Q~ = log_softmax(z_t[S] / tau_t)``.
Columns outside ``S`` hold 0 on both sides and add exactly 0 to every divergence used (forward,
reverse KL, JSD), so everything here works on ``[n, S]`` tensors instead of ``[n, Vt]``.

Speed. The previous formulation, autograd through ``p @ W`` (dense @ sparse CSR) plus ~10
elementwise ops and masks over ``[n, Vt]``, was slow on CPU: ``dense @ CSR`` converts W on every
call, and every op allocates a fresh ``[n, Vt]`` tensor. Here W is prepared once per (projection
tensor, dtype, device) and cached on the tensor object (:func:`prepare_projection`): two CSR
layouts of W restricted to S, ``[S, Vs]`` for the forward ``m^T = W_S^T p^T`` and ``[Vs, S]`` for
the backward ``W_S a^T``, both computed as ``torch.mm(CSR, dense^T)`` written into a row-major
result (:func:`_spmm_rows`, the sparse @ dense path of MKL on CPU and of cuSPARSE on CUDA).
Gradients are closed forms (no autograd graph over ``[n, S]``); masks are arithmetic, not
``torch.where`` (slow per element on CPU); the fused forward KL works on row groups small enough
that its temporaries are reused from the heap instead of fresh pages (:data:`GROUP_BYTES`) and
gathers the teacher rows at the support group by group. For a given
``g_t = d loss / d log P~_t``, with ``pos_t = [m_t > 0]``:

    d loss / d m_t = pos_t g_t / m_t - (sum_u g_u) / M
    d loss / d p_s = (W a)_s - c r_s,  a_t = pos_t g_t / m_t,  c = sum_u g_u / M,  r_s = sum_S W[s]
    d loss / d z_s = p_s (d_s - sum_v p_v d_v) / tau    (softmax backward, d = d loss / d p)

(entries with ``m_t = 0`` have ``log P~_t = -inf``; their log has no gradient, as in
the previous formulation). For the forward KL, ``KL(Q~ || P~) = sum_S q (max(log q, F) - max(log P~, F))``
with ``F = LOGP_FLOOR``, ``g_t = -q_t pos_t``, and the softmax-backward inner product vanishes
(``sum_s p_s d_s = -sum_t pos_t q_t + c M = 0``), so
``d KL / d z_s = p_s (c r_s - (W a')_s) / tau`` with ``a'_t = pos_t q_t / m_t``,
``c = sum_t pos_t q_t / M``: one fused function (:func:`projected_forward_kl_sum`,
:func:`projected_forward_kl_gather`); reverse KL and JSD use :func:`projected_logp` (the closed
form above as an autograd Function) under an ordinary autograd divergence.

A dense W (``p @ W_dense``) was measured and rejected on CPU: even at tiny vocabularies the
dense product is 25-100x slower than the sparse one (256 rows, one core: Vs x Vt = 3000 x 956,
~15 ms dense vs ~0.5 ms sparse; 4000 x 6000, ~130 ms vs ~1 ms).
"""

from __future__ import annotations

import warnings

import torch

from xdistill.losses.engine import LOGP_FLOOR, log_softmax_safe

_CACHE_ATTR = "_xdistill_prepared_projection"


class PreparedProjection:
    """W restricted to its support S, in two CSR layouts, for one dtype and device.

    ``support_S`` (long, teacher ids), ``wt_SVs`` (CSR ``[S, Vs]``), ``w_VsS`` (CSR ``[Vs, S]``),
    ``rowsum_Vs`` (row sums of W over S: 1 for mapped, 0 for unmapped student tokens).
    """

    def __init__(self, support_S, wt_SVs, w_VsS, rowsum_Vs, shape):
        self.support_S, self.wt_SVs, self.w_VsS = support_S, wt_SVs, w_VsS
        self.rowsum_Vs = rowsum_Vs
        self.shape = shape

    @property
    def n_support(self) -> int:
        return int(self.support_S.numel())


def _coo_parts(proj_VsVt: torch.Tensor):
    """(rows_N, cols_N, vals_N) of the positive entries of W, any layout."""
    if proj_VsVt.layout == torch.sparse_csr:
        crow = proj_VsVt.crow_indices()
        rows = torch.repeat_interleave(torch.arange(crow.numel() - 1, device=crow.device),
                                       crow[1:] - crow[:-1])
        cols, vals = proj_VsVt.col_indices(), proj_VsVt.values()
    else:
        coo = proj_VsVt if proj_VsVt.layout == torch.sparse_coo else proj_VsVt.to_sparse()
        coo = coo.coalesce()
        rows, cols = coo.indices()
        vals = coo.values()
    keep = vals > 0
    return rows[keep].long(), cols[keep].long(), vals[keep]


def _csr(major_N, minor_N, vals_N, n_major, n_minor):
    """CSR [n_major, n_minor] from unsorted triplets (sorted here by (major, minor))."""
    order = torch.argsort(major_N * n_minor + minor_N)
    major, minor, vals = major_N[order], minor_N[order], vals_N[order]
    crow = torch.zeros(n_major + 1, dtype=torch.long, device=major.device)
    crow[1:] = torch.cumsum(torch.bincount(major, minlength=n_major), 0)
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, minor, vals, size=(n_major, n_minor))


def projection_support(proj_VsVt: torch.Tensor) -> torch.Tensor:
    """The support S of W: the teacher ids (columns) holding some positive weight, increasing
    (int64): the columns P-KL reads (a teacher's ``support`` output gives only these)."""
    return torch.unique(_coo_parts(proj_VsVt)[1])


def _build(proj_VsVt: torch.Tensor, dtype: torch.dtype) -> PreparedProjection:
    Vs, Vt = int(proj_VsVt.shape[0]), int(proj_VsVt.shape[1])
    rows, cols, vals = _coo_parts(proj_VsVt)
    vals = vals.to(dtype)
    support_S = torch.unique(cols)  # sorted: projection_support(proj_VsVt)
    col_to_S = torch.full((Vt,), -1, dtype=torch.long, device=cols.device)
    col_to_S[support_S] = torch.arange(support_S.numel(), device=cols.device)
    s_cols = col_to_S[cols]
    S = int(support_S.numel())
    rowsum_Vs = torch.zeros(Vs, dtype=dtype, device=vals.device).index_add_(0, rows, vals)
    return PreparedProjection(support_S, _csr(s_cols, rows, vals, S, Vs),
                              _csr(rows, s_cols, vals, Vs, S), rowsum_Vs, (Vs, Vt))


def prepare_projection(proj_VsVt: torch.Tensor, dtype: torch.dtype,
                       device: torch.device | str | None = None) -> PreparedProjection:
    """The :class:`PreparedProjection` of ``proj_VsVt`` (sparse CSR/COO or dense ``[Vs, Vt]``) in
    ``dtype`` on ``device`` (default: the projection's own device).

    Built once per (tensor, dtype, device) and cached on the tensor object, so a trainer that
    passes the same (e.g. CPU) projection every step pays the conversion and the host-to-device
    copy once. The projection is treated as immutable (an in-place change of its values after the
    first call is not seen).
    """
    device = proj_VsVt.device if device is None else torch.device(device)
    cache = getattr(proj_VsVt, _CACHE_ATTR, None)
    if cache is None:
        cache = {}
        try:
            setattr(proj_VsVt, _CACHE_ATTR, cache)
        except (AttributeError, RuntimeError):  # not cacheable: rebuild every call
            pass
    key = (dtype, device)
    if key not in cache:
        prep = _build(proj_VsVt, dtype)
        if device != proj_VsVt.device:
            prep = PreparedProjection(*(x.to(device) for x in (prep.support_S, prep.wt_SVs,
                                                               prep.w_VsS, prep.rowsum_Vs)),
                                      prep.shape)
        cache[key] = prep
    return cache[key]


def _spmm_rows(A_csr: torch.Tensor, x_nK: torch.Tensor) -> torch.Tensor:
    """``x @ A^T`` for CSR ``A [R, K]`` and dense ``x [n, K]``, computed as ``A @ x^T``, [n, R].

    The sparse @ dense fast path: ``x^T`` is a column-major view (no copy) and the product is
    written through a column-major ``[R, n]`` view of a row-major ``[n, R]`` output, so the result
    is contiguous without a transpose copy. ``torch.mm``, not ``@``: on CPU ``matmul`` takes a
    ~6x slower route for sparse CSR @ strided.
    """
    out_nR = torch.empty((x_nK.shape[0], A_csr.shape[0]), dtype=x_nK.dtype, device=x_nK.device)
    torch.mm(A_csr, x_nK.t(), out=out_nR.t())
    return out_nR


def _div_or_zero(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``x / m`` where ``m > 0``, 0 where ``m == 0`` (for ``m >= 0``), in one fresh buffer.

    ``x / 0`` is inf or NaN and is zeroed in place (``nan_to_num_``): cheaper than comparisons and
    ``torch.where``, which are ~10-40x slower than arithmetic per element on CPU in this torch
    build. (A quotient that overflows for a subnormal ``m > 0`` is zeroed too, where the old
    autograd formulation produced inf/NaN gradients.)
    """
    return torch.div(x, m).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)


def _log_mass(M_n1: torch.Tensor) -> torch.Tensor:
    """``log M``, 0 where ``M == 0`` (then every ``m_t`` is 0 and ``log P~`` is -inf anyway)."""
    return torch.log(torch.where(M_n1 > 0, M_n1, torch.ones_like(M_n1)))


def _student_p_m(z_nVs: torch.Tensor, prep: PreparedProjection, tau: float):
    """(p = softmax(z / tau) [n, Vs], m = W_S^T p [n, S], M = sum_S m [n, 1])."""
    z = z_nVs if tau == 1.0 else z_nVs / tau
    p = log_softmax_safe(z).exp_()
    m = _spmm_rows(prep.wt_SVs, p)
    return p, m, m.sum(-1, keepdim=True)


def teacher_logq(zt_nS: torch.Tensor, tau_t: float) -> torch.Tensor:
    """``log_softmax(z_t[S] / tau_t)`` from teacher logits already restricted to the support
    (``zt_nVt[:, prep.support_S]``), [n, S], no gradient; ``zt_nS`` is not modified."""
    z = zt_nS.detach()
    z = z / tau_t if tau_t != 1.0 else z
    return log_softmax_safe(z)


class _ProjectedLogP(torch.autograd.Function):
    """``log P~`` [n, S] from student logits [n, Vs]; closed-form backward (module doc)."""

    @staticmethod
    def forward(ctx, z_nVs, prep, tau):
        p, m, M = _student_p_m(z_nVs, prep, tau)
        ctx.save_for_backward(p, m, M)
        ctx.prep, ctx.tau = prep, tau
        return torch.log(m).sub_(_log_mass(M))  # log 0 = -inf stays -inf

    @staticmethod
    def backward(ctx, g_nS):
        p, m, M = ctx.saved_tensors
        prep = ctx.prep
        c = torch.where(M > 0, g_nS.sum(-1, keepdim=True) / M, torch.zeros_like(M))
        d = _spmm_rows(prep.w_VsS, _div_or_zero(g_nS, m))
        d.addcmul_(c, prep.rowsum_Vs, value=-1.0)  # d loss / d p
        dot = torch.linalg.vecdot(p, d).unsqueeze(-1)
        return d.sub_(dot).mul_(p).div_(ctx.tau), None, None


def projected_logp(z_nVs: torch.Tensor, prep: PreparedProjection, tau: float = 1.0) -> torch.Tensor:
    """``log normalise((W^T softmax(z / tau))|_S)`` per row, [n, S] (-inf where the mass is 0)."""
    return _ProjectedLogP.apply(z_nVs, prep, float(tau))


# Temporaries of one row group stay under this many bytes: glibc serves blocks below its mmap
# threshold (at most 32 MiB) from the heap and reuses them, so the groups of a block do not pay
# fresh page faults every time, which on a VM cost more than the arithmetic itself.
GROUP_BYTES = 16 * 2 ** 20


def group_rows(n: int, *widths: int, itemsize: int = 4) -> int:
    """Rows per group so that a ``[rows, max(widths)]`` buffer stays under :data:`GROUP_BYTES`."""
    return max(1, min(n, GROUP_BYTES // (itemsize * max(max(widths), 1))))


def _support_of(rows_nX: torch.Tensor, prep: PreparedProjection, on_support: bool):
    """Teacher rows at the support: as they are when the teacher gave only the support's columns
    (``on_support``, width S), else their ``prep.support_S`` columns."""
    return rows_nX if on_support else rows_nX.index_select(1, prep.support_S)


def gather_support_rows(teacher_BTtVt: torch.Tensor, b_n: torch.Tensor, t_n: torch.Tensor,
                        prep: PreparedProjection, dtype: torch.dtype,
                        on_support: bool = False) -> torch.Tensor:
    """``teacher_BTtVt[b_n, t_n][:, prep.support_S]`` in ``dtype``, [n, S], gathered by row groups
    (no ``[n, Vt]`` intermediate). ``on_support``: the teacher tensor holds only the support's
    columns already (``[B, Tt, S]``, a ``support`` teacher output)."""
    n, Vt = int(b_n.numel()), teacher_BTtVt.shape[-1]
    out = torch.empty((n, prep.n_support), dtype=dtype, device=teacher_BTtVt.device)
    step = group_rows(n, Vt, itemsize=teacher_BTtVt.element_size())
    for lo in range(0, n, step):
        rows = teacher_BTtVt[b_n[lo:lo + step], t_n[lo:lo + step]]
        out[lo:lo + step] = _support_of(rows, prep, on_support)
    return out


def _forward_kl_group(z_gVs, zt_gS, prep, tau, tau_t, need_grad):
    """(``sum_rows KL(Q~ || P~)``, its gradient w.r.t. ``z_gVs`` or None) for one row group.

    Allocates as few buffers as possible (in-place ops on private tensors)."""
    p, m, M = _student_p_m(z_gVs, prep, tau)
    logq = teacher_logq(zt_gS, tau_t)
    q = torch.exp(logq)
    if need_grad:
        r = _div_or_zero(q, m)  # pos q / m
        c = torch.linalg.vecdot(r, m).unsqueeze(-1)  # sum_t pos_t q_t
        c = torch.where(M > 0, c / M, torch.zeros_like(M))
    logP = m.log_().sub_(_log_mass(M)).clamp_min_(LOGP_FLOOR)  # m is dead from here
    diff = logq.clamp_min_(LOGP_FLOOR).sub_(logP)
    value = torch.linalg.vecdot(q, diff).sum()  # q = 0 gives 0: both logs are floored
    if not need_grad:
        return value, None
    del q, logq, logP, diff
    d = _spmm_rows(prep.w_VsS, r).neg_()
    d.addcmul_(c, prep.rowsum_Vs)  # c r_s - (W r)_s
    return value, d.mul_(p).div_(tau)


class _ProjectedForwardKL(torch.autograd.Function):
    """``sum_rows KL(Q~ || P~)`` over row groups; the closed-form gradient (module doc) is formed
    in the forward, group by group, and only ``[n, Vs]`` is kept for the backward."""

    @staticmethod
    def forward(ctx, z_nVs, take_teacher, prep, tau, tau_t):
        n, Vs = z_nVs.shape
        need_grad = ctx.needs_input_grad[0]
        grad_nVs = torch.empty_like(z_nVs) if need_grad else None
        total = torch.zeros((), dtype=torch.float64, device=z_nVs.device)
        step = group_rows(n, Vs, prep.n_support, itemsize=z_nVs.element_size())
        for lo in range(0, n, step):
            sl = slice(lo, min(n, lo + step))
            value, g = _forward_kl_group(z_nVs[sl], take_teacher(sl), prep, tau, tau_t, need_grad)
            total += value.to(torch.float64)
            if need_grad:
                grad_nVs[sl] = g
        if need_grad:
            ctx.save_for_backward(grad_nVs)
        return total.to(z_nVs.dtype)

    @staticmethod
    def backward(ctx, g):
        (grad_nVs,) = ctx.saved_tensors
        return grad_nVs * g, None, None, None, None


def projected_forward_kl_sum(z_nVs: torch.Tensor, zt_nS: torch.Tensor, prep: PreparedProjection,
                             tau: float = 1.0, tau_t: float = 1.0) -> torch.Tensor:
    """``sum_rows KL(Q~ || P~)`` (no ``tau^2``), differentiable in the student logits ``z_nVs``.

    ``zt_nS``: the teacher's logit rows restricted to the support, ``zt_nVt[:, prep.support_S]``
    (no gradient); ``Q~ = softmax(zt_nS / tau_t)``.
    """
    if prep.n_support != zt_nS.shape[-1]:
        raise ValueError(f"teacher rows have {zt_nS.shape[-1]} columns, the projection's support "
                         f"{prep.n_support}: pass zt_nVt[:, prep.support_S]")
    zt = zt_nS.detach()
    return _ProjectedForwardKL.apply(z_nVs, lambda sl: zt[sl].to(z_nVs.dtype, copy=True), prep,
                                     float(tau), float(tau_t))


def projected_forward_kl_gather(z_nVs: torch.Tensor, teacher_BTtVt: torch.Tensor, b_n, t_n,
                                prep: PreparedProjection, tau: float = 1.0,
                                tau_t: float = 1.0, on_support: bool = False) -> torch.Tensor:
    """:func:`projected_forward_kl_sum` with the teacher rows ``teacher_BTtVt[b_n, t_n]`` gathered
    at the support group by group (never an ``[n, Vt]`` or ``[n, S]`` teacher copy);
    ``on_support`` as in :func:`gather_support_rows`."""
    teacher = teacher_BTtVt.detach()

    def take(sl):
        rows = _support_of(teacher[b_n[sl], t_n[sl]], prep, on_support)
        return rows.to(z_nVs.dtype)

    return _ProjectedForwardKL.apply(z_nVs, take, prep, float(tau), float(tau_t))


__all__ = ["GROUP_BYTES", "PreparedProjection", "gather_support_rows", "group_rows",
           "prepare_projection", "projected_forward_kl_gather", "projected_forward_kl_sum",
           "projection_support",
           "projected_logp", "teacher_logq"]
