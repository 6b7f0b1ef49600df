"""The served teacher (placement: served) against a real local completions server that computes
its log-probs with a real tiny model: the same top-K as the in-process teacher of that model, in
both request forms, and one clear TeacherError for each way a server fails.

Legend: B batch, Tt teacher tokens, K top-k.
"""

from __future__ import annotations

import dataclasses
import socket

import pytest
import torch

from served_fakes import CompletionsServer, save_word_tokenizer
from teacher_fakes import random_batch, save_tiny_model
from xdistill.config import from_dict
from xdistill.errors import ConfigError, TeacherError
from xdistill.teacher import TeacherConfig, TeacherPool, TeacherRequest, TeacherWorker
from xdistill.teacher.client import ServedClient, make_client
from xdistill.teacher.outputs import LOGP_TINY

V, K = 1000, 5
# the server runs the same float32 model one row at a time, the in-process teacher the padded
# batch: the same numbers up to float32 rounding (measured max |diff|: top-K log-probs 0, token
# log-probs 9.5e-7, tail 3.8e-7, the tail being recomputed from the K values in float64)
ATOL = 1e-5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("served") / "llama"
    save_tiny_model("llama", folder)
    save_word_tokenizer(folder, V)
    return str(folder)


@pytest.fixture(scope="module")
def server(model_dir):
    with CompletionsServer(model_dir) as srv:
        yield srv


@pytest.fixture(autouse=True)
def _no_faults(request):
    yield
    if "server" in request.fixturenames:
        request.getfixturevalue("server").faults.clear()


def served_config(url, model_dir, **served) -> TeacherConfig:
    opts = {"url": url, "retries": 0, "timeout_s": 10.0, **served}
    return from_dict(TeacherConfig, {"name": "srv", "model": model_dir, "placement": "served",
                                     "output": "topk", "top_k": K, "startup_timeout_s": 5.0,
                                     "served": opts})


def _forward(cfg, ids, mask):
    with make_client(cfg) as client:
        assert isinstance(client, ServedClient) and client.transport == "http"
        step = client.submit(TeacherRequest(0, ids, mask))
        with client.collect(step) as lease:
            return lease.output.clone()


def _batch():
    ids, mask = random_batch(V, B=4, Tt=10, seed=3)   # real lengths 10, 7, 4, 10
    return ids, mask


@pytest.mark.parametrize("protocol,token_ids",
                         [("vllm", True), ("vllm", False), ("echo", True), ("echo", False)])
def test_served_topk_equals_inprocess(server, model_dir, protocol, token_ids):
    ids, mask = _batch()
    ref = TeacherWorker(TeacherConfig(name="srv", model=model_dir, output="topk", top_k=K,
                                      dtype="float32")).forward(TeacherRequest(0, ids, mask))
    out = _forward(served_config(server.url, model_dir, protocol=protocol, token_ids=token_ids),
                   ids, mask)
    assert out.kind == "topk" and out.name == "srv" and out.temperature == 1.0
    for name in ("topk_logp_BTtK", "topk_idx_BTtK", "tail_logmass_BTt", "token_logp_BTt"):
        a, b = getattr(out, name), getattr(ref, name)
        assert a.shape == b.shape and a.dtype == b.dtype, name
    m = mask.bool()
    assert torch.equal(out.topk_idx_BTtK[m], ref.topk_idx_BTtK[m])
    torch.testing.assert_close(out.topk_logp_BTtK[m], ref.topk_logp_BTtK[m], rtol=0, atol=ATOL)
    torch.testing.assert_close(out.tail_logmass_BTt[m], ref.tail_logmass_BTt[m], rtol=0,
                               atol=1e-4)
    torch.testing.assert_close(out.token_logp_BTt[m], ref.token_logp_BTt[m], rtol=0, atol=ATOL)
    assert torch.all(out.token_logp_BTt[:, 0] == 0)
    # padding: the fixed placeholder (a point mass on id 0)
    pad = ~m
    assert torch.all(out.topk_idx_BTtK[pad] == 0) and torch.all(out.topk_logp_BTtK[pad][:, 0] == 0)
    assert torch.all(out.topk_logp_BTtK[pad][:, 1:] == LOGP_TINY)
    assert torch.all(out.tail_logmass_BTt[pad] == LOGP_TINY)


def test_pool_with_served_and_inprocess_teachers(server, model_dir):
    """A served teacher is remote for the pool (submitted first) and its rows all arrive; a row
    with no real token sends no request."""
    ids, mask = _batch()
    mask[2] = False
    cfgs = [served_config(server.url, model_dir),
            TeacherConfig(name="local", model=model_dir, output="topk", top_k=K, dtype="float32")]
    before = server.requests
    with TeacherPool(cfgs) as pool:
        assert pool.has_remote and pool.remote_slots == cfgs[0].slots
        from xdistill.data.batch import TeacherView

        z = torch.zeros_like(ids)
        views = [TeacherView(name=n, input_ids_BTt=ids, attention_mask_BTt=mask,
                             loss_mask_BTt=mask, s_chunk_BTs=z, t_chunk_BTt=z,
                             chunk_valid_BC=mask, chunk_exact_BC=mask) for n in ("srv", "local")]
        with pool.forward(views) as outs:
            m = mask.bool()
            assert torch.equal(outs["srv"].topk_idx_BTtK[m], outs["local"].topk_idx_BTtK[m])
    assert server.requests - before == 3


