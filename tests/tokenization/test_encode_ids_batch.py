"""``Tokenizer.encode_ids_batch``: the ids and phantom prefix of ``encode_batch``, without byte
offsets, for every family (exact texts, texts with in-text special tokens, lossy ones)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tok_helpers import CORPUS

PIECES = st.lists(st.sampled_from(
    ["  ", "\t", "\n", " ", "a", "Z", "1", "😀", "日", "\u0301", "é", "\x00", "\x04", "▁", "Ġ",
     "<s>", "</s>", "<|endoftext|>", "<|end|>", "<h1>", " the", "'s", "..."]), max_size=12).map("".join)
TEXTS = st.one_of(PIECES, st.text(max_size=20), st.sampled_from(CORPUS))


@pytest.mark.parametrize("name", ["gpt2", "mistral", "phi3", "llama-spm", "bert", "qwen2",
                                  pytest.param("gemma3-270m", marks=pytest.mark.real),
                                  pytest.param("smollm2-135m", marks=pytest.mark.real)])
def test_same_ids_and_phantom_as_encode_batch(get_tokenizer, name):
    tok = get_tokenizer(name)

    @settings(max_examples=60, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(TEXTS, min_size=1, max_size=6))
    def run(texts):
        texts = [t.encode("utf-8", "replace").decode("utf-8") for t in texts]   # no lone surrogates
        fast = tok.encode_ids_batch(texts)
        full = tok.encode_batch(texts)
        assert fast == [(e.ids.tolist(), e.phantom_prefix) for e in full]

    run()
