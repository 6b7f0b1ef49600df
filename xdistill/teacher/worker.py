"""The teacher engine: a Hugging Face causal LM that scores batches in micro-batches.

Legend: B batch, Tt teacher tokens, V teacher logit width, Vs student vocabulary, K top-k.

:class:`TeacherWorker` is placement-agnostic: the same object runs in the training process, in a
spawned subprocess or inside a Ray actor (see ``placement.py``). Its contract, which test engines
also implement, is three members:

* ``info`` -> :class:`TeacherInfo` (what it produces),
* ``output_spec(B, Tt)`` -> ``{field: (shape, dtype)}`` of the output tensors,
* ``run_into(request, out)``: fill the preallocated tensors ``out`` (possibly views into a shared
  memory or CUDA IPC slot) for one :class:`TeacherRequest`, micro-batch by micro-batch, so no
  extra full-size copy is made in the worker.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from xdistill.errors import TeacherError
from xdistill.log import get_logger
from xdistill.precision import resolve_compute_dtype
from xdistill.student.model import load_causal_lm, max_positions, resolve_model_path
from xdistill.teacher.cache import OutputCache, contiguous_runs, row_keys
from xdistill.teacher.config import TeacherConfig
from xdistill.teacher.head import SplitHead, fill_from_hidden
from xdistill.teacher.outputs import (TeacherOutput, fill_output, output_spec,
                                      projection_on_device, support_columns)

log = get_logger("teacher")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class TeacherRequest:
    """What travels to a worker per batch: the teacher's token ids and mask (small)."""

    # request number (echoed in the output)
    step: int
    # teacher token ids, right-padded, int64 [B, Tt]
    input_ids_BTt: torch.Tensor
    # True on real tokens, [B, Tt]
    attention_mask_BTt: torch.Tensor

    @classmethod
    def from_view(cls, step: int, view) -> "TeacherRequest":
        return cls(step, view.input_ids_BTt.detach().cpu().long(),
                   view.attention_mask_BTt.detach().cpu())


@dataclass(frozen=True)
class TeacherInfo:
    """What a started teacher produces and where it runs."""

    name: str
    kind: str
    # width of the teacher's logits (>= its tokenizer's vocabulary when embeddings are padded)
    vocab_size: int
    # student vocabulary of projected outputs (0 otherwise)
    student_vocab_size: int
    top_k: int
    temperature: float
    # the worker's torch device, e.g. "cpu" or "cuda:0"
    device: str
    logits_dtype: torch.dtype
    # process id of the worker
    pid: int
    # columns of "support" outputs: the projection's support size S (0 otherwise)
    support_size: int = 0


def resolve_dtype(name: str, default: torch.dtype | None = None) -> torch.dtype | str:
    if name == "auto":
        return default if default is not None else "auto"
    return _DTYPES[name]


def weights_dtype(config: TeacherConfig) -> torch.dtype:
    """The teacher's weights dtype on its device: ``dtype: auto`` resolved (and logged once) by
    :func:`xdistill.precision.resolve_compute_dtype`, an explicit dtype as written."""
    return resolve_compute_dtype(config.dtype, config.device, f"teacher {config.name!r}")


