"""On-policy trainer end to end (tiny models, CPU): learning, zero loss for a self-teacher, tool
masks through the step, bitwise resume.

The tiny assets (tests/train/conftest.py) pair a student BPE (320 ids) with a teacher BPE (400 ids,
a cross-tokenizer teacher through a built projection). Teachers here are tiny Llamas
briefly trained on Shakespeare, so the student has something learnable to move towards.

Legend: B samples, Ts student tokens, V vocabulary.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import onpolicy_helpers as H  # pytest puts this test's folder on sys.path
import pytest
import torch

from xdistill.config import from_dict
from xdistill.train.onpolicy_config import OnPolicyConfig
from xdistill.train.metrics import Timers


@pytest.fixture(scope="module")
def sharp(tiny_assets, tmp_path_factory):
    import xdistill.tiny as mk

    root = tmp_path_factory.mktemp("onpolicy")
    texts = mk.passages(limit=60)
    same = H.save_lm(root / "same", tiny_assets["tok_s"], seed=1)
    cross = H.save_lm(root / "cross", tiny_assets["tok_t"], seed=2)
    for folder in (same, cross):  # a little Shakespeare: distributions the student can learn
        mk.pretrain(Path(folder), texts, steps=15, lr=2e-2)
    return {"same": same, "cross": cross,
            "self": H.save_lm(root / "self", tiny_assets["tok_s"], seed=3, logit_scale=10.0),
            "prompts": H.write_prompts(root / "prompts.jsonl")}


def _two_teacher_dict(assets, sharp, out, *, same_kind="reverse_kl", cross_kind="reverse_kl",
                      steps=4):
    teachers = [H.teacher("same", assets["tok_s"], sharp["same"], same_kind),
                H.teacher("cross", assets["tok_t"], sharp["cross"], cross_kind,
                          projection=assets["proj"])]
    return H.onpolicy_dict(assets["tok_s"], teachers, sharp["prompts"], out, steps=steps)


def _built(d):
    from xdistill.train.onpolicy import build_onpolicy_run

    run = build_onpolicy_run(from_dict(OnPolicyConfig, d))
    run.mode.pool.start()
    return run


def _eval_losses(run, scored) -> dict:
    from xdistill.train.onpolicy_step import loss_and_backward

    with torch.no_grad():
        m = loss_and_backward(run, scored, Timers(), backward=False)
    return {k: m[f"{k}/loss"] for k in run.plan.specs}


def test_reverse_kl_to_both_teachers_decreases(tmp_path, tiny_assets, sharp):
    """run_onpolicy with a same-tokenizer and a cross-tokenizer (projection) teacher: the reverse
    KL of the student to each teacher, on fixed rollouts of the initial student, decreases."""
    from safetensors.torch import load_file

    from xdistill.train.onpolicy import rollout_batch, run_onpolicy

    d = _two_teacher_dict(tiny_assets, sharp, tmp_path / "run", steps=12)
    d["optim"]["lr"] = 3.0e-2
    d["checkpoint"]["export_hf"] = True
    metrics = run_onpolicy(from_dict(OnPolicyConfig, d))
    assert metrics["units/same"] > 0 and metrics["units/cross"] > 0
    assert 0.3 < metrics["cross/coverage"] <= 1.0 and metrics["same/coverage"] == 1.0
    ev = json.loads(json.dumps(d))
    ev["train"]["out_dir"] = str(tmp_path / "eval")
    run = _built(ev)
    try:
        run.mode.iters = [iter(run.mode.loaders[0])]
        _, _, scored = rollout_batch(run, 1000, Timers())
        before = _eval_losses(run, scored)
        state = load_file(str(tmp_path / "run" / "export" / "model.safetensors"))
        run.model.load_state_dict(state, strict=False)
        after = _eval_losses(run, scored)
    finally:
        run.mode.pool.close()
    print("reverse KL before/after", before, after)
    for name in ("same", "cross"):
        assert after[name] < 0.8 * before[name], (name, before, after)


@pytest.mark.parametrize("kind", ["reverse_kl", "jsd", "k1", "k3", "topk_kl", "strict_topk", "dpca",
                                  "simple_opd", "bpm", "escd"])
def test_self_teacher_zero_loss_and_gradient(tmp_path, tiny_assets, sharp, kind):
    """Teacher = the student's own weights and tokenizer: zero loss, zero gradient through the
    loop's step (rollouts -> scoring -> pool -> loss -> backward)."""
    from xdistill.train.onpolicy import rollout_batch
    from xdistill.train.onpolicy_step import loss_and_backward

    d = H.onpolicy_dict(tiny_assets["tok_s"], [H.teacher("self", tiny_assets["tok_s"],
                                                         sharp["self"], kind)],
                        sharp["prompts"], tmp_path, student_path=sharp["self"])
    run = _built(d)
    try:
        run.mode.iters = [iter(run.mode.loaders[0])]
        _, ro, scored = rollout_batch(run, 1, Timers())
        m = loss_and_backward(run, scored, Timers())
    finally:
        run.mode.pool.close()
    assert m["units/self"] == int(scored.batch.loss_mask_BTs[:, 1:].sum()) > 10
    assert abs(m["self/loss"]) < 1e-5
    grads = [p.grad.abs().max() for p in run.model.parameters() if p.grad is not None]
    assert grads and float(max(grads)) < 1e-5


