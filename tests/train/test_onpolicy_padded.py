"""An on-policy run whose student has a padded logit width (``student.model_config.vocab_size``
above its tokenizer's ids, as Qwen2.5 or Phi-3 ship): it trains, with a same-tokenizer and a
cross-tokenizer teacher. It used to sample padded ids and crash in the scorer in step 1."""

from __future__ import annotations

import math

import onpolicy_helpers as H  # pytest puts this test's folder on sys.path

from xdistill.config import from_dict
from xdistill.tokenization import load_tokenizer
from xdistill.train.onpolicy_config import OnPolicyConfig


def test_a_padded_student_vocabulary_trains_on_policy(tmp_path, tiny_assets):
    from xdistill.train.onpolicy import run_onpolicy

    V = load_tokenizer(tiny_assets["tok_s"]).vocab_size
    same = H.save_lm(tmp_path / "same", tiny_assets["tok_s"], seed=1, logit_scale=5.0)
    cross = H.save_lm(tmp_path / "cross", tiny_assets["tok_t"], seed=2, logit_scale=5.0)
    teachers = [H.teacher("same", tiny_assets["tok_s"], same, "k1"),
                H.teacher("cross", tiny_assets["tok_t"], cross, "k1")]
    d = H.onpolicy_dict(tiny_assets["tok_s"], teachers, H.write_prompts(tmp_path / "p.jsonl"),
                        tmp_path / "run", steps=2)
    d["student"]["model_config"]["vocab_size"] = V + 64   # 64 padded logit columns
    metrics = run_onpolicy(from_dict(OnPolicyConfig, d))
    assert math.isfinite(metrics["loss"]) and metrics["units/same"] > 0
