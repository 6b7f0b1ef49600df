"""Rollouts from vLLM vs ``transformers`` generate, in one process, as a ratio (run in .venv-vllm).

    .venv-vllm/bin/python benchmarks/rollout_engines.py [--batch 8] [--new 64] [--rounds 5]
        [--vllm-dtype bfloat16] [--hf-threads 2] [--out benchmarks/results/rollout_engines.md]

The SmolLM2-135M-Instruct asset (``tools/fetch_assets.py``) is the student: a float32 HF model
(what the trainer holds on this CPU) samples with :class:`HFGenerateEngine`, and a
:class:`VLLMEngine` started on the same folder samples after one weight sync from that model.
Both draw ``--batch`` chat prompts, ``--new`` tokens at most, temperature 1, top-p 1, the
engines alternating round by round with the same seeds. Reported: the engine start, the weight
sync (135 M parameters through shared memory), per round the generated tokens (stop tokens
included) per second of each engine, and their paired ratio. A progress line every 10 s.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import xdistill  # noqa: F401 - before torch: xdistill's OpenMP wait default, as in the trainer (else
# HF's two OpenMP threads spin while other processes hold the cores: one round took 134 s, not 10)

PROMPTS = ("Name three colours and say one thing about each.",
           "Explain what a tokenizer does, in two sentences.",
           "Write a short poem about the sea.", "What is 17 times 23? Show the steps.",
           "Give me a recipe for pancakes.", "Why is the sky blue?",
           "List the planets of the solar system.", "Describe a cat to someone who never saw one.")


def say(msg: str) -> None:
    print(f"[rollout_engines {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return platform.processor() or platform.machine()
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def timed(label: str, fn, typical_s: float = 0.0):
    """``fn()`` under a 10-second heartbeat; returns (result, seconds)."""
    from xdistill.pretrained import Heartbeat

    t0 = time.perf_counter()
    with Heartbeat(label, say, typical_s=typical_s):
        out = fn()
    return out, time.perf_counter() - t0


def build(args):
    import torch

    from xdistill.assets.paths import model_dir
    from xdistill.rollout import HFGenerateEngine, RolloutConfig
    from xdistill.rollout.vllm_engine import VLLMEngine
    from xdistill.student.model import load_causal_lm
    from xdistill.tokenization import load_tokenizer

    torch.set_num_threads(args.hf_threads)
    folder = model_dir("smollm2-135m")
    tok = load_tokenizer("smollm2-135m")
    model = load_causal_lm(folder, dtype=torch.float32).eval()
    hf = HFGenerateEngine(model, tok, max_prompt_len=128)
    cfg = RolloutConfig(backend="vllm", vllm_model=str(folder), vllm_dtype=args.vllm_dtype,
                        max_prompt_len=128, max_new_tokens=args.new, vllm_kv_cache_gb=1.0)
    vllm, start_s = timed("starting vLLM", lambda: VLLMEngine(cfg, tok), typical_s=45)
    say(f"vLLM started in {start_s:.1f} s")
    syncs = [timed("weight sync", lambda: vllm.sync_weights(model))[1] for _ in range(3)]
    say(f"weight sync (135 M params, float32 -> {args.vllm_dtype}): "
        f"{', '.join(f'{s:.2f}' for s in syncs)} s")
    return hf, vllm, start_s, syncs


def measure(args, hf, vllm) -> list[dict]:
    from xdistill.rollout import SamplingParams

    prompts = [(("user", PROMPTS[i % len(PROMPTS)]),) for i in range(args.batch)]
    rows = []
    for r in range(args.rounds + 1):  # round 0 warms both engines up and is not reported
        row = {}
        for name, eng in (("hf", hf), ("vllm", vllm)):
            sp = SamplingParams(1.0, 1.0, args.new, seed=100 + r)
            ro, s = timed(f"round {r} {name}", lambda: eng.generate(prompts, sp))
            n = int(ro.response_len_B.sum())
            row[name] = {"s": s, "tokens": n, "tok_s": n / s}
        if r:
            rows.append(row)
        say(f"round {r}{' (warm-up)' if not r else ''}: " + ", ".join(
            f"{k} {v['tokens']} tokens in {v['s']:.1f} s = {v['tok_s']:.1f} tok/s"
            for k, v in row.items()) + f"; vllm/hf {row['vllm']['tok_s'] / row['hf']['tok_s']:.2f}x")
    return rows


def report(args, rows, start_s, syncs) -> str:
    import torch
    import vllm

    ratios = [r["vllm"]["tok_s"] / r["hf"]["tok_s"] for r in rows]
    med = {k: statistics.median(r[k]["tok_s"] for r in rows) for k in ("hf", "vllm")}
    lines = [
        "# Rollout engines: vLLM vs HF generate (`benchmarks/rollout_engines.py`)", "",
        f"CPU: {cpu_name()}, {os.cpu_count()} cores; load average at the end "
        f"{os.getloadavg()[0]:.1f}; torch {torch.__version__}, vllm {vllm.__version__}; "
        f"{time.strftime('%Y-%m-%d')}", "",
        f"SmolLM2-135M-Instruct, {args.batch} chat prompts x up to {args.new} new tokens, T=1, "
        f"top-p 1; HF: float32, {args.hf_threads} torch threads; vLLM: {args.vllm_dtype}, "
        "enforce_eager, its worker bound to one core (vLLM's CPU default on 2 cores keeps the "
        "other for its engine core)", "",
        f"- vLLM engine start: {start_s:.1f} s",
        f"- weight sync, 135 M parameters (float32 student -> {args.vllm_dtype} engine): "
        f"{', '.join(f'{s:.2f}' for s in syncs)} s",
        f"- generated tokens/s, median of {len(rows)} rounds: HF {med['hf']:.1f}, "
        f"vLLM {med['vllm']:.1f}; paired ratio vLLM/HF per round: "
        f"{', '.join(f'{x:.2f}' for x in ratios)} (median **{statistics.median(ratios):.2f}x**)",
        "", "| round | HF tokens | HF s | vLLM tokens | vLLM s | vLLM/HF tok/s |",
        "|---|---|---|---|---|---|"]
    lines += [f"| {i + 1} | {r['hf']['tokens']} | {r['hf']['s']:.1f} | {r['vllm']['tokens']} | "
              f"{r['vllm']['s']:.1f} | {x:.2f} |" for i, (r, x) in enumerate(zip(rows, ratios))]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--vllm-dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--hf-threads", type=int, default=2)
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    if importlib.util.find_spec("vllm") is None:  # `make bench` runs every script in .venv
        print("rollout_engines: skipped: vllm is not installed here (make vllm-env, then run "
              "this script with .venv-vllm/bin/python)")
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    hf, vllm, start_s, syncs = build(args)
    try:
        rows = measure(args, hf, vllm)
    finally:
        vllm.close()
    text = report(args, rows, start_s, syncs)
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
