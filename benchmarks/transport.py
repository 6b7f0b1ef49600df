"""Teacher-output handoff between processes: latency and bandwidth of [B, T, V] bf16 logits.

Legend: B batch, T tokens, V vocabulary.

Methods, all measured in the same run (the first one, our shared-memory transport, is the
reference the others are compared to):

* ``shm``        xdistill ShmWriter/ShmReader: the producer writes into a persistent /dev/shm slot,
                 sends a ~100-byte meta; the consumer maps the slot once and reuses the mapping.
* ``torch_fs``   torch shared-memory tensor sent through a Pipe with the ``file_system`` sharing
                 strategy (torch's own handle; the consumer rebuilds the storage per message).
* ``pickle``     a plain pickled copy of the tensor through a Pipe.
* ``ray``        a Ray actor returns the tensor (numpy view, as xdistill's Ray transport does);
                 the driver ``ray.get``s it zero-copy from the object store.
* GPU only (when CUDA is available): ``cuda_ipc`` (xdistill CudaIpcWriter/Reader) vs ``host_copy``
  (producer copies GPU->shm slot, consumer copies shm->GPU).

"handoff" = from the producer having the data ready to the consumer holding a usable tensor
(clocks: ``time.perf_counter``, CLOCK_MONOTONIC, shared by processes on a node). "+read" adds one
full pass of the consumer over the bytes (a sum), which mapped methods pay on first touch.
Steady state = median over repeats after the first (the first also maps the slot: "cold").

Usage: ``python benchmarks/transport.py [--batch 8 --seq 2048 --vocab 32000 152064
--scale-batch 2 --repeats 5 --out benchmarks/results/transport.md]``. ``--scale-batch`` runs the
larger vocabularies with a smaller batch to keep RAM in check (reported per byte, i.e. bandwidth).
"""

from __future__ import annotations

import argparse
import os
import pickle
import platform
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp

from xdistill.teacher.transport import make_reader, make_writer


def _spec(shape):
    return {"logits_BTtV": (tuple(shape), torch.bfloat16)}


def _produce(conn, mode: str, shape, reps: int, device: str) -> None:
    """Producer process: for each 'go', fill the data (not timed), stamp t0, hand it over."""
    if mode == "torch_fs":
        mp.set_sharing_strategy("file_system")
    writer = make_writer({"host_copy": "shm"}.get(mode, mode), 1, device) \
        if mode in ("shm", "cuda_ipc", "host_copy") else None
    shared = (torch.empty(shape, dtype=torch.bfloat16).share_memory_() if mode == "torch_fs"
              else None)
    plain = torch.empty(shape, dtype=torch.bfloat16) if mode == "pickle" else None
    gpu = torch.empty(shape, dtype=torch.bfloat16, device=device) if mode == "host_copy" else None
    for rep in range(reps):
        conn.recv()
        if writer is not None and mode != "host_copy":
            x = writer.prepare(0, _spec(shape))["logits_BTtV"]
            x.fill_(rep)
            if x.is_cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            conn.send((t0, writer.publish(0)))
        elif mode == "host_copy":
            gpu.fill_(rep)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            writer.prepare(0, _spec(shape))["logits_BTtV"].copy_(gpu)
            conn.send((t0, writer.publish(0)))
        elif mode == "torch_fs":
            shared.fill_(rep)
            t0 = time.perf_counter()
            conn.send((t0, shared))
        else:
            plain.fill_(rep)
            t0 = time.perf_counter()
            conn.send_bytes(pickle.dumps((t0, plain), protocol=pickle.HIGHEST_PROTOCOL))
    conn.recv()
    if writer is not None:
        writer.close()


