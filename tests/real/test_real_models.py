"""The converted pretrained models load from their Hugging Face folders with plain transformers
and predict English sensibly (bits per byte on a short text), through xdistill's loader too."""

from __future__ import annotations

import math
import time

import pytest
import torch

from xdistill.assets import model_dir

pytestmark = pytest.mark.real

TEXT = ("The old lighthouse keeper climbed the spiral stairs every evening to light the lamp. "
        "Ships passing in the night relied on its beam to avoid the rocks near the harbour.")


def bits_per_byte(model, ids: list[int], n_scored_bytes: int) -> float:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])
    return float(-logp.sum()) / math.log(2) / n_scored_bytes


@pytest.mark.parametrize("name,limit", [("smollm2-135m", 1.5), ("gemma3-270m", 1.5)])
def test_plain_transformers_load_and_bits_per_byte(name, limit):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = model_dir(name)
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True,
                                                 dtype=torch.float32).eval()
    load_s = time.perf_counter() - t0
    assert getattr(model.config, "quantization_config", None) is None
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    first = len(tok.decode(ids[:1]).encode())
    plain = bits_per_byte(model, ids, len(TEXT.encode()) - first)   # first token unscored
    report = f"{name}: loaded in {load_s:.1f} s, {plain:.3f} bits/byte"
    if tok.bos_token_id is not None and name == "gemma3-270m":
        with_bos = bits_per_byte(model, [tok.bos_token_id] + ids, len(TEXT.encode()))
        report += f" without BOS, {with_bos:.3f} with BOS"
        assert with_bos < plain                        # Gemma needs its <bos>
        plain = with_bos
        assert tok(TEXT)["input_ids"][0] == tok.bos_token_id   # the tokenizer adds it
    print("\n" + report)
    assert plain < limit, report


def test_xdistill_loader_upcasts_the_asset():
    from xdistill.student.model import load_causal_lm

    model = load_causal_lm("smollm2-135m")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert model.config.vocab_size == 49_152


def test_eval_cli_gives_gemma_its_bos_by_default(tmp_path, capsys):
    """``xdistill eval --model gemma3-270m`` equals the ``--bos`` figure (it once scored 1.51
    bits/byte without its <bos> against 1.01 with it); ``--no-bos`` still overrides."""
    import json

    from xdistill.commands.eval import main
    from xdistill.data.prepare import prepare

    raw = tmp_path / "eval.jsonl"
    raw.write_text(json.dumps({"text": TEXT}) + "\n", encoding="utf-8")
    prepare([raw], tmp_path / "eval", progress=False)
    common = ["--model", "gemma3-270m", "--data", str(tmp_path / "eval"), "--seq-len", "24",
              "--batch", "1", "--batches", "1"]
    out = {}
    for flag in ("", "--bos", "--no-bos"):
        assert main(common + ([flag] if flag else [])) == 0
        out[flag] = json.loads(capsys.readouterr().out)
    assert out[""]["add_bos"] is True and out["--no-bos"]["add_bos"] is False
    assert out[""]["bpb"] == out["--bos"]["bpb"]
    assert out["--no-bos"]["bpb"] > out[""]["bpb"] + 0.1, out
