"""Requests to and answers from a completions server, as one row's top-K log-probs.

Legend: L real tokens of the row, K top-k.

A row's ``L`` teacher token ids ``ids_L`` go to the server as the prompt (token ids, never text).
Its answer is read into the same numbers an in-process ``output: topk`` teacher writes for that
row (:mod:`xdistill.teacher.outputs`): at position ``j`` the top-K of the distribution that follows
``ids[:j+1]`` (``topk_logp_LK`` descending, ``topk_idx_LK``), the tail ``log(1 - sum exp)`` and
``token_logp_L[j] = log q(ids[j] | ids[<j])`` (0 at ``j = 0``).

Two request forms (``served.protocol``), both with ``max_tokens: 1`` and greedy decoding, so the
one generated token's top-K gives the last position ``L - 1``:

* ``vllm``: ``prompt_logprobs: K`` and ``logprobs: K``. ``choices[0].prompt_logprobs`` holds ``L``
  entries, ``null`` first, then ``{"<id>": {"logprob": x, ...}}`` for the distribution *before*
  prompt token ``i`` (it lists the prompt token itself besides the top K): position ``j < L-1``
  reads entry ``j + 1``; ``choices[0].logprobs.top_logprobs[0]`` is position ``L - 1``.
* ``echo``: ``echo: true, logprobs: K`` (the standard OpenAI form). ``choices[0].logprobs`` holds
  ``L + 1`` entries (prompt, then the generated token), ``null`` first: position ``j`` reads
  ``top_logprobs[j + 1]``, ``token_logprobs[j]`` is the prompt token's own log-prob. Keys are token
  strings: ``"token_id:<id>"`` when the server honours ``return_tokens_as_token_ids`` (vLLM does),
  else the token's text, mapped to an id through the teacher's tokenizer (:class:`TokenMap`).

The tail mass is ``log(1 - sum_k exp(topk_logp))`` computed in float64 from the K values the
server sent (an in-process teacher sums the log-probs outside the top K instead); a sum at or above
1 (rounding) floors it at :data:`~xdistill.teacher.outputs.LOGP_TINY`, like every log-prob here.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass

import numpy as np

from xdistill.teacher.outputs import LOGP_TINY

_ID_PREFIX = "token_id:"


class AnswerError(Exception):
    """An answer that lacks what the request asked for (the message says what was expected)."""


@dataclass(frozen=True)
class RowTopK:
    """One row's top-K outputs (numpy, ready to copy into the batch tensors)."""

    # float32 [L, K], descending per position
    topk_logp_LK: np.ndarray
    # int64 [L, K]
    topk_idx_LK: np.ndarray
    # float32 [L]
    tail_logmass_L: np.ndarray
    # float32 [L], 0 at position 0
    token_logp_L: np.ndarray


def completion_body(protocol: str, model: str, ids_L: list[int], k: int,
                    token_ids: bool) -> dict:
    """The JSON request of one row."""
    body = {"model": model, "prompt": ids_L, "max_tokens": 1, "temperature": 0.0,
            "logprobs": k}
    if protocol == "vllm":
        body["prompt_logprobs"] = k
    else:
        body["echo"] = True
    if token_ids:
        body["return_tokens_as_token_ids"] = True
    return body


