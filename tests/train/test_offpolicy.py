"""End-to-end off-policy runs: 2-rank FSDP2 == 1 process, kill-and-resume, LR schedule, export.

The tiny assets (tests/train/conftest.py) pair a student BPE with a different-vocabulary teacher
BPE (cross-tokenizer teacher, pkl through a built projection) and a same-tokenizer teacher
(forward KL). One e2e test uses the real GPT-2 / Qwen2 tokenizers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from xdistill.metrics import read_metrics

import train_helpers as helpers
from train_helpers import base_config, run_cli, write_config


def _train(tmp: Path, name: str, cfg: dict, nproc: int = 1, expect_rc: int = 0, extra=(),
           env=None):
    path = write_config(tmp / f"{name}.yaml", cfg)
    proc = run_cli(["train", "offpolicy", "--config", str(path), *extra], nproc=nproc, env=env)
    assert proc.returncode == expect_rc, f"rc {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


_weights, _train_records = helpers.exported_weights, helpers.train_records


def _samples(out_dir: Path, rank: int = 0) -> dict[int, list[str]]:
    lines = (out_dir / f"samples_rank{rank}.jsonl").read_text().splitlines()
    return {r["step"]: r["hashes"] for r in map(json.loads, lines)}


@pytest.mark.integration
def test_two_ranks_fsdp_equal_one_process(tmp_path, tiny_assets):
    """2 ranks (FSDP2, gloo) vs 1 process reading the same 2 data shards: same losses, same
    weights within fp32 tolerance; the loss decreases."""
    cfg = base_config(tiny_assets, tmp_path / "two")
    cfg["train"]["steps"] = 5
    cfg["checkpoint"]["export_hf"] = True
    proc = _train(tmp_path, "two", cfg, nproc=2)
    # the ranks leave by os._exit (xdistill.distributed.leave_process): their last lines still arrive
    assert "[xdistill rank 0] done: 5 step(s)" in proc.stdout + proc.stderr
    cfg1 = base_config(tiny_assets, tmp_path / "one")
    cfg1["train"].update(steps=5, data_ranks=2)
    cfg1["checkpoint"]["export_hf"] = True
    _train(tmp_path, "one", cfg1)
    two, one = _train_records(tmp_path / "two"), _train_records(tmp_path / "one")
    assert [r["step"] for r in two] == [r["step"] for r in one] == [1, 2, 3, 4, 5]
    for a, b in zip(two, one):
        for key in ("loss", "cross/loss", "same/loss", "ce", "lr", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (a["step"], key)
        assert a["units/cross"] == b["units/cross"] and a["units/same"] == b["units/same"]
    assert one[-1]["loss"] < one[0]["loss"]
    w2, w1 = _weights(tmp_path / "two"), _weights(tmp_path / "one")
    # sharded and plain exports hold the same tensors: the tied lm_head is written by neither
    assert sorted(w2) == sorted(w1) and "lm_head.weight" not in w1
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=2e-5)
    # every window once: rank r of the 2-rank run saw exactly shard r of the 1-process run
    both = _samples(tmp_path / "two", 0), _samples(tmp_path / "two", 1)
    single = _samples(tmp_path / "one")
    for step, hashes in single.items():
        assert both[0][step] + both[1][step] == hashes


@pytest.mark.integration
def test_kill_and_resume_is_bitwise(tmp_path, tiny_assets):
    """A run killed right after its step-3 checkpoint and resumed ends with the same weights
    (bitwise) as an uninterrupted run and sees each window exactly once; the LR that the
    optimizer used at every step is the configured warmup + cosine schedule."""
    full = base_config(tiny_assets, tmp_path / "full")
    full["data"]["num_workers"] = 1  # the loader state lives in a worker process
    full["checkpoint"].update(every=3, export_hf=True)
    _train(tmp_path, "full", full)
    cut = json.loads(json.dumps(full))
    cut["train"].update(out_dir=str(tmp_path / "cut"), stop_after=3)
    _train(tmp_path, "cut", cut, expect_rc=3)
    assert (tmp_path / "cut" / "checkpoints" / "step_0000003" / "COMPLETE").is_file()
    assert not (tmp_path / "cut" / "export").exists()
    cut["train"]["stop_after"] = 0
    proc = _train(tmp_path, "cut", cut, extra=["--resume", "auto"])
    assert "resumed from" in proc.stderr
    wa, wb = _weights(tmp_path / "full"), _weights(tmp_path / "cut")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    sa, sb = _samples(tmp_path / "full"), _samples(tmp_path / "cut")
    assert sorted(sb) == list(range(1, 7)) and sa == sb
    seen = [h for s in sorted(sb) for h in sb[s]]
    assert len(seen) == len(set(seen)) == 6 * 4
    # the LR schedule the optimizer used (read from optimizer.param_groups at each step)
    lrs = {r["step"]: r["lr"] for r in _train_records(tmp_path / "full")}
    peak, warm, total, floor = 1.0e-2, 2, 6, 0.1
    for s in range(1, 7):
        i = s - 1
        if i < warm:
            want = peak * (i + 1) / warm
        else:
            p = (i - warm) / (total - warm)
            want = peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p)))
        assert lrs[s] == pytest.approx(want, rel=1e-9), s



@pytest.mark.integration
def test_resuming_an_older_checkpoint_sets_the_later_ones_aside(tmp_path, tiny_assets):
    """Back to step 2 of a 6-step run (checkpoints every 2, keep_last 2), now for 3 steps: the
    later checkpoints (4, 6) are renamed, not deleted, so keep_last keeps the new branch's step
    3 (it used to delete it at once, 4 and 6 having higher steps) and resume: auto finds it."""
    from xdistill.train.checkpoint import latest_checkpoint

    cfg = base_config(tiny_assets, tmp_path / "run")
    cfg["checkpoint"].update(every=2, keep_last=2)
    _train(tmp_path, "first", cfg)
    root = tmp_path / "run" / "checkpoints"
    first = root / "step_0000002"
    assert not first.exists()      # pruned: keep_last 2 kept 4 and 6
    # a copy of step 2 from another run of the same config, resumed by path
    cfg2 = base_config(tiny_assets, tmp_path / "other")
    cfg2["checkpoint"].update(every=2, keep_last=0)
    cfg2["train"]["steps"] = 2
    _train(tmp_path, "other", cfg2)
    cfg["checkpoint"]["every"] = 1
    cfg["train"]["steps"] = 3
    proc = _train(tmp_path, "back", cfg,
                  extra=["--resume", str(tmp_path / "other" / "checkpoints" / "step_0000002")])
    assert "2 checkpoint(s) of later steps set aside as another branch" in proc.stderr
    names = sorted(p.name for p in root.iterdir())
    assert names == ["step_0000003", "step_0000004.abandoned", "step_0000006.abandoned"], names
    assert latest_checkpoint(root) == root / "step_0000003"
    assert (root / "step_0000006.abandoned" / "COMPLETE").is_file()   # intact, loadable by path

@pytest.mark.integration
def test_kill_and_resume_is_bitwise_under_auto_bf16(tmp_path, tiny_assets):
    """dtype auto resolved to bfloat16 (XDISTILL_AUTO_DTYPE stands in for a CPU with AMX in
    these processes): teachers load in bf16, the student computes in bf16 on float32 master
    weights, and a run killed after its step-3 checkpoint and resumed ends bitwise equal to the
    uninterrupted run; the exported weights are the float32 masters."""
    env = {"XDISTILL_AUTO_DTYPE": "bfloat16"}
    full = base_config(tiny_assets, tmp_path / "full")
    full["checkpoint"].update(every=3, export_hf=True)
    proc = _train(tmp_path, "full", full, env=env)
    assert "student compute: dtype auto -> bfloat16" in proc.stderr
    assert "teacher 'cross': dtype auto -> bfloat16" in proc.stderr
    cut = json.loads(json.dumps(full))
    cut["train"].update(out_dir=str(tmp_path / "cut"), stop_after=3)
    _train(tmp_path, "cut", cut, expect_rc=3, env=env)
    cut["train"]["stop_after"] = 0
    _train(tmp_path, "cut", cut, extra=["--resume", "auto"], env=env)
    wa, wb = _weights(tmp_path / "full"), _weights(tmp_path / "cut")
    assert all(v.dtype == torch.float32 for v in wa.values())
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    f32 = base_config(tiny_assets, tmp_path / "f32")
    _train(tmp_path, "f32", f32)
    loss_bf16 = [r["loss"] for r in _train_records(tmp_path / "full")]
    loss_f32 = [r["loss"] for r in _train_records(tmp_path / "f32")]
    assert loss_bf16 != loss_f32 and loss_bf16 == pytest.approx(loss_f32, rel=2e-2)


def test_real_tokenizers_end_to_end(tmp_path, tiny_assets):
    """GPT-2 student, Qwen2 teacher (exact_kl over the shared vocabulary of aligned 1:1 chunks) +
    GPT-2 teacher (forward KL), real
    fetched tokenizers: the loss decreases, evaluation reports bits per byte, and the export
    loads with AutoModelForCausalLM."""
    import sys

    from transformers import AutoModelForCausalLM

    import xdistill.tiny as mk

    from xdistill.config import from_dict
    from xdistill.train.config import OffPolicyConfig
    from xdistill.train.offpolicy import run_offpolicy

    qwen = mk.save_tiny_lm(tmp_path / "t_qwen", "qwen2", seed=1, hidden_size=16,
                           intermediate_size=32)
    gpt = mk.save_tiny_lm(tmp_path / "t_gpt", "gpt2", seed=2, hidden_size=16,
                          intermediate_size=32)
    cfg = base_config(tiny_assets, tmp_path / "run", cross_kind="exact_kl")
    cfg["student_tokenizer"] = "gpt2"
    cfg["student"]["model_config"].update(hidden_size=16, intermediate_size=32)
    cfg["teachers"][0].update(name="qwen", tokenizer="qwen2", worker={"model": str(qwen)})
    cfg["teachers"][1].update(name="gpt", tokenizer="gpt2", worker={"model": str(gpt)})
    cfg["data"]["seq_len"] = 32
    cfg["loss"]["ce_weight"] = 1.0
    cfg["optim"]["lr"] = 3.0e-2
    cfg["train"].update(steps=5, log_samples=False)
    cfg["checkpoint"]["export_hf"] = True
    cfg["eval"] = {"every": 0, "paths": [tiny_assets["eval"]], "batches": 1}
    run_offpolicy(from_dict(OffPolicyConfig, cfg))
    out = tmp_path / "run"
    recs = _train_records(out)
    assert recs[-1]["loss"] < recs[0]["loss"]
    assert 0.5 < recs[0]["qwen/coverage"] <= 1.0 and recs[0]["gpt/coverage"] == 1.0
    ev = [r for r in read_metrics(out / "metrics.jsonl") if "eval/bpb" in r]
    assert len(ev) == 1 and ev[0]["step"] == 5
    assert ev[0]["eval/bpb"] == pytest.approx(ev[0]["eval/loss"] * ev[0]["eval/tokens"]
                                              / math.log(2) / ev[0]["eval/bytes"], rel=1e-9)
    assert ev[0]["eval/qwen/loss"] > 0 and 0.5 < ev[0]["eval/qwen/coverage"] <= 1.0
    model = AutoModelForCausalLM.from_pretrained(str(out / "export"), local_files_only=True)
    assert model.config.vocab_size == 50257


@pytest.mark.integration
@pytest.mark.slow
def test_kill_and_resume_two_ranks(tmp_path, tiny_assets):
    """2-rank FSDP2: killed after the step-3 checkpoint and resumed == uninterrupted (fp32
    tolerance), each rank sees each of its windows exactly once. As users run it: 2 threads per
    rank, a loader worker per rank, no OMP_NUM_THREADS (a resume once hung only then)."""
    env = {"OMP_NUM_THREADS": None}
    full = base_config(tiny_assets, tmp_path / "full")
    full["checkpoint"].update(every=3, export_hf=True)
    full["train"]["num_threads"] = 2
    full["data"]["num_workers"] = 1
    _train(tmp_path, "full", full, nproc=2, env=env)
    cut = json.loads(json.dumps(full))
    cut["train"].update(out_dir=str(tmp_path / "cut"), stop_after=3)
    path = write_config(tmp_path / "cut.yaml", cut)
    proc = run_cli(["train", "offpolicy", "--config", str(path)], nproc=2, env=env)
    assert proc.returncode != 0 and "exiting hard" in proc.stderr
    cut["train"]["stop_after"] = 0
    _train(tmp_path, "cut", cut, nproc=2, env=env)
    wa, wb = _weights(tmp_path / "full"), _weights(tmp_path / "cut")
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-5, atol=1e-6)
    for rank in (0, 1):
        sa, sb = _samples(tmp_path / "full", rank), _samples(tmp_path / "cut", rank)
        assert sorted(sb) == list(range(1, 7)) and sa == sb


@pytest.mark.parametrize("kinds", [("uld", "gold"), ("alm", "gold")])
def test_chunk_likelihood_and_vocabulary_free_losses_train(tmp_path, tiny_assets, kinds):
    """Cross-tokenizer teachers with ALM / ULD / GOLD losses train for 2 steps: every term is
    finite and positive, counted over loss chunks, and the student weights move."""
    from xdistill.config import from_dict
    from xdistill.train.config import OffPolicyConfig
    from xdistill.train.offpolicy import run_offpolicy

    cfg = base_config(tiny_assets, tmp_path / "run")
    cross = cfg["teachers"][0]
    cfg["teachers"] = [dict(cross, name=kind, loss={"kind": kind, "weight": 1.0}) for kind in kinds]
    cfg["train"].update(steps=2, log_samples=False)
    cfg["checkpoint"]["export_hf"] = True
    metrics = run_offpolicy(from_dict(OffPolicyConfig, cfg))
    recs = _train_records(tmp_path / "run")
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        assert math.isfinite(r["loss"]) and r["loss"] > 0
        for kind in kinds:
            assert math.isfinite(r[f"{kind}/loss"]) and r[f"{kind}/loss"] > 0, (kind, r)
            assert r[f"units/{kind}"] > 0 and 0 < r[f"{kind}/coverage"] <= 1
    assert metrics["grad_norm"] > 0
    from xdistill.student.model import build_causal_lm

    trained = _weights(tmp_path / "run")
    vocab = trained["model.embed_tokens.weight"].shape[0]
    fresh = build_causal_lm("llama", dict(helpers.TINY_STUDENT, vocab_size=vocab), seed=0)
    assert not torch.equal(trained["model.embed_tokens.weight"],
                           fresh.state_dict()["model.embed_tokens.weight"])


def test_pkl_continuation_trains_through_the_cli_config(tmp_path, tiny_assets):
    """``loss.continuation`` on a pkl teacher whose tokenizer has fewer merges than the student's
    (400-id student, 320-id teacher: many student tokens are several teacher pieces): the trie is
    built from the real pair and the term is added to P-KL (step 1 sees the same student and
    batch for both teachers, so cont > plain)."""
    from xdistill.config import from_dict
    from xdistill.projection import BuildConfig, build_projection, save_projection
    from xdistill.tokenization import load_tokenizer
    from xdistill.train.config import OffPolicyConfig
    from xdistill.train.offpolicy import run_offpolicy

    s, t = load_tokenizer(tiny_assets["tok_t"]), load_tokenizer(tiny_assets["tok_s"])
    proj = save_projection(build_projection(s, t, BuildConfig(methods=("multitoken", "exact"))),
                           tmp_path / "proj_t_s.npz")[0]
    cfg = base_config(tiny_assets, tmp_path / "run")
    cfg["student_tokenizer"] = tiny_assets["tok_t"]
    cross = dict(cfg["teachers"][0], tokenizer=tiny_assets["tok_s"],
                 worker=dict(cfg["teachers"][0]["worker"], model=tiny_assets["same"]),
                 loss={"kind": "pkl", "weight": 1.0, "projection": str(proj)})
    cont = dict(cross, name="cont", loss=dict(cross["loss"], continuation=True))
    cfg["teachers"] = [dict(cross, name="plain"), cont]
    cfg["train"].update(steps=2, log_samples=False)
    run_offpolicy(from_dict(OffPolicyConfig, cfg))
    first = _train_records(tmp_path / "run")[0]
    assert math.isfinite(first["cont/loss"])
    assert first["cont/loss"] > first["plain/loss"] > 0


@pytest.mark.parametrize("teachers", [False, True], ids=["ce_only", "with_teachers"])
def test_label_smoothing_reaches_the_ce_term(tmp_path, tiny_assets, teachers):
    """`loss.label_smoothing` eps changes step 1's logged CE to (1 - eps) CE + eps U, where U, the
    CE to the uniform distribution, is >= log V (Jensen) and close to it for a fresh model: on
    the CE-only path and inside the teachers' loss alike."""
    from xdistill.config import from_dict
    from xdistill.tokenization import load_tokenizer
    from xdistill.train.config import OffPolicyConfig
    from xdistill.train.offpolicy import run_offpolicy

    ce = {}
    for eps in (0.0, 0.3):
        cfg = base_config(tiny_assets, tmp_path / f"run{eps}")
        if not teachers:
            cfg["teachers"] = []
        cfg["loss"].update(ce_weight=1.0, label_smoothing=eps)
        cfg["train"].update(steps=1, log_samples=False)
        run_offpolicy(from_dict(OffPolicyConfig, cfg))
        ce[eps] = _train_records(tmp_path / f"run{eps}")[0]["ce"]
    log_v = math.log(load_tokenizer(tiny_assets["tok_s"]).vocab_size)
    uniform = (ce[0.3] - 0.7 * ce[0.0]) / 0.3
    assert log_v - 1e-4 <= uniform < log_v + 0.5, (ce, log_v)