@pytest.mark.parametrize("kind", ["k1", "dpca"])
def test_clipped_mean_baseline_through_the_step(tmp_path, tiny_assets, sharp, kind):
    """``loss.advantage_baseline: clipped_mean`` from the config to the loss: a cross-tokenizer
    teacher's step loss is finite and differs from "mean"'s on the same rollouts (a tight clamp,
    so the first clamp fires; the self-teacher zero is checked at the loss level)."""
    from xdistill.train.onpolicy import rollout_batch
    from xdistill.train.onpolicy_step import loss_and_backward

    losses = {}
    for baseline in ("mean", "clipped_mean"):
        d = H.onpolicy_dict(tiny_assets["tok_s"], [H.teacher("cross", tiny_assets["tok_t"],
                                                             sharp["cross"], kind)],
                            sharp["prompts"], tmp_path / baseline, student_path=sharp["self"])
        d["loss"].update(advantage_baseline=baseline, loss_max=0.5)
        run = _built(d)
        try:
            run.mode.iters = [iter(run.mode.loaders[0])]
            _, _, scored = rollout_batch(run, 1, Timers())
            losses[baseline] = loss_and_backward(run, scored, Timers())["cross/loss"]
        finally:
            run.mode.pool.close()
    assert all(math.isfinite(v) for v in losses.values())
    assert losses["mean"] != losses["clipped_mean"]


def _tool_mask_check(run, scored):
    """Backward of the step's loss; student logits rows predicting a tool/prompt token get no
    gradient, rows predicting LLM tokens do; no loss chunk holds a teacher token with loss 0."""
    from xdistill.losses import ChunkAlignment, loss_chunks
    from xdistill.train.onpolicy_step import loss_and_backward

    captured = {}

    def hook(_mod, _inp, out):
        out.logits.retain_grad()
        captured["z"] = out.logits

    handle = run.model.register_forward_hook(hook)
    try:
        loss_and_backward(run, scored, Timers())
    finally:
        handle.remove()
    g_BTs = captured["z"].grad.abs().sum(-1)
    b = scored.batch
    target = torch.zeros_like(b.loss_mask_BTs)
    target[:, :-1] = b.loss_mask_BTs[:, 1:]
    assert float(g_BTs[~target].abs().max()) == 0.0
    assert int((g_BTs[target] > 0).sum()) > 0.5 * int(target.sum())
    for view in b.teachers:
        if view.identity:
            continue
        align = ChunkAlignment.from_view(view)
        ok_BC = loss_chunks(align, b.loss_mask_BTs, view.loss_mask_BTt)
        t_in = (align.t_chunk_BTt >= 0) & ok_BC.gather(1, align.t_chunk_BTt.clamp(min=0))
        assert bool(view.loss_mask_BTt[t_in].all())
        assert 0 < int(view.loss_mask_BTt.sum()) < int(view.attention_mask_BTt.sum())