class TokenMap:
    """Token strings of an OpenAI answer -> teacher ids: ``"token_id:<id>"``, else the text exactly
    one id stands for, else a vocabulary piece (``Ġthe``) that is no id's text.

    The text of an id is what vLLM sends without ``return_tokens_as_token_ids``: ``decode([id])``,
    with the leading spaces ``decode`` strips put back for a tokenizer whose pre-tokenizer is
    Metaspace (SentencePiece: ``▁cat`` is sent as ``" cat"``); when that text names no id, plain
    ``decode([id])`` (what other servers send). A text several ids stand for is an error, never a
    guess (Phi-3's ``▁the`` and ``the`` both decode to ``"the"``). The decoded text comes before
    the piece: a byte-level piece such as ``é`` (one byte, 0xE9) is also the decoded text of
    another id. The tokenizer is loaded on first need, once, whichever of the server's row
    threads needs it first."""

    def __init__(self, load_tokenizer):
        self._load = load_tokenizer
        self._lock = threading.Lock()
        self._tables_built: tuple[dict[str, int], ...] | None = None

    def _tables(self) -> tuple[dict[str, int], ...]:
        """(pieces: piece -> id, then text tables: text -> id, or -1 when several ids have it:
        the restored-space texts when the tokenizer has a Metaspace marker, the plain ones)."""
        with self._lock:
            if self._tables_built is None:
                tok = self._load()
                marker = _leading_space_marker(tok)
                plain: dict[str, int] = {}
                spaced: dict[str, int] = {}
                for i in range(len(tok)):
                    text = tok.decode([i]) or ""
                    plain[text] = -1 if text in plain else i
                    if marker is not None:
                        text = _restore_spaces(tok.convert_ids_to_tokens(i) or "", text, marker)
                        spaced[text] = -1 if text in spaced else i
                tables = (spaced, plain) if marker is not None else (plain,)
                self._tables_built = (dict(tok.get_vocab()), *tables)
            return self._tables_built

    def __call__(self, key: str) -> int:
        if key.startswith(_ID_PREFIX):
            try:
                return int(key[len(_ID_PREFIX):])
            except ValueError:
                raise AnswerError(f"token key {key!r} has no integer id") from None
        pieces, *texts = self._tables_built or self._tables()
        found = next((t[key] for t in texts if key in t), None)
        if found is None and key in pieces:
            return pieces[key]
        if found is None:
            raise AnswerError(f"token {key!r} is neither a vocabulary entry of the teacher's "
                              "tokenizer nor the text of one of its ids (set served.token_ids: "
                              "true on a server that returns ids)")
        if found < 0:
            raise AnswerError(f"token {key!r} is the text of several ids of the teacher's "
                              "tokenizer, so its id is ambiguous (set served.token_ids: true on "
                              "a server that returns ids)")
        return found


def _leading_space_marker(tok) -> str | None:
    """The Metaspace replacement character of ``tok``'s pre-tokenizer (``▁``), else None."""
    backend = getattr(tok, "backend_tokenizer", None)
    try:
        pre = json.loads(backend.to_str()).get("pre_tokenizer") or {} if backend else {}
    except ValueError:
        return None
    for sub in [pre, *(pre.get("pretokenizers") or [])]:
        if isinstance(sub, dict) and sub.get("type") == "Metaspace":
            return sub.get("replacement", "\u2581")
    return None


def _restore_spaces(piece: str, text: str, marker: str) -> str:
    """``text`` with one space per leading ``marker`` of ``piece`` that it lacks."""
    want = len(piece) - len(piece.lstrip(marker))
    have = len(text) - len(text.lstrip(" "))
    return " " * (want - have) + text if want > have else text


def _choice(body) -> dict:
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list) \
            or not body["choices"] or not isinstance(body["choices"][0], dict):
        raise AnswerError("expected a JSON object with a non-empty 'choices' list, got "
                          f"{str(body)[:200]!r}")
    return body["choices"][0]


def _value(v, where: str) -> float:
    x = v.get("logprob") if isinstance(v, dict) else v
    if not isinstance(x, (int, float)) or isinstance(x, bool) or math.isnan(x):
        raise AnswerError(f"{where}: expected a number (or {{'logprob': number}}), got {v!r}")
    return max(float(x), LOGP_TINY)


def _top(entry, k: int, key_to_id, where: str, V: int) -> tuple[list[float], list[int]]:
    """The K largest of one position's ``{token: logprob}`` (the prompt token may be extra)."""
    if not isinstance(entry, dict) or len(entry) < k:
        n = len(entry) if isinstance(entry, dict) else type(entry).__name__
        raise AnswerError(f"{where}: expected at least {k} log-probs, got {n}")
    pairs = []
    for key, v in entry.items():
        try:
            tid = key_to_id(key)
        except AnswerError as exc:
            raise AnswerError(f"{where}: {exc}") from None
        if not 0 <= tid < V:
            raise AnswerError(f"{where}: token id {tid} is outside the teacher vocabulary "
                              f"[0, {V})")
        pairs.append((_value(v, where), tid))
    pairs.sort(key=lambda p: -p[0])
    return [p[0] for p in pairs[:k]], [p[1] for p in pairs[:k]]


