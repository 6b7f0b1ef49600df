"""``train.log_every``: metrics.jsonl gets every ``log_every``-th step and always the last one
(a 5-step run with ``log_every: 2`` used to end without its final step's record)."""

from __future__ import annotations

import json

import xdistill.tiny as mk
from xdistill.config import from_dict
from xdistill.train.config import OffPolicyConfig
from xdistill.train.offpolicy import run_offpolicy


def test_the_last_step_is_logged_whatever_log_every(tmp_path):
    train, _ = mk.make_corpus(tmp_path / "corpus", n_train=20, n_eval=2, max_chars=300)
    tok = mk.train_bpe(tmp_path / "tok", 300, mk.passages(limit=40))
    out = tmp_path / "run"
    cfg = {"student": {"model_type": "llama", "model_config": dict(
               hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
               num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True)},
           "student_tokenizer": str(tok),
           "data": {"paths": [str(train)], "seq_len": 16, "batch_size": 1, "num_workers": 0},
           "loss": {"ce_weight": 1.0},
           "train": {"steps": 5, "out_dir": str(out), "tensorboard": False, "log_every": 2,
                     "num_threads": 2},
           "checkpoint": {"every": 0, "export_hf": False},
           "eval": {"every": -1}}
    run_offpolicy(from_dict(OffPolicyConfig, cfg))
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 4, 5]