def test_config_errors(model_dir):
    def cfg(**kw):
        return served_config("http://127.0.0.1:1/v1", model_dir, **kw)

    with pytest.raises(ConfigError, match="only serves output 'topk'.*got 'logits'"):
        dataclasses.replace(cfg(), output="logits").validate()
    with pytest.raises(ConfigError, match="needs temperature 1.0.*got 2.0"):
        dataclasses.replace(cfg(), temperature=2.0).validate()
    with pytest.raises(ConfigError, match="served.url must be an http.*'127.0.0.1:8000'"):
        served_config("127.0.0.1:8000", model_dir).validate()
    with pytest.raises(ConfigError, match="served.retries >= 0"):
        cfg(retries=-1).validate()
    with pytest.raises(ConfigError, match="urls"):
        from_dict(TeacherConfig, {"served": {"urls": "http://x"}})


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def test_dead_server_at_start(model_dir):
    url = _dead_url()
    cfg = served_config(url, model_dir)
    cfg.startup_timeout_s = 1.5
    with pytest.raises(TeacherError, match=rf"served at {url}.*did not answer its model list "
                       r"\(waited 1.5 s.*cannot connect.*Connection refused"):
        make_client(cfg).start()


def test_server_dies_mid_run(model_dir):
    srv = CompletionsServer(model_dir)
    client = make_client(served_config(srv.url, model_dir, retries=1))
    client.start()
    srv.close()
    ids, mask = _batch()
    with pytest.raises(TeacherError, match=rf"request 0 row 0 \(10 tokens, top-5 vllm log-probs\)"
                       rf": {srv.url}/completions: cannot connect.*\(2 tries\)"):
        client.forward(TeacherRequest(0, ids[:1], mask[:1]))
    client.close()


def test_timeout_after_retries(server, model_dir):
    server.faults[:] = [("sleep", 2.0)] * 2
    cfg = served_config(server.url, model_dir, timeout_s=0.4, retries=1)
    ids, mask = _batch()
    with pytest.raises(TeacherError, match=r"row 0 .*no answer within 0.4 s \(timeout\) "
                       r"\(2 tries\)"):
        _forward(cfg, ids[:1], mask[:1])


@pytest.mark.parametrize("raw,match", [
    (b"<html>oops</html>", r"the answer is not JSON: '<html>oops</html>'"),
    (b'{"choices": []}', r"unusable answer from .*/completions: expected a JSON object with a "
                         r"non-empty 'choices' list"),
    (b'{"choices": [{"logprobs": null}]}', r"unusable answer.*expected 'prompt_logprobs' with "
                                           r"one entry per prompt token \(10\), got None"),
])
def test_malformed_answers(server, model_dir, raw, match):
    server.faults[:] = [("raw", raw)]
    ids, mask = _batch()
    with pytest.raises(TeacherError, match=rf"teacher 'srv' \(served at .*row 0 .*{match}"):
        _forward(served_config(server.url, model_dir), ids[:1], mask[:1])


def test_http_500_is_retried(server, model_dir):
    server.faults[:] = [("status", 500), ("status", 503)]
    ids, mask = _batch()
    before = server.requests
    out = _forward(served_config(server.url, model_dir, retries=2), ids[:1], mask[:1])
    assert server.requests - before == 3
    assert out.topk_idx_BTtK.shape == (1, 10, K)


def test_http_400_is_not_retried_and_quotes_the_server(server, model_dir):
    cfg = served_config(server.url, model_dir, retries=3)
    cfg.top_k = 30   # above the server's max_logprobs (20)
    ids, mask = _batch()
    before = server.requests
    with pytest.raises(TeacherError, match=r"top-30 vllm log-probs\): .*HTTP 400: Requested "
                       r"sample logprobs of 30, which is greater than max allowed: 20 \(1 try\)"):
        _forward(cfg, ids[:1], mask[:1])
    assert server.requests - before == 1


def test_unmappable_token_string(server, model_dir):
    server.faults[:] = [("key", "<<nope>>")]
    ids, mask = _batch()
    cfg = served_config(server.url, model_dir, protocol="echo", token_ids=False)
    with pytest.raises(TeacherError, match=r"row 0 .*logprobs.top_logprobs\[10\].*token "
                       r"'<<nope>>' is neither a vocabulary entry"):
        _forward(cfg, ids[:1], mask[:1])


def test_unknown_model_name(server, model_dir):
    with pytest.raises(TeacherError, match=r"served.model 'other' is not served there \(the "
                       r"server has \['tiny'\]\)"):
        make_client(served_config(server.url, model_dir, model="other")).start()


class _FailingEngine:
    """A served engine whose output shapes or forward fail (slot accounting under errors)."""

    info = "fake engine info"   # what make_output would read; never reached here

    def __init__(self, fail_in: str):
        self.fail_in = fail_in

    def output_spec(self, B, Tt):
        if self.fail_in == "output_spec":
            raise ValueError("no shapes")
        return {}

    def run_into(self, request, out):
        raise KeyboardInterrupt   # what the lifecycle's second Ctrl-C raises in a waiting thread


def test_failures_give_the_slot_back_and_an_interrupt_stays_an_interrupt(model_dir):
    cfg = served_config("http://127.0.0.1:9", model_dir)
    cfg.slots = 1
    ids, mask = _batch()
    client = ServedClient(cfg, engine_factory=lambda: _FailingEngine("output_spec"))
    client.start()
    for _ in range(2):   # the second attempt fails the same way: no slot was kept
        with pytest.raises(ValueError, match="no shapes"):
            client.submit(TeacherRequest(0, ids[:1], mask[:1]))
    client.close()
    client = ServedClient(cfg, engine_factory=lambda: _FailingEngine("run_into"))
    client.start()
    for _ in range(2):
        step = client.submit(TeacherRequest(0, ids[:1], mask[:1]))
        with pytest.raises(KeyboardInterrupt):
            client.collect(step)
    client.close()