def _row(dists: list, token_lp: list[float], k: int, keys: list, V: int,
         names: list[str]) -> RowTopK:
    """``keys[j]``: the key -> id function of position ``j``'s entry."""
    L = len(dists)
    logp_LK = np.empty((L, k), dtype=np.float64)
    idx_LK = np.empty((L, k), dtype=np.int64)
    for j, entry in enumerate(dists):
        logp_LK[j], idx_LK[j] = _top(entry, k, keys[j], names[j], V)
    top = logp_LK.max(axis=1, keepdims=True)
    lse_L = (top + np.log(np.exp(logp_LK - top).sum(axis=1, keepdims=True)))[:, 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        tail_L = np.where(lse_L < 0, np.log(-np.expm1(np.minimum(lse_L, 0))), LOGP_TINY)
    tail_L = np.maximum(np.nan_to_num(tail_L, nan=LOGP_TINY), LOGP_TINY)
    return RowTopK(logp_LK.astype(np.float32), idx_LK, tail_L.astype(np.float32),
                   np.asarray(token_lp, dtype=np.float32))


def parse_vllm(body, ids_L: list[int], k: int, V: int, key_to_id) -> RowTopK:
    """A ``protocol: vllm`` answer (module doc)."""
    c, L = _choice(body), len(ids_L)
    plp = c.get("prompt_logprobs")
    if not isinstance(plp, list) or len(plp) != L:
        n = len(plp) if isinstance(plp, list) else repr(plp)[:80]
        raise AnswerError(f"expected 'prompt_logprobs' with one entry per prompt token ({L}), "
                          f"got {n} (is the server vLLM? otherwise use served.protocol: echo)")
    gen = (c.get("logprobs") or {}).get("top_logprobs") if isinstance(c.get("logprobs"),
                                                                      dict) else None
    if not isinstance(gen, list) or not gen:
        raise AnswerError("expected 'logprobs.top_logprobs' of the generated token (the last "
                          "position's top-K)")
    token_lp = [0.0]
    for j in range(1, L):
        entry = plp[j]
        if not isinstance(entry, dict) or str(ids_L[j]) not in entry:
            raise AnswerError(f"prompt_logprobs[{j}]: expected the log-prob of prompt token "
                              f"{ids_L[j]}")
        token_lp.append(_value(entry[str(ids_L[j])], f"prompt_logprobs[{j}]"))
    names = [f"prompt_logprobs[{j + 1}]" for j in range(L - 1)] + ["logprobs.top_logprobs[0]"]
    # prompt_logprobs are keyed by id ("8" is id 8); the generated token's top_logprobs by token
    # string like the echo form ("8" is the text of the digit's id)
    keys = [_int_key(key_to_id)] * (L - 1) + [key_to_id]
    return _row(plp[1:] + gen[:1], token_lp, k, keys, V, names)


def _int_key(key_to_id):
    def convert(key: str) -> int:
        return int(key) if key.lstrip("-").isdigit() else key_to_id(key)
    return convert


def parse_echo(body, ids_L: list[int], k: int, V: int, key_to_id) -> RowTopK:
    """A ``protocol: echo`` answer (module doc)."""
    c, L = _choice(body), len(ids_L)
    lp = c.get("logprobs")
    top = lp.get("top_logprobs") if isinstance(lp, dict) else None
    tok_lp = lp.get("token_logprobs") if isinstance(lp, dict) else None
    if not isinstance(top, list) or not isinstance(tok_lp, list) or len(top) < L + 1 \
            or len(tok_lp) < L:
        n = len(top) if isinstance(top, list) else repr(top)[:80]
        raise AnswerError(f"expected 'logprobs.top_logprobs' with the echoed prompt and one "
                          f"generated token ({L + 1} entries), got {n} (does the server "
                          "support echo with logprobs?)")
    tokens = lp.get("tokens")
    if isinstance(tokens, list) and len(tokens) >= L:
        for j in range(L):  # the server must have read our ids, not re-tokenized text
            t = tokens[j]
            if isinstance(t, str) and t.startswith(_ID_PREFIX) and key_to_id(t) != ids_L[j]:
                raise AnswerError(f"logprobs.tokens[{j}] is {t!r}, but the prompt token there "
                                  f"is {ids_L[j]}")
    token_lp = [0.0] + [_value(tok_lp[j], f"logprobs.token_logprobs[{j}]") for j in range(1, L)]
    names = [f"logprobs.top_logprobs[{j + 1}]" for j in range(L)]
    return _row(top[1:L + 1], token_lp, k, [key_to_id] * L, V, names)


PARSERS = {"vllm": parse_vllm, "echo": parse_echo}

__all__ = ["AnswerError", "RowTopK", "TokenMap", "completion_body", "parse_vllm", "parse_echo",
           "PARSERS"]
