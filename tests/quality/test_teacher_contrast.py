"""``benchmarks/quality/teacher_contrast.py``: the byte-level answer score against a float64
enumeration over the vocabulary, the rank AUC against the pairwise definition, and the generated
table from a record."""

from __future__ import annotations

import importlib.util
import itertools
import math
import random
from pathlib import Path

import pytest
import torch

_path = Path(__file__).resolve().parents[2] / "benchmarks" / "quality" / "teacher_contrast.py"
_spec = importlib.util.spec_from_file_location("quality_teacher_contrast", _path)
contrast = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(contrast)


def _pairwise_auc(pos, neg):
    return sum((p > n) + 0.5 * (p == n) for p, n in itertools.product(pos, neg)) / (
        len(pos) * len(neg))


def test_rank_auc_equals_the_pairwise_definition_with_ties():
    rng = random.Random(0)
    for _ in range(20):
        pos = [rng.choice([-3.0, -1.0, -0.5, 0.0, rng.random()]) for _ in range(rng.randint(1, 9))]
        neg = [rng.choice([-3.0, -1.0, -2.0, rng.random()]) for _ in range(rng.randint(1, 9))]
        assert contrast.auc(pos, neg) == pytest.approx(_pairwise_auc(pos, neg), abs=1e-12)
    assert contrast.auc([1.0, 2.0], [0.0]) == 1.0 and contrast.auc([0.0], [1.0]) == 0.0


def test_answer_score_is_the_digits_then_a_non_digit(assets):
    """log q = canonical path of the digits + log of the mass of tokens that do not start with a
    digit, checked by decoding every id (not the id-to-token table the script reads)."""
    from tokenizers import Tokenizer

    from toyq.evaluate import load_model

    tok = Tokenizer.from_file(str(Path(assets["tok_teacher"]) / "tokenizer.json"))
    model = load_model(assets["teacher_big"]["model"]).eval()
    digit_V = contrast.digit_start(tok)
    for ch in "0123456789":
        assert bool(digit_V[tok.token_to_id(ch)]), ch
    prompt, digits = "Q: 3+4=? A:", "7"
    got = contrast.answer_logq(model, tok, digit_V, prompt, digits)
    a = tok.encode(prompt, add_special_tokens=False).ids
    ab = tok.encode(prompt + digits, add_special_tokens=False).ids
    assert ab[:len(a)] == a
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ab])).logits[0].double(), -1)
    path = sum(float(logp[i - 1, ab[i]]) for i in range(len(a), len(ab)))
    V = logp.shape[1]
    boundary = 0.0
    for i in range(V):
        raw = tok.id_to_token(i)
        text = (bytes([int(raw[3:5], 16)]) if raw.startswith("<0x") and raw.endswith(">")
                else tok.decode([i]).lstrip("\u2581").encode() if raw.startswith("\u2581")
                else tok.decode([i]).encode())
        first = (b" " if raw.startswith("\u2581") else text[:1])
        if not (first and 0x30 <= first[0] <= 0x39):
            boundary += math.exp(float(logp[-1, i]))
    assert got == pytest.approx(path + math.log(boundary), abs=1e-9)
    assert got <= path


def _side(logq_c, logq_w, adv_c=2.0, adv_w=-10.0):
    return {"logq_correct": logq_c, "logq_wrong": logq_w, "wrong_above_correct": 0.0,
            "adv_correct": adv_c, "adv_wrong": adv_w, "wrong_adv_positive": 0.01}


def test_summary_and_generated_table():
    rows = [dict(cross=-0.1, same=-0.2, ok=True, logp=-1.0), dict(cross=-9.0, same=-5.0, ok=False,
            logp=-2.0), dict(cross=-0.5, same=-8.0, ok=False, logp=-9.0)]
    s = contrast.summarise(rows)
    assert (s["correct"], s["wrong"]) == (1, 2)
    assert s["cross"]["logq_wrong"] == pytest.approx(-4.75)
    assert s["same"]["adv_wrong"] == pytest.approx(((-5.0 + 2.0) + (-8.0 + 9.0)) / 2)
    assert s["cross"]["wrong_adv_positive"] == pytest.approx(0.5)   # -0.5 - (-9.0) > 0
    assert s["cross"]["wrong_above_correct"] == 0.0
    group = {"correct": 3, "wrong": 7, "cross": _side(-0.01, -20.0), "same": _side(-0.03, -16.0)}
    record = {"samples_per_prompt": 8, "command": "python x", "seeds": [
        {"seed": 1, "malformed": 2, "skipped": 0, "unlabeled": group, "labeled": group},
        {"seed": 2, "malformed": 1, "skipped": 0, "unlabeled": dict(group, cross=_side(-0.01, -22.0)),
         "labeled": group}]}
    text = contrast.render(record)
    assert "(6 correct, 14 wrong well-formed answers)" in text
    assert "| log q, wrong | -21.000 | -16.000 | -5.000 (-6.000 .. -4.000) |" in text
    assert "Malformed samples (not scored): 3" in text