class TeacherWorker:
    """Loads ``config.model`` and computes :class:`TeacherOutput` s (see module doc)."""

    def __init__(self, config: TeacherConfig, projection_VsVt: torch.Tensor | None = None):
        self.config = config.validate()
        path = resolve_model_path(config.model) if config.model else None
        if path is None or not (path.is_dir() or (path.suffix.lower() == ".gguf" and path.is_file())):
            state = "is not a model" if path is not None and path.exists() else "does not exist"
            raise TeacherError(f"teacher {config.name!r}: model {config.model!r} {state} (a "
                               "local Hugging Face folder, a .gguf file or a model asset name is "
                               "expected)")
        if config.output in ("projected", "support") and projection_VsVt is None:
            raise TeacherError(f"teacher {config.name!r}: output {config.output!r} needs a "
                               "projection")
        self.device = torch.device(config.device)
        self._home = torch.device("cpu") if config.offload else self.device
        self.model = load_causal_lm(path, dtype=weights_dtype(config),
                                    attn_implementation=config.attn_implementation,
                                    trust_remote_code=config.trust_remote_code)
        self.model.eval().requires_grad_(False).to(self._home)
        head = self.model.get_output_embeddings()
        V = int(head.weight.shape[0]) if head is not None else \
            int(self.model.config.get_text_config().vocab_size)
        self.vocab_size = V

        self.max_positions = max_positions(self.model)
        self.proj_VsVt = None
        Vs = 0
        if config.output == "projected":
            self.proj_VsVt = projection_on_device(projection_VsVt, self.device)
            Vs = int(self.proj_VsVt.shape[0])
        self.support_S = None
        if config.output == "support":
            try:
                self.support_S = support_columns(projection_VsVt, V).to(self.device)
            except ValueError as e:
                raise TeacherError(f"teacher {config.name!r}: {e}") from None
        self.split = self._split_head()
        if self.split is not None and self.support_S is not None:
            self.split = self.split.restrict(self.support_S)
        self.cache = OutputCache(config.cache_mb, config.name) if config.cache_mb > 0 else None
        self.info = TeacherInfo(
            name=config.name, kind=config.output, vocab_size=V, student_vocab_size=Vs,
            top_k=min(config.top_k, V) if config.output == "topk" else 0,
            temperature=float(config.temperature), device=str(self.device),
            logits_dtype=resolve_dtype(config.logits_dtype, torch.float32), pid=os.getpid(),
            support_size=0 if self.support_S is None else int(self.support_S.numel()))

    def _split_head(self):
        """:class:`SplitHead` when it reproduces this model's logits (outputs are then written
        block by block from hidden states, with no full-size logits copy), else None."""
        split = SplitHead.of(self.model)
        if split is None or split.V != self.vocab_size:
            return None
        self.model.to(self.device)
        try:
            return split if split.verify(self.model, self.device) else None
        finally:
            self.model.to(self._home)

    def output_spec(self, B: int, Tt: int) -> dict:
        i = self.info
        return output_spec(i.kind, B, Tt, i.vocab_size, top_k=i.top_k, Vs=i.student_vocab_size,
                           S=i.support_size,
                           logits_dtype=i.logits_dtype)

    def _check_ids(self, ids_BTt: torch.Tensor, mask_BTt: torch.Tensor) -> None:
        if ids_BTt.dim() != 2 or ids_BTt.shape != mask_BTt.shape:
            raise TeacherError(f"teacher {self.info.name!r}: input_ids {tuple(ids_BTt.shape)} and "
                               f"attention_mask {tuple(mask_BTt.shape)} must both be [B, Tt]")
        limit = self.max_positions
        if limit is not None and ids_BTt.shape[1] > limit:
            raise TeacherError(f"teacher {self.info.name!r}: {ids_BTt.shape[1]} tokens per "
                               f"sequence exceed the model's {limit} positions (shorten "
                               "data.seq_len or the rollout)")
        bad = (ids_BTt < 0) | (ids_BTt >= self.vocab_size)
        if bool(bad.any()):
            b, t = (int(x) for x in bad.nonzero()[0])
            raise TeacherError(
                f"teacher {self.info.name!r}: token id {int(ids_BTt[b, t])} at row {b}, position "
                f"{t} is outside the teacher vocabulary [0, {self.vocab_size})")

    def run_into(self, request: TeacherRequest, out: dict[str, torch.Tensor]) -> None:
        """Forward ``request`` micro-batch by micro-batch, writing the outputs into ``out``
        (rows found in the output cache are copied instead, see :mod:`xdistill.teacher.cache`)."""
        ids_BTt, mask_BTt = request.input_ids_BTt, request.attention_mask_BTt
        self._check_ids(ids_BTt, mask_BTt)
        B = ids_BTt.shape[0]
        if self.cache is None:
            self._forward_rows(ids_BTt, mask_BTt, out, [slice(0, B)])
            return
        keys = row_keys(ids_BTt, mask_BTt)
        found = self.cache.lookup(keys)
        todo = [b for b in range(B) if not found[b]]
        self._forward_rows(ids_BTt, mask_BTt, out, contiguous_runs(todo))
        for b in range(B):
            if found[b]:
                self.cache.fill(out, b, keys[b])
            else:
                self.cache.store(out, b, keys[b])

    def _forward_rows(self, ids_BTt, mask_BTt, out, runs: list[slice]) -> None:
        """The teacher on the rows of ``runs`` (each cut into micro-batches), into ``out``."""
        cfg = self.config
        if not runs:
            return
        if cfg.offload:
            self.model.to(self.device)
        try:
            with torch.inference_mode():
                for run in runs:
                    for a in range(run.start, run.stop, cfg.micro_batch_size):
                        self._forward_micro(ids_BTt, mask_BTt, out,
                                            slice(a, min(a + cfg.micro_batch_size, run.stop)))
        finally:
            if cfg.offload:
                self.model.to(self._home)

    def _forward_micro(self, ids_BTt, mask_BTt, out, rows: slice) -> None:
        cfg = self.config
        ids = ids_BTt[rows].to(self.device, non_blocking=True)
        mask = mask_BTt[rows].to(self.device, non_blocking=True).long()
        if self.split is not None:
            fill_from_hidden(self.split, self.info.kind, self.split.hidden(ids, mask), ids, out,
                             rows, temperature=cfg.temperature, top_k=self.info.top_k,
                             proj_VsVt=self.proj_VsVt)
            return
        logits = self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        fill_output(self.info.kind, logits, out, rows, temperature=cfg.temperature,
                    top_k=self.info.top_k, proj_VsVt=self.proj_VsVt, ids_nT=ids,
                    support_S=self.support_S)

    def forward(self, request: TeacherRequest, device=None) -> TeacherOutput:
        """Run ``request`` into freshly allocated tensors (in-process use)."""
        B, Tt = request.input_ids_BTt.shape
        dev = self.device if device is None else device
        out = {n: torch.empty(shape, dtype=dt, device=dev)
               for n, (shape, dt) in self.output_spec(B, Tt).items()}
        self.run_into(request, out)
        return make_output(self.info, request.step, out)

    def close(self) -> None:
        if self.cache is not None and (self.cache.hits or self.cache.misses):
            log.info(self.cache.summary())
        self.model = None


def make_output(info: TeacherInfo, step: int, tensors: dict[str, torch.Tensor]) -> TeacherOutput:
    return TeacherOutput(name=info.name, kind=info.kind, temperature=info.temperature, step=step,
                         **tensors)
