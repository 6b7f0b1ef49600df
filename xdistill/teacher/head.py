"""Teacher outputs written block by block from hidden states: no full-size logits copy.

Legend: n rows of a micro-batch, T teacher tokens, H hidden size, V logit width, N = n*T flat
positions, Vs student vocabulary, K top-k.

A Hugging Face causal LM returns its logits as one ``[n, T, V]`` tensor (Gemma-3 then soft-caps
them through three more temporaries). With a 262k-token teacher vocabulary that is 300 MB per
4 x 72 tokens each, on top of the output buffer the worker writes into. :class:`SplitHead` runs the
model's trunk once (hidden states ``[n, T, H]``, small) and then the output layer over blocks of
positions, writing each block's result straight into the output buffer: full logits land in their
buffer with no second copy; top-k, projected and token log-prob outputs never hold more than one
``[block, V]`` float32 block.

A ``support`` output (P-KL's columns only, ``xdistill.teacher.outputs``) uses the split restricted
to those columns (:meth:`SplitHead.restrict`): a copy of the head's rows there (46,445 x 640 for
Gemma-3 behind SmolLM2's projection: 59 MB in bfloat16; teachers are frozen, so it never goes
stale), and a matmul over them only.

The split is used only where it reproduces the model's own forward: the model must expose
``get_decoder()`` and a linear output layer, a final logit soft-cap (Gemma 2/3) is applied in
place, and :meth:`SplitHead.verify` compares both paths on a short probe when the worker starts
(any other architecture falls back to the plain forward).
"""

from __future__ import annotations

import torch

from xdistill.teacher.outputs import LOGP_TINY, projected_logprobs, topk_logprobs

# float32 bytes of one [block, V] block at most: 128 MiB (128 positions of a 262k vocabulary).
# Smaller blocks cost speed (measured for Gemma-3-270M, 4 x 72 tokens, 2 threads: 2.14 s with
# 32 MiB blocks, 1.79 s with 128 MiB, 1.77 s for the model's own forward); a block is also never
# more than half a micro-batch, so the temporaries stay below the output buffer itself
BLOCK_BYTES = 1 << 27
# whether torch.mm(..., out_dtype=float32) works on CUDA here (set False at its first failure;
# untested on a GPU so far, hence the fallback)
_MM_OUT_DTYPE = [True]


