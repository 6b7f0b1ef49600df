"""The real study's texts (benchmarks/real/splits.py), the ``blocks`` schemes of amendments 2 and 4:
held-out blocks never reach the teacher's domain or the student's slice, every passage of a domain
play lands in exactly one split, validation and test interleave the plays, amendment 4 keeps
amendment 2's validation and tests on blocks no amendment-2 model was scored on, and the first
scheme is unchanged (real Shakespeare from the asset cache; no model)."""

from __future__ import annotations

import pytest
from real_helpers import load_real_script

splits = load_real_script("splits")


BLOCK_SCHEMES = ("blocks", "blocks4")


@pytest.fixture(scope="module", params=BLOCK_SCHEMES)
def blocks(request):
    return request.param, splits.texts(40, request.param)


@pytest.mark.parametrize("scheme, held", [("blocks", ((4, 14), (9, 19))),
                                          ("blocks4", ((4, 14), (1, 11)))])
def test_held_out_blocks_partition_a_play_in_order(scheme, held):
    assert splits.HELD_OUT[scheme] == held                  # as PROTOCOL.md states them
    docs = [f"p{i}" for i in range(47)]
    train, valid, test = splits.held_out_blocks(docs, scheme)
    assert sorted(train + valid + test, key=lambda d: int(d[1:])) == docs
    assert not set(train) & set(valid) and not set(train) & set(test) and not set(valid) & set(test)
    # 47 passages in 20 blocks: block i is docs[round(i*47/20):round((i+1)*47/20)]
    bounds = [round(i * 47 / 20) for i in range(21)]
    want = lambda ids: [d for i in ids for d in docs[bounds[i]:bounds[i + 1]]]  # noqa: E731
    assert valid == want(held[0]) and test == want(held[1])
    assert train == want(i for i in range(20) if i not in (*held[0], *held[1]))


def test_amendment_4_keeps_validation_and_tests_on_fresh_blocks():
    a2, a4 = splits.texts(40, "blocks"), splits.texts(40, "blocks4")
    assert a4["valid"] == a2["valid"]                       # every decision on the same text
    assert not set(a4["test"]) & set(a2["test"])            # a new test text ...
    assert set(a4["test"]) <= set(a2["domain"])             # ... that no a2 model was scored on
    assert set(a2["test"]) <= set(a4["domain"])             # a2's test blocks join the domain
    assert len(a4["domain"]) + len(a4["test"]) == len(a2["domain"]) + len(a2["test"])
    assert splits.texts(40) == a4                           # the default scheme


def test_interleave_is_round_robin():
    assert splits.interleave([["a1", "a2", "a3"], ["b1"], ["c1", "c2"]]) == \
        ["a1", "b1", "c1", "a2", "c2", "a3"]
    assert splits.interleave([]) == []


def test_blocks_scheme_keeps_held_out_text_away_from_training(blocks):
    from xdistill.tiny import passages

    scheme, blocks = blocks
    train, held = set(blocks["domain"]), set(blocks["valid"]) | set(blocks["test"])
    assert not train & held and not set(blocks["valid"]) & set(blocks["test"])
    assert set(blocks["slice"]) <= train
    every_domain_passage = [p for play in splits.DOMAIN for p in passages(plays=[play])]
    assert len(blocks["domain"]) + len(blocks["valid"]) + len(blocks["test"]) == len(every_domain_passage)
    assert set(blocks["other_play"]) == set(passages(plays=[splits.TEST]))
    assert list(blocks) == list(splits.SPLITS[scheme])
    kb = {k: sum(len(p.encode()) for p in v) / 1024 for k, v in blocks.items()}
    assert 30 <= kb["slice"] <= 50 and 40 <= kb["valid"] <= 65 and 40 <= kb["test"] <= 65


def test_held_out_splits_start_with_every_play(blocks):
    from xdistill.tiny import passages

    scheme, blocks = blocks
    for index, name in ((1, "valid"), (2, "test")):
        firsts = blocks[name][:len(splits.DOMAIN)]
        for play, first in zip(splits.DOMAIN, firsts):
            assert first == splits.held_out_blocks(passages(plays=[play]), scheme)[index][0]


def test_plays_scheme_is_the_protocol_as_first_written():
    from xdistill.tiny import passages

    plays = splits.texts(40, "plays")
    assert list(plays) == list(splits.SPLITS["plays"])
    assert plays["valid"] == passages(plays=[splits.VALID])
    assert plays["test"] == passages(plays=[splits.TEST])
    assert plays["domain"] == [p for play in splits.DOMAIN for p in passages(plays=[play])]
    with pytest.raises(ValueError, match="unknown scheme 'x'"):
        splits.texts(40, "x")