SEGMENTS = [
    ("Ask the oracle:", [("Let me call it. <call>oracle(x)</call>", True),
                         ("\n[tool] the answer is 42; humidity 70%\n", False),
                         ("So the answer is 42.", True)]),
    ("Compute 12*7:", [(" calc(12*7)", True), (" => 84 ", False), ("It is 84.", True),
                       (" [env] episode over ", False)]),
]


@pytest.mark.parametrize("kinds", [("k3", "reverse_kl"), ("reverse_kl", "k1")])
def test_tool_spans_get_no_loss_through_the_step(tmp_path, tiny_assets, sharp, kinds):
    from xdistill.rollout import rollouts_from_segments

    run = _built(_two_teacher_dict(tiny_assets, sharp, tmp_path, same_kind=kinds[0],
                                   cross_kind=kinds[1]))
    try:
        ro = rollouts_from_segments(run.plan.student_tok, [p for p, _ in SEGMENTS],
                                    [s for _, s in SEGMENTS])
        scored = run.mode.scorer(ro)
        assert 0.2 < scored.stats.tool_token_ratio < 0.8
        _tool_mask_check(run, scored)
    finally:
        run.mode.pool.close()


def test_resume_reproduces_uninterrupted_run(tmp_path, tiny_assets, sharp):
    """4 steps in one go == 2 steps + checkpoint, then a fresh run resuming to 4: bitwise equal
    weights, same prompt order, same sampled responses."""
    from safetensors.torch import load_file

    from xdistill.train.onpolicy import run_onpolicy

    def cfg(out, steps):
        d = _two_teacher_dict(tiny_assets, sharp, out, same_kind="k3", steps=steps)
        d["scheduler"] = {"kind": "cosine", "warmup_steps": 1, "total_steps": 4}
        d["checkpoint"].update(every=2, export_hf=True)
        d["prompts"]["batch_size"] = 3  # 12 prompts: the 4-step run crosses an epoch boundary
        return from_dict(OnPolicyConfig, d)

    run_onpolicy(cfg(tmp_path / "full", 4))
    run_onpolicy(cfg(tmp_path / "cut", 2))
    assert (tmp_path / "cut" / "checkpoints" / "step_0000002" / "COMPLETE").is_file()
    run_onpolicy(cfg(tmp_path / "cut", 4))
    wa = load_file(str(tmp_path / "full" / "export" / "model.safetensors"))
    wb = load_file(str(tmp_path / "cut" / "export" / "model.safetensors"))
    assert sorted(wa) == sorted(wb) and all(torch.equal(wa[k], wb[k]) for k in wa)

    def samples(out):
        lines = (out / "samples_rank0.jsonl").read_text().splitlines()
        return {r["step"]: (r["prompts"], r["responses"]) for r in map(json.loads, lines)}

    sa, sb = samples(tmp_path / "full"), samples(tmp_path / "cut")
    # the resumed run wrote steps 3 and 4 only (a run from scratch would repeat 1 and 2)
    assert len((tmp_path / "cut" / "samples_rank0.jsonl").read_text().splitlines()) == 4
    assert sorted(sa) == sorted(sb) == [1, 2, 3, 4] and sa == sb
    first_epoch = [i for s in (1, 2, 3, 4) for i in sa[s][0]][:12]
    assert sorted(first_epoch) == list(range(12))


