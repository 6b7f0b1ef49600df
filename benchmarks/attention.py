"""Student attention on CPU: bfloat16 SDPA vs float32 SDPA on upcast inputs (forward + backward).

    .venv/bin/python benchmarks/attention.py [--reps 15] [--threads 2] [--tokens 64,128,256]

Why ``xdistill/student/attention.py`` gives a bfloat16 student float32 attention on CPUs. Shapes
of SmolLM2-135M's attention (9 query heads, 3 key/value heads expanded, head dim 64), batch 4, at
64 (the real-pair step's windows), 128 and 256 tokens; causal. Three ways, interleaved rep by rep
in this one process (so a change in the machine's load hits all three alike), median time per
way and the ratio to float32:

* ``float32``       float32 inputs, float32 SDPA (a float32 student);
* ``bf16``          bfloat16 inputs, bfloat16 SDPA (what a bf16 student ran before);
* ``bf16_upcast``   bfloat16 inputs cast to float32, float32 SDPA, output cast back
                    (``sdpa_float32``, what a bf16 student runs on CPUs now).

The header names the CPU, the bf16 units torch reports and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

# as the trainer runs (xdistill/train/core.py): a spinning OpenMP wait distorts every timing
# when the cores are shared; set before torch starts its thread pool
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F

WAYS = ("float32", "bf16", "bf16_upcast")


def make_step(way: str, B: int, H: int, T: int, D: int):
    """A closure running one forward+backward of ``way`` on fixed random inputs."""
    dtype = torch.float32 if way == "float32" else torch.bfloat16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=g).to(dtype).requires_grad_() for _ in range(3))

    def step() -> None:
        if way == "bf16_upcast":
            out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                 is_causal=True).to(dtype)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.sum().backward()
    return step


def measure(T: int, reps: int, B: int = 4, H: int = 9, D: int = 64) -> dict[str, float]:
    steps = {w: make_step(w, B, H, T, D) for w in WAYS}
    times: dict[str, list[float]] = {w: [] for w in WAYS}
    for step in steps.values():   # warm-up
        step()
    last = time.perf_counter()
    for r in range(reps):
        for i in range(len(WAYS)):
            way = WAYS[(i + r) % len(WAYS)]   # each rep starts one way later
            t0 = time.perf_counter()
            steps[way]()
            times[way].append(time.perf_counter() - t0)
        if time.perf_counter() - last > 10:
            print(f"[attention] T={T}: rep {r + 1}/{reps}", flush=True)
            last = time.perf_counter()
    return {w: statistics.median(ts) for w, ts in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", default="64,128,256", help="sequence lengths, comma-separated")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from real.step import cpu_line  # benchmarks/ (this script's folder) is on the path

    print(f"# Student attention, forward+backward, {args.threads} threads, OMP_WAIT_POLICY="
          f"{os.environ['OMP_WAIT_POLICY']}\n\n{cpu_line()}; "
          f"load average {' / '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print("| tokens | float32 ms | bf16 ms | bf16_upcast ms | bf16 / float32 | "
          "bf16_upcast / float32 | bf16 / bf16_upcast |\n|---|---|---|---|---|---|---|")
    for T in (int(t) for t in args.tokens.split(",")):
        m = measure(T, args.reps)
        print(f"| {T} | {m['float32'] * 1e3:.1f} | {m['bf16'] * 1e3:.1f} | "
              f"{m['bf16_upcast'] * 1e3:.1f} | {m['bf16'] / m['float32']:.2f} | "
              f"{m['bf16_upcast'] / m['float32']:.2f} | {m['bf16'] / m['bf16_upcast']:.2f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