def test_support_output_trains_like_full_logits(tmp_path, tiny_assets):
    """A pkl teacher with ``worker.output: support`` (its head computes only the projection's
    support columns) next to the same teacher with full logits: every step's two loss terms are
    equal (the same student and batch), through the trainer as configured; a support teacher
    with another loss, or with scored weighting, is refused at load naming its key."""
    from xdistill.config import from_dict
    from xdistill.errors import ConfigError
    from xdistill.train.config import OffPolicyConfig, validate_offpolicy
    from xdistill.train.offpolicy import run_offpolicy

    cfg = base_config(tiny_assets, tmp_path / "run")
    cross = cfg["teachers"][0]
    support = dict(cross, name="support", worker=dict(cross["worker"], output="support"))
    cfg["teachers"] = [dict(cross, name="full"), support]
    cfg["train"].update(steps=3, log_samples=False)
    run_offpolicy(from_dict(OffPolicyConfig, cfg))
    recs = _train_records(tmp_path / "run")
    assert [r["step"] for r in recs] == [1, 2, 3]
    for r in recs:
        assert r["full/loss"] > 0
        assert r["support/loss"] == pytest.approx(r["full/loss"], rel=1e-5), r
    bad = dict(support, loss={"kind": "alm", "weight": 1.0})
    with pytest.raises(ConfigError, match=r"teachers.0.worker.output: 'support' outputs .* only "
                                          r"feed loss 'pkl', got loss.kind 'alm'"):
        validate_offpolicy(from_dict(OffPolicyConfig, dict(cfg, teachers=[bad])))
    scored = dict(cfg, loss=dict(cfg["loss"], weighting="dynamic"))
    with pytest.raises(ConfigError, match="teachers.1.worker.output: 'support' outputs carry no "
                                          "scores"):
        validate_offpolicy(from_dict(OffPolicyConfig, scored))
