"""Served vs in-process teacher: top-K throughput on the same batches, ratio in one run.

Rows are windows of the Shakespeare asset corpus tokenized by the teacher's tokenizer (SmolLM2-135M
by default), ``--batch`` rows of ``--tokens`` tokens per batch. Each round times one batch through
the in-process float32 teacher (``output: topk``) and then through the served teacher (the same
model in float32 behind ``vllm serve``, protocol ``vllm``); rounds alternate, the ratio is the
median of the paired per-round ratios. Without ``--url`` a ``vllm serve`` is started here (run
this in ``.venv-vllm``) in its own process group and killed at the end.

    .venv-vllm/bin/python benchmarks/served_teacher.py [--rounds 5] [--url http://host:port/v1]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch


def batches(folder: str, B: int, T: int, n: int):
    import xdistill.tiny as mk
    from xdistill.tokenization import load_tokenizer

    tok = load_tokenizer(folder)
    ids = [i for text in mk.passages(2000, limit=200) for i in tok.encode(text).ids]
    out = []
    for r in range(n):
        rows = [ids[(r * B + b) * T:(r * B + b + 1) * T] for b in range(B)]
        out.append((torch.tensor(rows), torch.ones(B, T, dtype=torch.bool)))
    return out


def main(argv=None) -> int:
    from xdistill.assets.paths import model_dir
    from xdistill.config import from_dict
    from xdistill.teacher import TeacherConfig, TeacherRequest, TeacherWorker
    from xdistill.teacher.client import make_client
    from xdistill.teacher.local_server import start_vllm_server

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(model_dir("smollm2-135m")))
    ap.add_argument("--url", default="")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    server = None
    if not args.url and importlib.util.find_spec("vllm") is None:   # `make bench` runs in .venv
        print("served_teacher: skipped: vllm is not installed here (make vllm-env, then run this "
              "script with .venv-vllm/bin/python, or give --url of a running server)")
        return 0
    if not args.url:
        server = start_vllm_server(args.model, log=Path(tempfile.mkdtemp()) / "serve.log")
        args.url = server.url
        print(f"vllm server ready: {server.url}", flush=True)
    try:
        data = batches(args.model, args.batch, args.tokens, args.rounds + 1)
        local = TeacherWorker(TeacherConfig(name="t", model=args.model, output="topk",
                                            top_k=args.top_k, dtype="float32"))
        cfg = from_dict(TeacherConfig, {"name": "t", "model": args.model, "placement": "served",
                                        "output": "topk", "top_k": args.top_k,
                                        "served": {"url": args.url}})
        with make_client(cfg) as served:
            served.forward(TeacherRequest(0, *data[0])).release()   # warm-up (both)
            local.forward(TeacherRequest(0, *data[0]))
            t_local, t_served = [], []
            for r, (ids, mask) in enumerate(data[1:], 1):
                t0 = time.perf_counter()
                local.forward(TeacherRequest(r, ids, mask))
                t_local.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                served.forward(TeacherRequest(r, ids, mask)).release()
                t_served.append(time.perf_counter() - t0)
                print(f"round {r}/{args.rounds}: in-process {t_local[-1]:.3f} s, served "
                      f"{t_served[-1]:.3f} s", flush=True)
    finally:
        if server is not None:
            server.stop()
    n_tok = args.batch * args.tokens
    ml, ms = statistics.median(t_local), statistics.median(t_served)
    ratio = statistics.median(s / loc for s, loc in zip(t_served, t_local))
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads in-process")
    print(f"batch {args.batch} x {args.tokens} tokens, top-{args.top_k}, {args.rounds} rounds")
    print(f"in-process float32: {ml:.3f} s/batch ({n_tok / ml:,.0f} tok/s)")
    print(f"served (vllm, float32): {ms:.3f} s/batch ({n_tok / ms:,.0f} tok/s)")
    print(f"served / in-process time: {ratio:.2f}x (median of paired rounds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
