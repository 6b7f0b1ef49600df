"""A real local completions server for served-teacher tests (stdlib ``http.server`` in a thread).

Legend: L prompt tokens, V vocabulary, K top-k.

:class:`CompletionsServer` answers ``POST /v1/completions`` and ``GET /v1/models`` on 127.0.0.1
(port 0) with log-probs computed by a real Hugging Face model (float32, one row at a time), in the
layout vLLM 0.32's OpenAI server writes (``vllm/entrypoints/openai/completion/serving.py``):
``prompt_logprobs`` entries ``{"<id>": {"logprob", "rank", "decoded_token"}}`` listing the prompt
token first and then the top K (K + 1 entries when it is not among them), ``null`` at position 0;
``logprobs`` with ``tokens``, ``token_logprobs``, ``top_logprobs`` keyed by ``"token_id:<id>"``
(``return_tokens_as_token_ids``) or by ``tokenizer.decode([id])``; log-probs floored at -9999.

Faults for error tests, consumed one per request: ``server.faults = [("status", 500), ("sleep",
5.0), ("raw", b"not json"), ("key", "<<nope>>")]`` (``key`` renames one top-K entry of the
answer).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch


def save_word_tokenizer(folder, V: int) -> None:
    """A WordLevel tokenizer ``w0 .. w{V-1}`` (each id decodes to its own text) in ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(V)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0").save_pretrained(str(folder))


class CompletionsServer:
    """See module doc. ``requests`` counts the completions requests received."""

    def __init__(self, model_folder: str, name: str = "tiny", max_logprobs: int = 20):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(model_folder,
                                                          dtype=torch.float32).eval()
        try:
            self.tok = AutoTokenizer.from_pretrained(model_folder)
        except Exception:
            self.tok = None
        self.name, self.max_logprobs = name, max_logprobs
        self.faults: list[tuple] = []
        self.requests = 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- answers ------------------------------------------------------------------------------
    def logprobs_LV(self, ids: list[int]) -> torch.Tensor:
        """log_softmax of the model at every position of ``ids`` plus nothing else, [L, V]."""
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([ids])).logits[0].float()
        return torch.log_softmax(logits, dim=-1)

    def _key(self, tid: int, as_ids: bool) -> str:
        return f"token_id:{tid}" if as_ids else self.tok.decode([tid])

    def _entry(self, lp_V: torch.Tensor, actual: int, k: int) -> dict[int, float]:
        """vLLM's per-position dict: the actual token first, then the top k (by rank)."""
        vals, idx = torch.topk(lp_V, k)
        out = {int(actual): max(float(lp_V[actual]), -9999.0)}
        for v, i in zip(vals.tolist(), idx.tolist()):
            out.setdefault(int(i), max(float(v), -9999.0))
        return out

    def complete(self, req: dict) -> dict:
        ids, k = req["prompt"], int(req.get("logprobs") or 0)
        plp_k = req.get("prompt_logprobs")
        if max(k, plp_k or 0) > self.max_logprobs:
            raise ValueError(f"Requested sample logprobs of {max(k, plp_k or 0)}, which is "
                             f"greater than max allowed: {self.max_logprobs}")
        as_ids = bool(req.get("return_tokens_as_token_ids"))
        lp_LV = self.logprobs_LV(ids)
        gen = int(lp_LV[-1].argmax())
        entries = [None] + [self._entry(lp_LV[i - 1], ids[i], k) for i in range(1, len(ids))]
        gen_entry = self._entry(lp_LV[-1], gen, k)
        choice = {"index": 0, "text": "", "finish_reason": "length"}
        if plp_k is not None:
            choice["prompt_logprobs"] = [
                None if e is None else {str(t): {"logprob": v, "rank": r + 1, "decoded_token": ""}
                                        for r, (t, v) in enumerate(e.items())}
                for e in [self._entry(lp_LV[i - 1], ids[i], plp_k) if i else None
                          for i in range(len(ids))]]
        toks = (ids + [gen]) if req.get("echo") else [gen]
        tops = (entries + [gen_entry]) if req.get("echo") else [gen_entry]
        choice["logprobs"] = {
            "tokens": [self._key(t, as_ids) for t in toks],
            "token_logprobs": [None if e is None else e[t] for t, e in zip(toks, tops)],
            "top_logprobs": [None if e is None else {self._key(t, as_ids): v for t, v in e.items()}
                             for e in tops],
            "text_offset": list(range(len(toks)))}
        return {"id": "cmpl-test", "object": "text_completion", "model": self.name,
                "choices": [choice]}

    # -- HTTP ---------------------------------------------------------------------------------
    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, raw: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, json.dumps({"object": "list", "data": [
                        {"id": server.name, "object": "model"}]}).encode())
                else:
                    self._send(404, b'{"detail": "Not Found"}')

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests += 1
                    fault = server.faults.pop(0) if server.faults else None
                if fault and fault[0] == "status":
                    msg = {"error": {"message": f"injected HTTP {fault[1]}", "code": fault[1]}}
                    return self._send(fault[1], json.dumps(msg).encode())
                if fault and fault[0] == "sleep":
                    time.sleep(fault[1])
                if fault and fault[0] == "raw":
                    return self._send(200, fault[1])
                try:
                    answer = server.complete(body)
                except ValueError as exc:
                    msg = {"error": {"message": str(exc), "type": "BadRequestError", "code": 400}}
                    return self._send(400, json.dumps(msg).encode())
                if fault and fault[0] == "key":
                    top = answer["choices"][0]["logprobs"]["top_logprobs"]
                    first = next(iter(top[-1]))
                    top[-1][fault[1]] = top[-1].pop(first)
                try:
                    self._send(200, json.dumps(answer).encode())
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                    pass

        return Handler
