"""Reading a completions server's answers (xdistill.teacher.served_answers) without a server:
token strings -> teacher ids with a real byte-level BPE tokenizer (GPT-2's), under concurrent row
threads, and the vLLM answer form's two kinds of keys."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from transformers import AutoTokenizer

from xdistill.assets.paths import tokenizer_dir
from xdistill.teacher.served_answers import TokenMap, parse_vllm


@pytest.fixture(scope="module")
def gpt2():
    return AutoTokenizer.from_pretrained(str(tokenizer_dir("gpt2")))


def test_every_uniquely_decodable_text_maps_to_its_own_id(gpt2):
    """Servers send decoded text: ``é`` is the text of the id whose piece is ``Ã©``, and also the
    raw piece of the lone byte 0xE9 (another id), so the decoded text must be looked up first."""
    token_map = TokenMap(lambda: gpt2)
    texts: dict[str, list[int]] = {}
    for i in range(len(gpt2)):
        texts.setdefault(gpt2.decode([i]), []).append(i)
    unique = {text: ids[0] for text, ids in texts.items() if len(ids) == 1}
    wrong = [(text, i, token_map(text)) for text, i in unique.items() if token_map(text) != i]
    assert not wrong, f"{len(wrong)} texts map to another id, e.g. {wrong[:5]}"
    assert token_map("é") == gpt2.convert_tokens_to_ids("Ã©")
    assert token_map("Ġthe") == gpt2.convert_tokens_to_ids("Ġthe")  # a piece still works
    assert token_map("token_id:17") == 17


def test_concurrent_first_lookups_build_the_tables_once(gpt2):
    """The served teacher parses rows in ``served.concurrency`` threads: the first lookups race to
    build the tables; every thread must get the right id and the tokenizer be loaded once."""
    loads, barrier = [], threading.Barrier(8)

    def slow_load():
        loads.append(1)
        time.sleep(0.2)      # widen the window in which other threads arrive
        return gpt2

    token_map = TokenMap(slow_load)

    def look_up(_):
        barrier.wait()
        return token_map(" cat"), token_map(" the")

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(look_up, range(8)))
    want = (gpt2.encode(" cat")[0], gpt2.encode(" the")[0])
    assert got == [want] * 8 and len(loads) == 1


def test_vllm_answer_reads_prompt_keys_as_ids_and_the_generated_keys_as_text():
    """``prompt_logprobs`` is keyed by id (``"8"`` is id 8); the generated token's
    ``top_logprobs`` by token string, so a digit text ``"8"`` is the id of the token ``8``."""
    text_to_id = {"8": 40, ";": 43}.__getitem__
    body = {"choices": [{
        "prompt_logprobs": [None, {"7": {"logprob": -0.1}, "8": {"logprob": -2.5}}],
        "logprobs": {"top_logprobs": [{"8": -0.2, ";": -1.9}]}}]}
    row = parse_vllm(body, [5, 7], 2, 100, text_to_id)
    assert row.topk_idx_LK.tolist() == [[7, 8], [40, 43]]
    assert row.token_logp_L.tolist() == pytest.approx([0.0, -0.1])