class SplitHead:
    """``trunk(ids, mask) -> hidden`` and ``head(hidden block) -> logits block`` of a causal LM."""

    def __init__(self, model):
        self.decoder = model.get_decoder()
        self.head = model.get_output_embeddings()
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") \
            else model.config
        self.softcap = getattr(cfg, "final_logit_softcapping", None)
        self.V = int(self.head.weight.shape[0])
        # output columns of a restricted head (:meth:`restrict`), else None (every column)
        self.columns = None
        self._rows: dict = {}  # the head's rows at ``columns``, per (device, dtype)

    def restrict(self, columns_S: torch.Tensor) -> "SplitHead":
        """This split computing only the logits of ``columns_S`` (teacher ids, long): the
        head's rows there, gathered once per device (``output: support``)."""
        other = object.__new__(SplitHead)
        other.__dict__.update(self.__dict__, columns=columns_S.long(), V=int(columns_S.numel()),
                              _rows={})
        return other

    def _weight_bias(self):
        w, b = self.head.weight, self.head.bias
        if self.columns is None:
            return w, b
        key = (w.device, w.dtype)
        if key not in self._rows:
            cols = self.columns.to(w.device)
            self._rows.clear()  # the weights moved (offload): keep one copy
            self._rows[key] = (w.index_select(0, cols).contiguous(),
                               None if b is None else b.index_select(0, cols))
        return self._rows[key]

    @classmethod
    def of(cls, model) -> "SplitHead | None":
        """The split of ``model``, or None when it does not expose a plain trunk and head."""
        try:
            decoder = model.get_decoder()
        except Exception:  # noqa: BLE001 - no decoder accessor
            return None
        head = model.get_output_embeddings()
        if decoder is None or not isinstance(head, torch.nn.Linear):
            return None
        return cls(model)

    def hidden(self, ids_nT, mask_nT) -> torch.Tensor:
        return self.decoder(input_ids=ids_nT, attention_mask=mask_nT,
                            use_cache=False).last_hidden_state

    def logits(self, h_NH: torch.Tensor, out_NV: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of ``N`` positions, soft-capped, written into ``out_NV`` when given (else in
        the weights' dtype).

        A float32 ``out_NV`` from bfloat16 weights: the matmul runs in bfloat16 with float32
        accumulation. On CUDA it writes float32 directly (``torch.mm(..., out_dtype=float32)``);
        on CPU torch has no float32-output bfloat16 matmul, so the block's bfloat16 product is
        widened into ``out_NV`` (one [block, V] temporary, never a full-size one). The soft-cap
        is then applied in float32."""
        w, bias = self._weight_bias()
        h = h_NH.to(w.dtype)
        if out_NV is None or bias is not None:
            z = torch.nn.functional.linear(h, w, bias)
            if out_NV is not None:
                z = out_NV.copy_(z)
        elif out_NV.dtype == w.dtype and out_NV.device == h.device:
            z = torch.matmul(h, w.t(), out=out_NV)
        elif h.is_cuda and out_NV.dtype == torch.float32 and _MM_OUT_DTYPE[0]:
            try:
                z = out_NV.copy_(torch.mm(h, w.t(), out_dtype=torch.float32))
            except (TypeError, RuntimeError, NotImplementedError):  # torch without mm.dtype
                _MM_OUT_DTYPE[0] = False
                z = out_NV.copy_(torch.matmul(h, w.t()))
        else:
            z = out_NV.copy_(torch.matmul(h, w.t()))
        if self.softcap is not None:
            z.div_(self.softcap).tanh_().mul_(self.softcap)
        return z

    @torch.inference_mode()
    def verify(self, model, device, rtol: float | None = None) -> bool:
        """Whether the split reproduces ``model(...).logits`` on a short probe: within ``rtol``
        of the largest logit (default 1e-4 for float32 weights; for 16-bit weights two units of
        their rounding, 2^-7, since the model soft-caps in 16 bits where the split uses float32)."""
        ids = torch.arange(1, 9, device=device).remainder(self.V)[None]
        mask = torch.ones_like(ids)
        ref = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
        got = torch.empty(8, self.V, dtype=torch.float32, device=device)
        self.logits(self.hidden(ids, mask).reshape(8, -1), got)
        if rtol is None:
            rtol = 1e-4 if self.head.weight.dtype == torch.float32 else 2.0 ** -7
        scale = float(ref.abs().max()) or 1.0
        return float((got.view_as(ref) - ref).abs().max()) <= rtol * scale + 1e-5


def block_rows(width: int) -> int:
    return max(1, BLOCK_BYTES // (4 * max(width, 1)))


def fill_from_hidden(split: SplitHead, kind: str, h_nTH: torch.Tensor, ids_nT: torch.Tensor,
                     out: dict, rows: slice, *, temperature: float, top_k: int = 0,
                     proj_VsVt=None) -> None:
    """The ``kind`` outputs of rows ``rows`` from their hidden states, block by block (module
    doc); same values as :func:`xdistill.teacher.outputs.fill_output` on the full logits."""
    n, T, H = h_nTH.shape
    N, V = n * T, split.V
    h_NH = h_nTH.reshape(N, H)
    if kind == "support":  # split restricted to the support (SplitHead.restrict); no token logp
        _fill_logits(split, h_NH, out["support_logits_BTtS"][rows].reshape(N, V), temperature)
        return
    tgt_N = torch.zeros(N, dtype=torch.int64, device=h_NH.device)
    tgt_N.view(n, T)[:, :-1] = ids_nT[:, 1:].clamp(0, V - 1)
    tok_N = torch.zeros(N, dtype=torch.float32, device=h_NH.device)
    dst_NV = out["logits_BTtV"][rows].reshape(N, V) if kind == "logits" else None
    step = min(block_rows(V), max(1, (N + 1) // 2))
    for a in range(0, N, step):
        b = min(a + step, N)
        # straight into the output rows when they are float32 on the model's device (a GPU
        # teacher writing into host buffers, shm or Ray transport, computes each block on its
        # device first; bfloat16 rows get the float32 block rounded once, after the soft-cap
        # and the token log-probs)
        direct = dst_NV is not None and _direct(dst_NV, h_NH, temperature)
        # float32 logits of the block (bfloat16 weights included), or the output rows themselves
        block = dst_NV[a:b] if direct else torch.empty(b - a, V, device=h_NH.device)
        zf = split.logits(h_NH[a:b], block).float()
        if temperature != 1.0:
            zf = zf / temperature
        if dst_NV is not None and not direct:
            dst_NV[a:b].copy_(zf)
        picked = zf.gather(1, tgt_N[a:b, None]).squeeze(1)
        tok_N[a:b] = (picked - torch.logsumexp(zf, dim=-1)).clamp(min=LOGP_TINY)
        if kind == "topk":
            v, i, tail = topk_logprobs(zf, top_k, 1.0)
            flat = lambda name, last: out[name][rows].reshape(N, *last)  # noqa: E731
            flat("topk_logp_BTtK", (v.shape[-1],))[a:b] = v
            flat("topk_idx_BTtK", (v.shape[-1],))[a:b] = i
            flat("tail_logmass_BTt", ())[a:b] = tail
        elif kind == "projected":
            lp = projected_logprobs(zf, proj_VsVt, 1.0)
            out["proj_logp_BTtVs"][rows].reshape(N, -1)[a:b] = lp
    if "token_logp_BTt" in out:
        tok = tok_N.view(n, T)
        res = torch.zeros(n, T, dtype=torch.float32, device=tok.device)
        res[:, 1:] = tok[:, :-1]
        out["token_logp_BTt"][rows].copy_(res)


def _direct(dst_NV: torch.Tensor, h_NH: torch.Tensor, temperature: float) -> bool:
    """Whether the head may write its logits straight into ``dst_NV`` (float32 rows on the
    model's device at T = 1; lower-precision rows are filled from a float32 block)."""
    return temperature == 1.0 and dst_NV.dtype == torch.float32 and dst_NV.device == h_NH.device


def _fill_logits(split: SplitHead, h_NH: torch.Tensor, dst_NV: torch.Tensor,
                 temperature: float) -> None:
    """``dst_NV = logits / temperature``, block by block (straight into ``dst_NV`` at T = 1)."""
    N, V = dst_NV.shape
    step = min(block_rows(V), max(1, (N + 1) // 2))
    for a in range(0, N, step):
        b = min(a + step, N)
        if _direct(dst_NV, h_NH, temperature):
            split.logits(h_NH[a:b], dst_NV[a:b])
        else:
            block = torch.empty(b - a, V, device=h_NH.device)
            z = split.logits(h_NH[a:b], block)
            dst_NV[a:b].copy_(z if temperature == 1.0 else z.div_(temperature))