def test_real_tokenizers_end_to_end(tmp_path):
    """GPT-2 student; teachers over the real Qwen2 (cross, reverse KL over exact 1:1 chunks) and
    GPT-2 (identity) tokenizers: run_onpolicy trains, logs the time split, and tool spans of
    multi-turn data get no loss through the step for both teachers."""
    from xdistill.train.onpolicy import build_onpolicy_run, run_onpolicy
    from xdistill.rollout import rollouts_from_segments

    qwen = H.save_lm(tmp_path / "qwen", "qwen2", seed=1, hidden_size=16, intermediate_size=32)
    gpt = H.save_lm(tmp_path / "gpt", "gpt2", seed=2, hidden_size=16, intermediate_size=32)
    teachers = [H.teacher("qwen", "qwen2", qwen, cross="exact"), H.teacher("gpt", "gpt2", gpt)]
    d = H.onpolicy_dict("gpt2", teachers, H.write_prompts(tmp_path / "p.jsonl"), tmp_path / "run",
                        steps=2)
    d["student"]["model_config"].update(hidden_size=16, intermediate_size=32)
    m = run_onpolicy(from_dict(OnPolicyConfig, d))
    assert m["units/qwen"] > 0 and m["units/gpt"] > 0 and m["gpt/coverage"] == 1.0
    assert all(m[f"time/{k}"] > 0 for k in ("generation", "score", "teacher", "student", "optim"))
    assert m["qwen/loss"] > 0 and m["gpt/loss"] > 0
    d["train"]["out_dir"] = str(tmp_path / "mask")
    run = build_onpolicy_run(from_dict(OnPolicyConfig, d))
    run.mode.pool.start()
    try:
        ro = rollouts_from_segments(run.plan.student_tok, [p for p, _ in SEGMENTS],
                                    [s for _, s in SEGMENTS])
        _tool_mask_check(run, run.mode.scorer(ro))
    finally:
        run.mode.pool.close()


def test_offpolicy_mixing(tmp_path, tiny_assets, sharp):
    """loss.offpolicy_lambda = 0.5 (ratio): step 2 trains on an off-policy corpus batch through
    the off-policy path (derived kinds: same k3 -> forward_kl, cross reverse_kl -> pkl)."""
    from xdistill.metrics import read_metrics
    from xdistill.train.onpolicy import run_onpolicy

    d = _two_teacher_dict(tiny_assets, sharp, tmp_path, same_kind="k3", steps=2)
    d["loss"]["offpolicy_lambda"] = 0.5
    d["offpolicy"] = {"data": {"paths": [tiny_assets["train"]], "seq_len": 32, "batch_size": 2,
                               "num_workers": 0}, "ce_weight": 0.1}
    run_onpolicy(from_dict(OnPolicyConfig, d))
    recs = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "loss" in r]
    assert [r["offpolicy"] for r in recs] == [0.0, 1.0]
    assert recs[1]["same/loss"] > 0 and recs[1]["cross/loss"] > 0 and recs[1]["ce"] > 0


