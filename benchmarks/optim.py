"""AdamW kernels on CPU: foreach vs fused vs for-loop, on SmolLM2-135M's parameter shapes.

    .venv/bin/python benchmarks/optim.py [--rounds 5] [--threads 2]

Every round times one ``optimizer.step()`` of each kernel (after one warm-up step per kernel),
in a rotating order; the table gives each kernel's median step and its median ratio to foreach
within the same round (load that changes between rounds cancels). The trainer's default
(``optim.implementation: auto``) is fused for plain tensors (``xdistill/train/optim.py``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

KERNELS = {"foreach": {"foreach": True}, "fused": {"fused": True},
           "for_loop": {"foreach": False}}


def smollm2_shapes() -> list[tuple[int, ...]]:
    """SmolLM2-135M: tied 49,152 x 576 embedding, 30 layers of q/k/v/o, gate/up/down, 2 norms."""
    layer = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576),
             (576, 1536), (576,), (576,)]
    return [(49152, 576)] + layer * 30 + [(576,)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    params = {k: [torch.nn.Parameter(torch.randn(*s) * 0.02) for s in smollm2_shapes()]
              for k in KERNELS}
    n = sum(p.numel() for p in params["foreach"])
    opts = {}
    for k, ps in params.items():
        for p in ps:
            p.grad = torch.randn_like(p) * 1e-3
        opts[k] = torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.1, **KERNELS[k])
        opts[k].step()                                   # allocate the state
    times: dict[str, list[float]] = {k: [] for k in KERNELS}
    names, t0 = list(KERNELS), time.perf_counter()
    for r in range(args.rounds):
        for k in names[r % 3:] + names[:r % 3]:
            t = time.perf_counter()
            opts[k].step()
            times[k].append(time.perf_counter() - t)
        el = time.perf_counter() - t0
        print(f"[optim] round {r + 1}/{args.rounds} ({el:.0f} s, ETA "
              f"{el / (r + 1) * (args.rounds - r - 1):.0f} s)", flush=True)
    print(f"\nAdamW step, {n / 1e6:.1f} M float32 parameters (SmolLM2-135M shapes), "
          f"{args.threads} threads, torch {torch.__version__}, {os.cpu_count()} cores, load "
          f"average {os.getloadavg()[0]:.1f}; {args.rounds} rounds\n")
    print("| kernel | median s/step | x foreach (paired median) |\n|---|---|---|")
    for k in KERNELS:
        ratio = statistics.median(a / b for a, b in zip(times[k], times["foreach"]))
        print(f"| {k} | {statistics.median(times[k]):.3f} | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
