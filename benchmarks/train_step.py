"""Off-policy train step vs the sum of its parts, with 1 and 2 teachers (CPU by default).

    python benchmarks/train_step.py [--steps 6] [--out benchmarks/results/train_step.md]

In one process, on the same pre-fetched batches (so data loading is excluded):

* ``full``: the trainer's own step (:func:`xdistill.train.offpolicy.train_step` pieces: global
  counts, per micro-batch teachers -> student forward -> MultiTeacherLoss -> backward, then clip +
  AdamW + scheduler);
* ``teacher``: the teacher forwards alone (``TeacherPool.forward`` on the same batches);
* ``student``: student forward + backward of a trivial loss (``logits.mean()``) + clip + AdamW;
* ``align``: the collator's time for those batches (alignment + teacher tokenization, done in the
  DataLoader workers during training, added here because it is part of the overhead).

``overhead = full + align - (teacher + student)``: alignment, transport (device moves, building
loss inputs) and the distillation losses. Target: overhead < 25% of ``teacher + student``.
Models: Llama-architecture student and teachers over BPE tokenizers trained on Shakespeare
(student and cross teacher with different vocabularies; the second teacher shares the student's).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

import make_tiny_models as mk  # noqa: E402


def build_assets(root: Path, args) -> dict:
    from xdistill.projection import BuildConfig, build_projection, save_projection
    from xdistill.tokenization import load_tokenizer

    train, _ = mk.make_corpus(root / "corpus", n_train=120, n_eval=4, max_chars=800)
    texts = mk.passages(limit=400)
    tok_s = mk.train_bpe(root / "tok_s", args.vocab_s, texts)
    tok_t = mk.train_bpe(root / "tok_t", args.vocab_t, texts[::-1])
    size = dict(hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=4)
    same = mk.save_tiny_lm(root / "same", str(tok_s), seed=1, **size)
    cross = mk.save_tiny_lm(root / "cross", str(tok_t), seed=2, **size)
    proj = build_projection(load_tokenizer(str(tok_s)), load_tokenizer(str(tok_t)), BuildConfig())
    save_projection(proj, root / "proj.npz")
    return {"train": str(train), "tok_s": str(tok_s), "tok_t": str(tok_t), "same": str(same),
            "cross": str(cross), "proj": str(root / "proj.npz"), "size": size}


def make_config(a: dict, n_teachers: int, args, out: Path):
    from xdistill.config import from_dict
    from xdistill.train.config import OffPolicyConfig

    teachers = [{"name": "cross", "tokenizer": a["tok_t"], "worker": {"model": a["cross"]},
                 "loss": {"kind": "pkl", "projection": a["proj"]}},
                {"name": "same", "tokenizer": a["tok_s"], "worker": {"model": a["same"]},
                 "loss": {"kind": "forward_kl"}}][:n_teachers]
    return from_dict(OffPolicyConfig, {
        "student": {"model_type": "llama", "model_config": dict(a["size"], vocab_size=args.vocab_s)},
        "student_tokenizer": a["tok_s"], "teachers": teachers,
        "data": {"paths": [a["train"]], "seq_len": args.seq_len, "batch_size": args.batch,
                 "num_workers": 0},
        "loss": {"chunk_size": 256}, "optim": {"implementation": "foreach"},
        "train": {"steps": 1000, "global_batch_size": args.batch, "out_dir": str(out),
                  "tensorboard": False},
        "checkpoint": {"export_hf": False, "resume": ""}})


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(cfg, steps: int) -> dict:
    from xdistill.train.offpolicy import build_run, optimizer_step
    from xdistill.train.step import Timers, global_counts, micro_step, student_logits

    run = build_run(cfg)
    run.pool.start()
    try:
        it = iter(run.loaders[0])
        batches = [next(it) for _ in range(steps + 1)]
        timers = Timers()

        def full(b):
            n = global_counts(run.loss_fn, [b], False)
            micro_step(run.model, run.loss_fn, run.pool, b, n, timers, device=run.device)
            optimizer_step(run)

        def teacher(b):
            with run.pool.forward(b):
                pass

        def student(b):
            student_logits(run.model, b).mean().backward()
            optimizer_step(run)

        out = {}
        for name, fn in (("teacher", teacher), ("student", student), ("full", full)):
            fn(batches[0])  # warm-up
            timers.seconds.clear()
            out[name] = statistics.median(_timed(lambda: fn(b)) for b in batches[1:])
            if name == "full":
                out["split"] = {k: v / steps for k, v in timers.seconds.items()}
        out["align"] = statistics.median(b.stats.collate_seconds for b in batches[1:])
        out["tokens"] = statistics.median(b.stats.student_tokens for b in batches[1:])
    finally:
        run.pool.close()
    return out


def report(results: dict, args) -> str:
    lines = ["# Off-policy train step vs the sum of its parts", "",
             f"Hardware: {platform.processor() or platform.machine()}, "
             f"{torch.get_num_threads()} torch threads, CPU only (no GPU); torch {torch.__version__}.",
             f"Models: Llama student/teachers hidden {args.hidden}, {args.layers} layers; "
             f"student vocab {args.vocab_s}, cross teacher vocab {args.vocab_t}; batch "
             f"{args.batch} x {args.seq_len} tokens; median of {args.steps} steps (seconds).", "",
             "| teachers | full step | align (collator) | teacher alone | student alone | "
             "overhead | overhead / (teacher+student) |", "|---|---|---|---|---|---|---|"]
    for n, r in results.items():
        base = r["teacher"] + r["student"]
        over = r["full"] + r["align"] - base
        lines.append(f"| {n} | {r['full']:.3f} | {r['align']:.3f} | {r['teacher']:.3f} | "
                     f"{r['student']:.3f} | {over:.3f} | {100 * over / base:.1f}% |")
    lines += ["", "Per-phase split of the full step (seconds, mean):", ""]
    for n, r in results.items():
        lines.append(f"* {n} teacher(s): " + ", ".join(f"{k} {v:.3f}" for k, v in r["split"].items()))
    lines += ["", "overhead = full + align - (teacher + student): alignment, transport and the "
              "distillation losses. Target < 25%."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab-s", type=int, default=4000)
    p.add_argument("--vocab-t", type=int, default=6000)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(REPO / "benchmarks/results/train_step.md"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        assets = build_assets(Path(tmp), args)
        results = {n: measure(make_config(assets, n, args, Path(tmp) / f"run{n}"), args.steps)
                   for n in (1, 2)}
    text = report(results, args)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
