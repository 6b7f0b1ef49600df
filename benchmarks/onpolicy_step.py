"""Skeleton timing of the on-policy pieces (no trainer loop yet): generation, re-tokenize + align,
teacher forward, loss + backward, per loss kind, with tokens/s; ratios against the student's own
forward+backward (plain CE) measured in the same process.

    .venv/bin/python benchmarks/onpolicy_step.py [--batch 8] [--new 64]

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


if __name__ == "__main__":
    main()
