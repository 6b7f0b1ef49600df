"""Timing of the on-policy pieces (generation, re-tokenize + align, teacher forward, loss +
backward, per loss kind) and of full trainer steps (``xdistill.train.onpolicy.onpolicy_train_step``
split into generation / score / teacher / student / loss / optim), with tokens/s; ratios against
the student's own forward+backward (plain CE) measured in the same process.

    .venv/bin/python benchmarks/onpolicy_step.py [--batch 8] [--new 64] [--steps 3]

Student: tiny Llama (2 layers, hidden 32) on the gpt2 tokenizer; teachers: the same tokenizer
(identity path) and qwen2 (cross tokenizer, random tiny Llama over its 151,936-token vocabulary).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "rollout"))
from rollout_helpers import tiny_llama  # noqa: E402

from xdistill.data import TeacherSpec  # noqa: E402
from xdistill.losses import ChunkAlignment, cross_entropy  # noqa: E402
from xdistill.losses.onpolicy import OnPolicyLossSpec, onpolicy_loss  # noqa: E402
from xdistill.rollout import HFGenerateEngine, RolloutScorer, SamplingParams  # noqa: E402
from xdistill.tokenization import load_tokenizer  # noqa: E402


def timed(fn, reps=3):
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        out = fn()
    return (time.perf_counter() - t0) / reps, out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    s_tok, t_tok = load_tokenizer("gpt2"), load_tokenizer("qwen2")
    student = tiny_llama(s_tok.vocab_size, seed=0, logit_scale=20.0)
    teacher = tiny_llama(t_tok.vocab_size, seed=1, logit_scale=20.0)
    prompts = [f"Question {i}: what is the capital of country number {i}?" for i in range(args.batch)]
    eng = HFGenerateEngine(student, s_tok, max_prompt_len=64)
    t_gen, ro = timed(lambda: eng.generate(prompts, SamplingParams(1.0, 1.0, args.new, seed=0)), 1)
    n_resp = int(ro.response_mask_BTr.sum())
    scorer = RolloutScorer(s_tok, [TeacherSpec("same", s_tok), TeacherSpec("qwen", t_tok)])
    t_score, sb = timed(lambda: scorer(ro))
    b, view = sb.batch, sb.batch.teacher("qwen")
    with torch.no_grad():
        t_teacher, zt = timed(lambda: teacher(input_ids=view.input_ids_BTt,
                                             attention_mask=view.attention_mask_BTt.long()).logits)

    def student_fwd():
        return student(input_ids=b.input_ids_BTs, attention_mask=b.attention_mask_BTs.long()).logits

    def ce_step():
        cross_entropy(student_fwd(), b.labels_BTs).backward()

    t_ref, _ = timed(ce_step)
    rows = [("generation", t_gen, n_resp), ("re-tokenize + align (2 teachers)", t_score, n_resp),
            ("teacher forward (qwen2 vocab)", t_teacher, int(view.attention_mask_BTt.sum())),
            ("student fwd+bwd, CE (reference)", t_ref, n_resp)]
    align = ChunkAlignment.from_view(view)
    for kind in ("k1", "k3"):
        def step(kind=kind):
            z = student_fwd()
            onpolicy_loss(OnPolicyLossSpec(kind), z, b.input_ids_BTs, b.loss_mask_BTs, align=align,
                          t_loss_mask_BTt=view.loss_mask_BTt, teacher_logits_BTtV=zt,
                          teacher_ids_BTt=view.input_ids_BTt).loss.backward()
        rows.append((f"student fwd+bwd, {kind} cross-tokenizer", timed(step)[0], n_resp))
    for kind in ("reverse_kl", "jsd"):
        def step(kind=kind):
            z = student_fwd()
            onpolicy_loss(OnPolicyLossSpec(kind), z, b.input_ids_BTs, b.loss_mask_BTs,
                          teacher_logits_BTtV=z.detach()).loss.backward()
        rows.append((f"student fwd+bwd, {kind} same tokenizer", timed(step)[0], n_resp))
    print(f"batch {args.batch}, {n_resp} response tokens, 2-core CPU, torch {torch.__version__}")
    print(f"{'part':42s} {'seconds':>9s} {'tokens/s':>10s} {'x CE step':>10s}")
    for name, sec, n in rows:
        print(f"{name:42s} {sec:9.4f} {n / sec:10.0f} {sec / t_ref:10.2f}")
    full_steps(args, t_ref)


def full_steps(args, t_ref):
    """Trainer steps through run_onpolicy's step function (fresh tiny student, same tiny teachers
    saved to a temp folder), time split averaged over steps 2.. (step 1 warms up)."""
    import json
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "train"))
    import onpolicy_helpers as H

    from xdistill.config import from_dict
    from xdistill.train.onpolicy import build_onpolicy_run, onpolicy_train_step
    from xdistill.train.onpolicy_config import OnPolicyConfig

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        q = H.save_lm(tmp / "q", "qwen2", seed=1, logit_scale=20.0)
        g = H.save_lm(tmp / "g", "gpt2", seed=2, logit_scale=20.0)
        prompts = [f"Question {i}: what is the capital of country number {i}?"
                   for i in range(args.batch * (args.steps + 1))]
        (tmp / "p.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
        for kinds in (("reverse_kl", "reverse_kl"), ("k3", "k3")):
            d = H.onpolicy_dict("gpt2", [H.teacher("qwen", "qwen2", q, kinds[0], cross="exact"),
                                         H.teacher("gpt", "gpt2", g, kinds[1])],
                                str(tmp / "p.jsonl"), tmp / "run", steps=args.steps + 1)
            d["prompts"]["batch_size"] = args.batch
            d["rollout"]["max_new_tokens"] = args.new
            d["train"].update(num_threads=2, log_samples=False)
            run = build_onpolicy_run(from_dict(OnPolicyConfig, d))
            run.pool.start()
            run.iters = [iter(run.loaders[0])]
            try:
                ms = [onpolicy_train_step(run, s) for s in range(1, args.steps + 2)][1:]
            finally:
                run.pool.close()
            keys = ("generation", "score", "teacher", "student", "loss", "optim")
            mean = {k: sum(m.get(f"time/{k}", 0.0) for m in ms) / len(ms) for k in keys}
            step_s = sum(m["step_s"] for m in ms) / len(ms)
            toks = sum(m["response_tokens"] for m in ms) / len(ms)
            print(f"\nfull step, qwen {kinds[0]} (exact chunks) + gpt {kinds[1]} (identity): "
                  f"{step_s:.3f} s/step, {toks:.0f} response tokens, {toks / step_s:.0f} tokens/s, "
                  f"{step_s / t_ref:.1f} x CE step")
            for k in keys:
                print(f"  {k:12s} {mean[k]:8.4f} s  {100 * mean[k] / step_s:5.1f} %")


if __name__ == "__main__":
    main()