def _touch(x: torch.Tensor) -> float:
    """One full read of the bytes (int64 sum over the raw storage)."""
    flat = x.reshape(-1).view(torch.int16)
    return float(flat[: flat.numel() // 4 * 4].view(torch.int64).sum())


def bench_process(mode: str, shape, reps: int, device: str = "cpu") -> dict:
    if mode == "torch_fs":
        mp.set_sharing_strategy("file_system")
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_produce, args=(there, mode, shape, reps, device), daemon=True)
    proc.start()
    reader = make_reader("cuda_ipc" if mode == "cuda_ipc" else "shm") \
        if mode in ("shm", "cuda_ipc", "host_copy") else None
    hand, full = [], []
    try:
        for _ in range(reps):
            here.send("go")
            if mode == "pickle":
                t0, x = pickle.loads(here.recv_bytes())
            else:
                t0, meta = here.recv()
                x = meta if mode == "torch_fs" else reader.read(0, meta)["logits_BTtV"]
                if mode == "host_copy":
                    x = x.to(device)
            if x.is_cuda:
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            _touch(x)
            if x.is_cuda:
                torch.cuda.synchronize()
            t2 = time.perf_counter()
            hand.append(t1 - t0)
            full.append(t2 - t0)
            if reader is not None:
                reader.release(0)
            del x
        here.send("stop")
        proc.join(60)
    finally:
        if proc.is_alive():
            proc.kill()
        if reader is not None:
            reader.close()
    return _summary(hand, full)


def _summary(hand, full) -> dict:
    steady_h = hand[1:] or hand
    steady_f = full[1:] or full
    return {"cold": hand[0], "handoff": statistics.median(steady_h),
            "read": statistics.median(steady_f)}


def bench_ray(shape, reps: int) -> dict:
    import ray

    from xdistill.teacher.transport.ray_store import from_numpy, to_numpy

    @ray.remote(num_cpus=1)
    class Producer:
        def __init__(self):
            self.x = torch.empty(shape, dtype=torch.bfloat16)

        def produce(self, rep):
            self.x.fill_(rep)
            return time.perf_counter(), to_numpy(self.x)

    actor = Producer.remote()
    ray.get(actor.produce.remote(0))  # actor started (not timed)
    hand, full = [], []
    for rep in range(reps):
        t0, arr = ray.get(actor.produce.remote(rep))
        x = from_numpy(arr, "bfloat16")
        t1 = time.perf_counter()
        _touch(x)
        t2 = time.perf_counter()
        hand.append(t1 - t0)
        full.append(t2 - t0)
        del x, arr
    ray.kill(actor)
    return _summary(hand, full)


def _fmt_row(name, res, nbytes, ref) -> str:
    gbps = nbytes / res["read"] / 1e9
    return (f"| {name} | {res['cold'] * 1e3:.2f} | {res['handoff'] * 1e3:.3f} | "
            f"{res['read'] * 1e3:.1f} | {gbps:.2f} | {res['handoff'] / ref['handoff']:.1f}x | "
            f"{res['read'] / ref['read']:.1f}x |")


def run(args) -> str:
    lines = [f"# Teacher-output transport (benchmarks/transport.py)", "",
             f"Hardware: {platform.machine()}, {os.cpu_count()} CPU cores, "
             f"{'CUDA ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}"
             f"; torch {torch.__version__}; shared with other jobs (timings are noisy).", "",
             f"Command: `python benchmarks/transport.py {' '.join(sys.argv[1:])}`", "",
             "Times in ms (median of steady-state repeats); ratios vs `shm` (larger = slower). "
             "`read` = handoff + one full pass over the bytes; GB/s = bytes / read.", ""]
    for V in args.vocab:
        B = args.batch if V <= 64000 else args.scale_batch
        shape = (B, args.seq, V)
        nbytes = B * args.seq * V * 2
        lines += [f"## [{B}, {args.seq}, {V}] bf16 = {nbytes / 2**30:.2f} GiB"
                  + ("" if B == args.batch else
                     f" (batch {B}, not {args.batch}, to spare RAM: at batch {args.batch} the "
                     f"copying methods take ~{args.batch / B:g}x longer; GB/s carries over)"), "",
                  "| method | cold | handoff | read | GB/s | handoff vs shm | read vs shm |",
                  "|---|---|---|---|---|---|---|"]
        results = {"shm": bench_process("shm", shape, args.repeats)}
        results["torch_fs"] = bench_process("torch_fs", shape, args.repeats)
        results["pickle"] = bench_process("pickle", shape, max(2, args.repeats // 2))
        if not args.no_ray:
            results["ray"] = bench_ray(shape, args.repeats)
        if torch.cuda.is_available():
            results["cuda_ipc"] = bench_process("cuda_ipc", shape, args.repeats, "cuda:0")
            results["host_copy"] = bench_process("host_copy", shape, args.repeats, "cuda:0")
        for name, res in results.items():
            lines.append(_fmt_row(name, res, nbytes, results["shm"]))
            print(lines[-1], flush=True)
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--vocab", type=int, nargs="+", default=[32000, 152064])
    p.add_argument("--scale-batch", type=int, default=2,
                   help="batch used for vocabularies above 64k (RAM)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-ray", action="store_true")
    p.add_argument("--object-store-gb", type=float, default=3.0)
    p.add_argument("--out", default=None, help="write the markdown table here")
    args = p.parse_args(argv)
    if not args.no_ray:
        import ray

        ray.init(num_cpus=2, object_store_memory=int(args.object_store_gb * 2**30),
                 include_dashboard=False, log_to_driver=False)
    try:
        text = run(args)
    finally:
        if not args.no_ray:
            import ray

            ray.shutdown()
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
