"""The metric keys users see (console, metrics.jsonl, TensorBoard) are pinned: the typed step
metrics are flattened at one edge, and these lists -- names *and* order, as written to
``metrics.jsonl`` -- were taken from the trainer before the metrics became typed.

Two tiny runs on CPU: an off-policy run with two teachers (cross pkl + same forward_kl, CE,
evaluation at the last step) and an on-policy run with two k1 teachers (byte credit on the
cross-tokenizer one: log-ratio means and the credit gap) whose second step is a mixed-in
off-policy batch.
"""

from __future__ import annotations

import json

import onpolicy_helpers as H  # pytest puts this test's folder on sys.path
from train_helpers import base_config

from xdistill.config import from_dict
from xdistill.metrics import read_metrics

OFFPOLICY_STEP = [
    "ce", "cross/loss", "forward_tokens", "loss", "same/loss", "tokens", "cross/coverage",
    "cross/weight", "same/coverage", "same/weight", "units/ce", "units/cross", "units/same",
    "lr", "grad_norm", "step_s", "skipped", "tok_per_s", "rss_mb", "time/data", "time/transport",
    "time/teacher", "time/student", "time/loss", "time/optim"]
OFFPOLICY_EVAL = [
    "eval/loss", "eval/bpb", "eval/tokens", "eval/bytes", "eval/cross/coverage",
    "eval/cross/loss", "eval/same/coverage", "eval/same/loss", "eval/distill_loss"]
ONPOLICY_STEP = [
    "cross/clamp/credit_floor", "cross/clamp/credit_floor_student", "cross/clamp/exp_clip",
    "cross/clamp/logp_floor_student",
    "cross/clamp/logp_floor_teacher", "cross/clamp/loss_clamp", "cross/clamp/unpaired",
    "cross/loss", "cross/missing_bytes", "forward_tokens", "loss", "response_tokens",
    "same/clamp/exp_clip", "same/clamp/logp_floor_student", "same/clamp/logp_floor_teacher",
    "same/clamp/loss_clamp", "same/loss", "same/missing_bytes", "tokens", "cross/coverage",
    "cross/tool_ratio", "cross/unaligned_frac", "cross/weight", "offpolicy",
    "onpolicy/unaligned_frac", "response_len", "same/coverage", "same/tool_ratio",
    "same/unaligned_frac", "same/weight", "stop_fraction", "tool_token_ratio", "units/cross",
    "units/same", "same/mean_logratio", "cross/mean_logratio", "cross/credit_gap",
    "cross/credit_gap_seg", "lr",
    "grad_norm", "step_s", "skipped", "tok_per_s", "rss_mb", "time/data", "time/generation", "time/score",
    "time/transport", "time/teacher", "time/student", "time/loss", "time/optim"]
ONPOLICY_MIX_STEP = [
    "ce", "cross/loss", "loss", "same/loss", "tokens", "cross/coverage", "cross/weight",
    "offpolicy", "same/coverage", "same/weight", "units/ce", "units/cross", "units/same", "lr",
    "grad_norm", "step_s", "skipped", "tok_per_s", "rss_mb", "time/data", "time/transport",
    "time/teacher", "time/student", "time/loss", "time/optim"]


def _records(out):
    return [{k: v for k, v in r.items() if k not in ("step", "time")}
            for r in read_metrics(out / "metrics.jsonl")]


def offpolicy_run(tiny_assets, out):
    from xdistill.train.config import OffPolicyConfig
    from xdistill.train.offpolicy import run_offpolicy

    cfg = base_config(tiny_assets, out)
    cfg["train"].update(steps=2, log_samples=False)
    cfg["eval"] = {"every": 2, "paths": [tiny_assets["eval"]], "batches": 2}
    return run_offpolicy(from_dict(OffPolicyConfig, cfg)), _records(out)


def onpolicy_run(tiny_assets, out):
    from xdistill.train.onpolicy import run_onpolicy
    from xdistill.train.onpolicy_config import OnPolicyConfig

    teachers = [H.teacher("same", tiny_assets["tok_s"], tiny_assets["same"], "k1"),
                H.teacher("cross", tiny_assets["tok_t"], tiny_assets["cross"], "k1")]
    prompts = H.write_prompts(out.parent / f"{out.name}_prompts.jsonl")
    d = H.onpolicy_dict(tiny_assets["tok_s"], teachers, prompts, out, steps=2)
    d["train"]["log_samples"] = False
    d["loss"].update(credit="byte", offpolicy_lambda=0.5)
    d["offpolicy"] = {"data": {"paths": [tiny_assets["train"]], "seq_len": 32, "batch_size": 2,
                               "num_workers": 0}, "ce_weight": 0.1}
    return run_onpolicy(from_dict(OnPolicyConfig, d)), _records(out)


def test_offpolicy_metric_keys_are_pinned(tmp_path, tiny_assets):
    final, recs = offpolicy_run(tiny_assets, tmp_path / "off")
    print("OFFPOLICY", json.dumps([list(r) for r in recs]))
    assert [list(r) for r in recs] == [OFFPOLICY_STEP, OFFPOLICY_STEP, OFFPOLICY_EVAL]
    assert list(final) == OFFPOLICY_STEP + OFFPOLICY_EVAL


def test_onpolicy_metric_keys_are_pinned(tmp_path, tiny_assets):
    final, recs = onpolicy_run(tiny_assets, tmp_path / "on")
    print("ONPOLICY", json.dumps([list(r) for r in recs]))
    assert [list(r) for r in recs] == [ONPOLICY_STEP, ONPOLICY_MIX_STEP]
    assert list(final) == ONPOLICY_MIX_STEP
