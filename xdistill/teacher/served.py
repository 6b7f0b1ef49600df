"""A served teacher: top-K log-probs of the teacher's own tokens from an OpenAI-compatible server.

Legend: B batch, Tt teacher tokens, L real tokens of a row, K top-k, V teacher vocabulary width.

:class:`ServedTeacher` has the engine contract of :class:`~xdistill.teacher.worker.TeacherWorker`
(``info``, ``output_spec``, ``run_into``) and writes the same ``output: topk`` tensors, so the same
top-k losses read it. It sends one completions request per row (``served.concurrency`` rows at a
time), the row's real tokens as token ids, and reads the answer as described in
:mod:`xdistill.teacher.served_answers` (request forms ``vllm`` and ``echo``). The model's weights
are never loaded here: ``model`` names the local folder of the served model, whose config.json
gives the vocabulary width and whose tokenizer maps token strings when the server sends no ids.

Rows are right-padded (a row's real tokens come first). Padding positions, which an in-process
teacher fills with numbers that mean nothing, get a fixed, finite placeholder: a point mass on id
0 (``topk_logp`` = ``[0, LOGP_TINY, ...]``, ``topk_idx`` = 0, tail and ``token_logp`` at
``LOGP_TINY`` and 0); mask them, as with any teacher. A row with no real token sends no request.

At start the server is asked for its models (``<url>/models``), waiting up to
``startup_timeout_s`` for it to come up; ``served.model`` must be among them ("" takes the first).
Every failure is one :class:`~xdistill.errors.TeacherError` naming the teacher, the URL, the row
and what was expected (see :mod:`xdistill.teacher.http` for retries).
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from xdistill.errors import TeacherError
from xdistill.log import get_logger
from xdistill.student.model import resolve_model_path
from xdistill.teacher.config import TeacherConfig
from xdistill.teacher.http import HttpFailure, request_json
from xdistill.teacher.outputs import LOGP_TINY, output_spec
from xdistill.teacher.served_answers import (PARSERS, AnswerError, RowTopK, TokenMap,
                                             completion_body)
from xdistill.teacher.worker import TeacherInfo, TeacherRequest

log = get_logger("teacher")
_POLL_S = 1.0


def model_vocab_width(model: str, where: str) -> int:
    """The logit width (``vocab_size`` of config.json) of the local model folder ``model``."""
    path = resolve_model_path(model) if model else None
    cfg = path / "config.json" if path is not None else None
    if cfg is None or not cfg.is_file():
        raise TeacherError(f"{where}: model {model!r} must be the local folder of the served "
                           "model (its config.json gives the vocabulary width)")
    data = json.loads(cfg.read_text())
    V = data.get("vocab_size") or (data.get("text_config") or {}).get("vocab_size")
    if not isinstance(V, int) or V < 1:
        raise TeacherError(f"{where}: {cfg} has no vocab_size")
    return V


def _load_hf_tokenizer(model: str):
    # deferred: transformers (slow import; only a served teacher's tokenizer needs it)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(resolve_model_path(model)))


class ServedTeacher:
    """Engine of a ``placement: served`` teacher (module doc)."""

    def __init__(self, config: TeacherConfig, projection_VsVt=None):
        self.config = config.validate()
        s = config.served
        self.where = f"teacher {config.name!r} (served at {s.url})"
        if config.placement != "served":
            raise TeacherError(f"{self.where}: placement must be 'served'")
        self.url = s.url.rstrip("/")
        self.vocab_size = model_vocab_width(config.model, self.where)
        self.headers = self._headers()
        self.tokens = TokenMap(lambda: _load_hf_tokenizer(config.model))
        self.model_name = self._wait_for_model()
        self.info = TeacherInfo(
            name=config.name, kind="topk", vocab_size=self.vocab_size, student_vocab_size=0,
            top_k=min(config.top_k, self.vocab_size), temperature=1.0, device="cpu",
            logits_dtype=torch.float32, pid=os.getpid())
        self._pool = ThreadPoolExecutor(s.concurrency, thread_name_prefix=f"served-{config.name}")

    def _headers(self) -> dict:
        env = self.config.served.api_key_env
        if not env:
            return {}
        key = os.environ.get(env)
        if not key:
            raise TeacherError(f"{self.where}: served.api_key_env names ${env}, which is not set")
        return {"Authorization": f"Bearer {key}"}

    def _get_models(self, timeout_s: float) -> dict:
        return request_json(f"{self.url}/models", timeout_s=timeout_s, headers=self.headers)

    def _wait_for_model(self) -> str:
        """Poll ``<url>/models`` until the server answers (``startup_timeout_s``); the model."""
        s, limit = self.config.served, self.config.startup_timeout_s
        deadline = time.monotonic() + limit
        while True:
            left = deadline - time.monotonic()
            try:
                body = self._get_models(max(0.1, min(s.timeout_s, left)))
                break
            except HttpFailure as exc:
                if exc.status == 404 and s.model:  # a server without /models
                    log.warning("%s: %s; using served.model %r unchecked", self.where, exc,
                                s.model)
                    return s.model
                if not exc.transient or left <= _POLL_S:
                    wait = f" (waited {limit:g} s: startup_timeout_s)" if exc.transient else ""
                    raise TeacherError(f"{self.where}: the server did not answer its model "
                                       f"list{wait}: {exc}") from None
                time.sleep(_POLL_S)
        data = body.get("data") if isinstance(body, dict) else None
        names = [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)] \
            if isinstance(data, list) else []
        if not names or len(names) != len(data):
            raise TeacherError(f"{self.where}: {self.url}/models: expected "
                               f"{{'data': [{{'id': ...}}, ...]}}, got {str(body)[:200]!r}")
        if not s.model:
            return names[0]
        if s.model not in names:
            raise TeacherError(f"{self.where}: served.model {s.model!r} is not served there "
                               f"(the server has {names})")
        return s.model

    def output_spec(self, B: int, Tt: int) -> dict:
        return output_spec("topk", B, Tt, self.vocab_size, top_k=self.info.top_k)

    def _lengths(self, ids_BTt: torch.Tensor, mask_BTt: torch.Tensor) -> list[int]:
        """Real tokens per row; the mask must be a prefix (right padding), ids in [0, V)."""
        if ids_BTt.dim() != 2 or ids_BTt.shape != mask_BTt.shape:
            raise TeacherError(f"{self.where}: input_ids {tuple(ids_BTt.shape)} and "
                               f"attention_mask {tuple(mask_BTt.shape)} must both be [B, Tt]")
        m = mask_BTt.bool()
        lengths = m.sum(dim=1)
        prefix = torch.arange(m.shape[1])[None, :] < lengths[:, None]
        if not torch.equal(prefix, m):
            b = int((prefix != m).any(dim=1).nonzero()[0])
            raise TeacherError(f"{self.where}: row {b}'s attention mask is not a prefix (a "
                               "served teacher needs right-padded rows)")
        bad = (ids_BTt < 0) | (ids_BTt >= self.vocab_size)
        if bool((bad & m).any()):
            b, t = (int(x) for x in (bad & m).nonzero()[0])
            raise TeacherError(f"{self.where}: token id {int(ids_BTt[b, t])} at row {b}, "
                               f"position {t} is outside the teacher vocabulary "
                               f"[0, {self.vocab_size})")
        return [int(n) for n in lengths]

    def _fetch_row(self, step: int, b: int, ids_L: list[int]) -> RowTopK:
        s, K = self.config.served, self.info.top_k
        body = completion_body(s.protocol, self.model_name, ids_L, K, s.token_ids)
        what = (f"{self.where}, request {step} row {b} ({len(ids_L)} tokens, top-{K} "
                f"{s.protocol} log-probs)")
        try:
            answer = request_json(f"{self.url}/completions", body, timeout_s=s.timeout_s,
                                  retries=s.retries, headers=self.headers)
            return PARSERS[s.protocol](answer, ids_L, K, self.vocab_size, self.tokens)
        except HttpFailure as exc:
            raise TeacherError(f"{what}: {exc}") from None
        except AnswerError as exc:
            raise TeacherError(f"{what}: unusable answer from {self.url}/completions: "
                               f"{exc}") from None

    def run_into(self, request: TeacherRequest, out: dict[str, torch.Tensor]) -> None:
        """Fill ``out`` (the ``output_spec`` tensors) for ``request``: one request per row."""
        ids_BTt = request.input_ids_BTt
        lengths = self._lengths(ids_BTt, request.attention_mask_BTt)
        fill_padding(out)
        rows = [b for b, n in enumerate(lengths) if n > 0]
        futures = {b: self._pool.submit(self._fetch_row, request.step, b,
                                        ids_BTt[b, :lengths[b]].tolist()) for b in rows}
        try:
            for b in rows:
                write_row(out, b, futures[b].result())
        finally:
            for f in futures.values():
                f.cancel()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def fill_padding(out: dict[str, torch.Tensor]) -> None:
    """The placeholder of padding positions (module doc) everywhere; rows overwrite it."""
    out["topk_logp_BTtK"].fill_(LOGP_TINY)
    out["topk_logp_BTtK"][..., 0] = 0.0
    out["topk_idx_BTtK"].zero_()
    out["tail_logmass_BTt"].fill_(LOGP_TINY)
    out["token_logp_BTt"].zero_()


def write_row(out: dict[str, torch.Tensor], b: int, row: RowTopK) -> None:
    L = row.topk_logp_LK.shape[0]
    out["topk_logp_BTtK"][b, :L] = torch.from_numpy(row.topk_logp_LK)
    out["topk_idx_BTtK"][b, :L] = torch.from_numpy(row.topk_idx_LK)
    out["tail_logmass_BTt"][b, :L] = torch.from_numpy(row.tail_logmass_L)
    out["token_logp_BTt"][b, :L] = torch.from_numpy(row.token_logp_L)


__all__ = ["ServedTeacher", "model_vocab_width", "fill_padding", "write_row"]
