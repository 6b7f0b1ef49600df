"""Fixtures for the data-stage tests: a tiny tokenizer, small prepared corpora."""

from __future__ import annotations

import json
import random

import pytest

from tiny import TinyTokenizer  # pytest puts this folder on sys.path (rootdir-less conftest)

WORDS = ["the", "quick", "brown", "fox", "naïve", "café", "東京", "🙂", "tabs\t", "new\nline",
         "code(x)", "  spaces", "distill", "ünïcödé", "42", "—"]


def make_docs(n: int, seed: int = 0, long_every: int = 17) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        k = rng.randint(1, 40) if i % long_every else 400  # some documents span several windows
        docs.append(f"doc{i} " + " ".join(rng.choice(WORDS) for _ in range(k)))
    return docs


@pytest.fixture(scope="session")
def tiny_tok():
    return TinyTokenizer()


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    """A prepared directory of 60 text documents (two shards) plus the documents themselves."""
    from xdistill.data.prepare import prepare

    root = tmp_path_factory.mktemp("corpus")
    docs = make_docs(60)
    src = root / "in.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    prepare([src], root / "out", shard_bytes=4000, progress=False)
    return root / "out", docs