@pytest.mark.integration
def test_two_ranks_shard_prompts_and_train_one_student(tmp_path, tiny_assets, sharp):
    """``torchrun`` with 2 gloo ranks through the real CLI: every rank samples its own shard of the
    prompts (disjoint; one epoch of the 12 prompts over 3 steps), generation stays in lockstep
    although responses end at different lengths, unit counts and losses are reduced over ranks,
    and one student is exported."""
    import importlib.util
    import math

    import yaml

    from xdistill.metrics import read_metrics

    spec = importlib.util.spec_from_file_location("train_conftest_cli",
                                                  Path(__file__).resolve().parent / "conftest.py")
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)
    out = tmp_path / "two"
    d = _two_teacher_dict(tiny_assets, sharp, out, same_kind="k3", steps=3)
    d["prompts"]["batch_size"] = 2  # per rank: 2 ranks x 2 prompts x 3 steps = the 12 prompts
    d["checkpoint"]["export_hf"] = True
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(d), encoding="utf-8")
    proc = helpers.run_cli(["train", "onpolicy", "--config", str(path)], nproc=2)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    shards = []
    for rank in (0, 1):
        rows = [json.loads(x) for x in (out / f"samples_rank{rank}.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2, 3]
        shards.append([i for r in rows for i in r["prompts"]])
    assert not set(shards[0]) & set(shards[1])
    assert sorted(shards[0] + shards[1]) == list(range(12))
    steps = [m for m in read_metrics(out / "metrics.jsonl") if "units/cross" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    for m in steps:
        assert m["units/same"] > 0 and m["units/cross"] > 0
        assert math.isfinite(m["same/loss"]) and math.isfinite(m["cross/loss"])
    assert (out / "export" / "model.safetensors").is_file()


@pytest.mark.integration
def test_two_ranks_two_tokenizer_families_with_2026_kinds(tmp_path, tiny_assets, sharp):
    """``torchrun`` with 2 gloo ranks, two threads per rank, gradient accumulation (2 micro-batches
    per rank per step): a SentencePiece-style teacher (the Mistral tokenizer, byte fallback,
    escd through its byte-prefix map) and a byte-level BPE teacher of another vocabulary (dpca)
    score the student's samples; both losses are finite with units on every step, the
    unaligned fraction is logged, and one student is exported."""
    import importlib.util
    import math

    import yaml

    import xdistill.tiny as mk
    from xdistill.metrics import read_metrics

    spec = importlib.util.spec_from_file_location("train_conftest_cli2",
                                                  Path(__file__).resolve().parent / "conftest.py")
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)
    spm = mk.save_tiny_lm(tmp_path / "spm", "mistral", seed=4, hidden_size=16,
                          intermediate_size=32)
    teachers = [H.teacher("spm", "mistral", str(spm), "escd", mask_whitespace=True),
                H.teacher("bpe", tiny_assets["tok_t"], sharp["cross"], "dpca")]
    out = tmp_path / "two"
    d = H.onpolicy_dict(tiny_assets["tok_s"], teachers, sharp["prompts"], out, steps=2)
    d["prompts"]["batch_size"] = 1
    d["train"].update(global_batch_size=4, num_threads=2)
    d["checkpoint"]["export_hf"] = True
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(d), encoding="utf-8")
    proc = helpers.run_cli(["train", "onpolicy", "--config", str(path)], nproc=2,
                           env={"OMP_NUM_THREADS": None})
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    steps = [m for m in read_metrics(out / "metrics.jsonl") if "units/spm" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        for name in ("spm", "bpe"):
            assert m[f"units/{name}"] > 0 and math.isfinite(m[f"{name}/loss"])
        assert 0.0 <= m["onpolicy/unaligned_frac"] < 0.5
        assert "bpe/clamp/uniform_fallbacks" in m and "spm/clamp/empty_groups" in m
    rows = [json.loads(x) for x in (out / "samples_rank0.jsonl").read_text().splitlines()]
    assert [len(r["prompts"]) for r in rows] == [2, 2]   # 2 micro-batches of 1 prompt per step
    assert (out / "export" / "model.safetensors").is_file()


def test_per_sample_routing_to_one_teacher(tmp_path, tiny_assets, sharp):
    """prompts.route_column: each sample is scored by the teacher its prompt names (mixed
    tokenizers, different kinds); a teacher's units come from its samples only, and a prompt
    routed to an unknown teacher is an error naming its file and line."""
    from xdistill.errors import ConfigError
    from xdistill.train.onpolicy import rollout_batch
    from xdistill.train.onpolicy_step import local_units

    prompts = tmp_path / "routed.jsonl"
    rows = [{"prompt": p, "who": "same" if i % 2 else "cross"} for i, p in enumerate(H.PROMPTS)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    d = _two_teacher_dict(tiny_assets, sharp, tmp_path / "run", same_kind="k3",
                          cross_kind="dpca")
    d["prompts"].update(paths=[str(prompts)], route_column="who")
    run = _built(d)
    try:
        run.mode.iters = [iter(run.mode.loaders[0])]
        indices, _, scored = rollout_batch(run, 1, Timers())
        routed = run.mode.rows(indices)
        assert [bool(x) for x in routed["same"]] == [i % 2 == 1 for i in indices]
        units = local_units(run.plan, scored.batch, routed)
        everyone = local_units(run.plan, scored.batch)
        for name in ("same", "cross"):
            assert 0 < units[name] < everyone[name]
        m = H_step(run, scored, routed)
        assert m["units/same"] == units["same"] and m["units/cross"] == units["cross"]
    finally:
        run.mode.pool.close()
    rows[3]["who"] = "nobody"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"routed.jsonl line 4: routed to teacher 'nobody'"):
        _built(d)


def H_step(run, scored, rows):
    """One routed scored step (loss + backward) with globally counted units."""
    from xdistill.train.metrics import StepMetrics, all_reduce_counts
    from xdistill.train.onpolicy_step import local_units, scored_step

    num_valid = all_reduce_counts(local_units(run.plan, scored.batch, rows))
    metrics = StepMetrics()
    scored_step(run, scored, num_valid, Timers(), metrics, rows=rows)
    return metrics.reduce(num_valid).flat()
