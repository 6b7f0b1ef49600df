"""Collate throughput of the cross-tokenizer data pipeline, against tokenization alone.

Legend: B windows per batch, T tokens.

One worker's work, measured in one process (what each DataLoader worker does):

* ``tokenize``: the student tokenizes and packs the corpus into windows of ``--seq`` tokens
  (:class:`PackedDataset`), plus each teacher's ``encode_batch`` of the same segment texts inside
  the collator (timed by a proxy around the teacher tokenizer) -- the tokenization any
  cross-tokenizer pipeline must pay (the reference);
* ``collate``: the same packing plus the whole :class:`CrossTokenizerCollator` call (teacher
  tokenization, chat/segment bookkeeping, chunk alignment with the Numba aligner, renumbering,
  padding, tensors).

Both figures come from the same runs, so machine noise affects them alike.

``overhead = collate / tokenize - 1`` is what alignment and batch assembly add to tokenization
(target: < 25%). Throughput is student tokens per second per worker. The corpus is the
Shakespeare plays in the asset cache, split into paragraphs (plain English text); the student is
GPT-2, teachers Qwen2 (byte BPE, 151k) and Mistral (SentencePiece with byte fallback).

Usage: ``python benchmarks/data.py [--seq 2048 --batch 8 --repeats 3 --out benchmarks/results/data.md]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def load_corpus(max_docs: int) -> list[str]:
    from xdistill.assets import asset_dir

    docs = []
    for path in sorted((asset_dir() / "corpus" / "shakespeare").glob("*.txt")):
        docs += [p.strip() for p in path.read_text().split("\n\n") if p.strip()]
    # paragraphs are short: join 20 of them into a document so documents span windows
    joined = ["\n\n".join(docs[i:i + 20]) for i in range(0, len(docs), 20)]
    return joined[:max_docs]


def _batches(windows, size):
    return [windows[i:i + size] for i in range(0, len(windows), size)]


class _Timed:
    """Proxy of a tokenizer that accumulates the time spent in ``encode_batch``."""

    def __init__(self, tok):
        self._tok, self.seconds = tok, 0.0

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def encode_batch(self, texts, **kw):
        t0 = time.perf_counter()
        try:
            return self._tok.encode_batch(texts, **kw)
        finally:
            self.seconds += time.perf_counter() - t0


def run_once(student, teachers, docs, seq: int, batch: int) -> dict:
    """Pack, then collate every batch; split the collate time into teacher tokenization and rest."""
    from dataclasses import replace

    from xdistill.data.collator import CrossTokenizerCollator
    from xdistill.data.dataset import PackedDataset

    t0 = time.perf_counter()
    windows = list(PackedDataset(docs, student, seq, shuffle=False, epochs=1))
    t_pack = time.perf_counter() - t0
    timed = [replace(spec, tokenizer=_Timed(spec.tokenizer)) for spec in teachers]
    collator = CrossTokenizerCollator(student, timed)
    coverage = []
    t0 = time.perf_counter()
    for group in _batches(windows, batch):
        out = collator(group)
        coverage.append([v.coverage_s for v in out.teachers])
    t_collate = time.perf_counter() - t0
    t_teacher_tok = sum(spec.tokenizer.seconds for spec in timed)
    tokens = sum(w.n_tokens for w in windows)
    return {"tokens": tokens, "pack": t_pack, "teacher_tok": t_teacher_tok, "collate": t_collate,
            "coverage": [sum(c[i] for c in coverage) / len(coverage) for i in range(len(teachers))]}


def main(argv=None) -> int:
    from xdistill.data.collator import TeacherTokenization
    from xdistill.tokenization import load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--docs", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    student = load_tokenizer("gpt2")
    qwen, mistral = load_tokenizer("qwen2"), load_tokenizer("mistral")
    docs = load_corpus(args.docs)
    configs = {"1 teacher (qwen2)": [TeacherTokenization("qwen2", qwen)],
               "2 teachers (qwen2, mistral)": [TeacherTokenization("qwen2", qwen), TeacherTokenization("mistral", mistral)]}
    run_once(student, configs["2 teachers (qwen2, mistral)"], docs[:10], args.seq, args.batch)  # JIT warm-up
    rows = []
    for label, teachers in configs.items():
        runs = [run_once(student, teachers, docs, args.seq, args.batch) for _ in range(args.repeats)]
        best = min(runs, key=lambda r: r["pack"] + r["collate"])
        tok_s = best["pack"] + best["teacher_tok"]
        full_s = best["pack"] + best["collate"]
        rows.append((label, best["tokens"], tok_s, full_s, best["coverage"]))
    lines = [
        f"## Data collate throughput ({platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPU cores, no GPU; one worker, best of {args.repeats})",
        "",
        f"Student gpt2, window {args.seq}, batch {args.batch}, {len(docs)} documents "
        f"(Shakespeare, ~{rows[0][1] // max(1, -(-rows[0][1] // args.seq))} tokens per window).",
        "",
        "| teachers | student tokens | tokenize only (s) | full collate (s) | overhead | "
        "student tok/s/worker (tokenize only) | student tok/s/worker (collate) | coverage_s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, tokens, tok_s, full_s, cov in rows:
        lines.append(f"| {label} | {tokens} | {tok_s:.2f} | {full_s:.2f} | {full_s / tok_s - 1:+.1%} | "
                     f"{tokens / tok_s:,.0f} | {tokens / full_s:,.0f} | "
                     f"{', '.join(f'{c:.3f}' for c in cov)} |")
    lines += ["", "overhead = full collate / tokenization alone - 1 (target < +25%). Tokenization "
              "alone = student tokenization + packing, plus the time of each teacher's "
              "encode_batch inside the collator (same run). Best of the repeats by total time."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
