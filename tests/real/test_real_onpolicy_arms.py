"""Pieces of the real study's on-policy amendment (benchmarks/real/onpolicy_arms.py, samples.py):
prompts cut at a space, equal student tokens, the repetition rate and the teacher's bits over a
continuation, checked against hand computations on a tiny model (fast, no real weights)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from real_helpers import load_real_script

arms, samples = load_real_script("onpolicy_arms"), load_real_script("samples")


def test_prompts_are_cut_at_a_space_and_short_passages_dropped():
    text = "Now is the winter of our discontent made glorious summer by this sun of York " * 3
    p = arms.prompt_of(text)
    assert len(p) <= arms.PROMPT_CHARS and text.startswith(p) and text[len(p)] == " "
    assert arms.prompt_of("Too short.") is None
    assert arms.prompts([text, "x", text], limit=1) == [p]


def test_equal_student_tokens_and_the_config():
    args = SimpleNamespace(steps=60, seq_len=64, batch=4, lr=1e-4, threads=2)
    assert arms.onpolicy_steps(args) * args.batch * arms.NEW_TOKENS == 60 * 4 * 64
    a = {"teacher": "T", "student": "S", "prompts": "p.jsonl", "lr": 3e-5}
    cfg = arms.onpolicy_config("op_k1_byte_mean_clip", 7, args, a, Path("out"))
    assert cfg["train"]["steps"] == 120 and cfg["rollout"]["seed"] == 7
    assert cfg["loss"]["credit"] == "byte" and cfg["teachers"][0]["loss"]["kind"] == "k1"
    assert cfg["loss"]["advantage_baseline"] == "mean" and cfg["loss"]["loss_max"] == 2.0
    plain = arms.onpolicy_config("op_k1", 7, args, a, Path("o"))["loss"]
    assert not {"credit", "advantage_baseline", "loss_max"} & set(plain)   # k1 as users get it
    from xdistill.config import from_dict
    from xdistill.train.onpolicy_config import OnPolicyConfig

    assert from_dict(OnPolicyConfig, cfg).optim.lr == 3e-5   # a valid config
    with pytest.raises(SystemExit, match="unknown on-policy arm"):
        arms.onpolicy_config("op_dpca", 0, args, a, Path("o"))


def test_repetition_counts_repeated_four_grams():
    assert samples.repetition([[1, 2, 3, 4, 5]]) == 0.0
    # 1 2 3 4 1 2 3 4: 5 four-grams, the last one (1 2 3 4) repeats the first
    assert samples.repetition([[1, 2, 3, 4, 1, 2, 3, 4]]) == pytest.approx(1 / 5)
    assert samples.repetition([[7] * 10]) == pytest.approx(6 / 7)
    assert samples.repetition([[1, 2]]) == 0.0


def test_teacher_bits_cover_exactly_the_continuation_tokens():
    from xdistill.student.model import build_causal_lm
    from xdistill.tokenization import load_tokenizer

    tok = load_tokenizer("gpt2")
    model = build_causal_lm("gpt2", dict(n_embd=16, n_layer=1, n_head=2, n_positions=64,
                                         vocab_size=tok.vocab_size), seed=0).eval()
    prompt, text = "Hello there", " my friend, how are you"
    bits, nbytes = samples.teacher_bits(model, tok, prompt, text, add_bos=False)
    ids = [int(x) for x in tok.encode(prompt + text).ids]
    n_prompt = len(tok.encode(prompt).ids)   # no token straddles the space here
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].double(), -1)
    want = -sum(float(logp[i - 1, ids[i]]) for i in range(n_prompt, len(ids))) / math.log(2)
    assert nbytes == len(text.encode())
    assert bits == pytest.approx(want, rel=1e-4)


def test_the_report_reads_the_onpolicy_arms_from_their_module():
    distill_report = load_real_script("distill_report")
    assert distill_report._onpolicy_arms() == arms.ONPOLICY_ARMS
    assert set(arms.ONPOLICY_ARMS) <= set(distill_report.ARM_TEXT)
