"""Prompt sources (arrow, parquet, jsonl; plain and chat), sharding and exact resume."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from xdistill.errors import DataError
from xdistill.rollout import PromptDataset, collate_prompts, open_prompts

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]


def _write_all(tmp_path, n=23):
    prompts = [f"prompt number {i}" for i in range(n)]
    prompts[5] = "   "                                   # empty: skipped and counted
    pa_tab = pa.table({"prompt": prompts})
    with pa.OSFile(str(tmp_path / "p.arrow"), "wb") as f, pa.ipc.new_file(f, pa_tab.schema) as w:
        w.write_table(pa_tab)
    pq.write_table(pa.table({"messages": [CHAT] * 3}), tmp_path / "c.parquet")
    with open(tmp_path / "p.jsonl", "w") as f:
        f.write(json.dumps({"prompt": "plain"}) + "\n\n" + json.dumps({"messages": CHAT}) + "\n")
    return prompts


def test_sources_plain_and_chat(tmp_path):
    _write_all(tmp_path)
    arrow = open_prompts(tmp_path / "p.arrow")
    assert len(arrow) == 23 and arrow.get(3) == "prompt number 3"
    chat = open_prompts(tmp_path / "c.parquet")
    assert chat.get(1) == (("system", "Be brief."), ("user", "Hi?"))
    js = open_prompts(tmp_path / "p.jsonl")
    assert len(js) == 2 and js.get(0) == "plain" and js.get(1)[1] == ("user", "Hi?")


def test_bad_jsonl_names_file_and_line(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\n{"text": 1}\n')
    with pytest.raises(DataError, match=r"bad.jsonl line 2: needs a string 'prompt'"):
        open_prompts(tmp_path / "bad.jsonl")
    (tmp_path / "bad2.jsonl").write_text('{"prompt": "ok"\n')
    with pytest.raises(DataError, match=r"bad2.jsonl line 1: invalid JSON"):
        open_prompts(tmp_path / "bad2.jsonl")


def test_unknown_role_in_a_prompt_names_role_file_and_line(tmp_path):
    bad = tmp_path / "p.jsonl"
    wizard = CHAT + [{"role": "wizard", "content": "Abracadabra."}]
    bad.write_text(json.dumps({"prompt": "ok"}) + "\n" + json.dumps({"messages": wizard}) + "\n")
    with pytest.raises(DataError, match=rf"{bad} line 2: message 2 has the unknown chat role "
                                        r"'wizard'; accepted roles: system, developer, user, "
                                        r"assistant, tool"):
        open_prompts([bad])
    pq.write_table(pa.table({"messages": [CHAT, wizard]}), tmp_path / "c.parquet")
    ds = PromptDataset(open_prompts([tmp_path / "c.parquet"]), shuffle=False, epochs=1)
    with pytest.raises(DataError, match=r"c\.parquet row 1: message 2 has the unknown chat role "
                                        r"'wizard'"):
        list(ds)


def test_empty_prompt_file_is_an_error_naming_it(tmp_path):
    empty = tmp_path / "empty.jsonl"
    for text in ("", "\n  \n"):
        empty.write_text(text)
        with pytest.raises(DataError, match=rf"prompt file {empty} holds no prompts"):
            open_prompts([empty])


def test_shards_partition_each_epoch(tmp_path):
    _write_all(tmp_path)
    src = open_prompts(tmp_path / "p.arrow")
    seen = []
    for rank in range(3):
        ds = PromptDataset(src, seed=4, rank=rank, world_size=3, epochs=1)
        seen += [i for i, _ in ds]
    assert sorted(seen) == [i for i in range(23) if i != 5]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_reproduces_order(tmp_path, num_workers):
    _write_all(tmp_path)
    src = open_prompts(tmp_path / "p.arrow")

    def loader(state=None):
        dl = StatefulDataLoader(PromptDataset(src, seed=1, rank=1, world_size=2), batch_size=3,
                                num_workers=num_workers, collate_fn=collate_prompts)
        if state is not None:
            dl.load_state_dict(state)
        return dl

    full = [b for _, b in zip(range(9), loader())]          # > one epoch of this shard
    dl = loader()
    it = iter(dl)
    first = [next(it) for _ in range(4)]
    state = dl.state_dict()
    del it, dl
    rest = [b for _, b in zip(range(5), loader(state))]
    assert first + rest == full


def test_resume_refuses_other_layout(tmp_path):
    _write_all(tmp_path)
    src = open_prompts(tmp_path / "p.arrow")
    state = PromptDataset(src, seed=1).state_dict()
    with pytest.raises(DataError, match="cannot resume prompt state"):
        PromptDataset(src, seed=2).load_state_dict(state)
