"""The real study's texts (benchmarks/real/splits.py), amendment 2's ``blocks`` scheme: held-out
blocks never reach the teacher's domain or the student's slice, every passage of a domain play
lands in exactly one split, validation and test interleave the plays, and the first scheme is
unchanged (real Shakespeare from the asset cache; no model)."""

from __future__ import annotations

import pytest
from real_helpers import load_real_script

splits = load_real_script("splits")


@pytest.fixture(scope="module")
def blocks():
    return splits.texts(40, "blocks")


def test_held_out_blocks_partition_a_play_in_order():
    docs = [f"p{i}" for i in range(47)]
    train, valid, test = splits.held_out_blocks(docs)
    assert sorted(train + valid + test, key=lambda d: int(d[1:])) == docs
    assert not set(train) & set(valid) and not set(train) & set(test) and not set(valid) & set(test)
    # 47 passages in 20 blocks: block i is docs[round(i*47/20):round((i+1)*47/20)]
    bounds = [round(i * 47 / 20) for i in range(21)]
    want = lambda ids: [d for i in ids for d in docs[bounds[i]:bounds[i + 1]]]  # noqa: E731
    assert valid == want(splits.VALID_BLOCKS) and test == want(splits.TEST_BLOCKS)
    assert train == want(i for i in range(20) if i not in (*splits.VALID_BLOCKS, *splits.TEST_BLOCKS))


def test_interleave_is_round_robin():
    assert splits.interleave([["a1", "a2", "a3"], ["b1"], ["c1", "c2"]]) == \
        ["a1", "b1", "c1", "a2", "c2", "a3"]
    assert splits.interleave([]) == []


def test_blocks_scheme_keeps_held_out_text_away_from_training(blocks):
    from xdistill.tiny import passages

    train, held = set(blocks["domain"]), set(blocks["valid"]) | set(blocks["test"])
    assert not train & held and not set(blocks["valid"]) & set(blocks["test"])
    assert set(blocks["slice"]) <= train
    every_domain_passage = [p for play in splits.DOMAIN for p in passages(plays=[play])]
    assert len(blocks["domain"]) + len(blocks["valid"]) + len(blocks["test"]) == len(every_domain_passage)
    assert set(blocks["other_play"]) == set(passages(plays=[splits.TEST]))
    assert list(blocks) == list(splits.SPLITS["blocks"])
    kb = {k: sum(len(p.encode()) for p in v) / 1024 for k, v in blocks.items()}
    assert 30 <= kb["slice"] <= 50 and 40 <= kb["valid"] <= 65 and 40 <= kb["test"] <= 65


def test_held_out_splits_start_with_every_play(blocks):
    from xdistill.tiny import passages

    for name, ids in (("valid", splits.VALID_BLOCKS), ("test", splits.TEST_BLOCKS)):
        firsts = blocks[name][:len(splits.DOMAIN)]
        for play, first in zip(splits.DOMAIN, firsts):
            assert first == splits.held_out_blocks(passages(plays=[play]))[1 if name == "valid" else 2][0]


def test_plays_scheme_is_the_protocol_as_first_written():
    from xdistill.tiny import passages

    plays = splits.texts(40, "plays")
    assert list(plays) == list(splits.SPLITS["plays"])
    assert plays["valid"] == passages(plays=[splits.VALID])
    assert plays["test"] == passages(plays=[splits.TEST])
    assert plays["domain"] == [p for play in splits.DOMAIN for p in passages(plays=[play])]
    with pytest.raises(ValueError, match="unknown scheme 'x'"):
        splits.texts(40, "x")
