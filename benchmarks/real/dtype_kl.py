"""Teacher numerics of ``dtype: auto``: KL(float32 || bfloat16) per token on real held-out text.

    .venv/bin/python benchmarks/real/dtype_kl.py [--texts 32] [--tokens 64] [--repeats 3] [--out FILE]

Gemma-3-270M (the real pair's teacher) scores held-out Shakespeare passages (not among those the
real-pair benchmarks train on) through :class:`xdistill.teacher.TeacherWorker`, once with float32
weights and once with bfloat16 weights (what ``dtype: auto`` picks on a device with bf16 matrix
units), full float32 logits both times. Per teacher token: KL(p_f32 || p_bf16) in nats, whether
the argmax agrees, and the teacher's own bits per byte of the text under each. A third row keeps
the trunk in bfloat16 but runs the output layer in float32 (a float32 copy of the head), to show
how much of the KL the head's bfloat16 rounding carries. The forward time of each (round-robin,
medians) is measured in the same process, and the line says what ``auto`` resolves to here.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch


def cpu_line() -> str:
    from xdistill.precision import cpu_bf16_units, fast_bf16

    name = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")), platform.processor() or "unknown CPU")
    units = ", ".join(k for k, v in cpu_bf16_units().items() if v) or "none"
    return (f"{name}, {torch.get_num_threads()} threads, torch {torch.__version__} "
            f"(bf16 units torch reports: {units}; auto: {fast_bf16('cpu')[1]})")


def batch(texts: int, tokens: int):
    from xdistill.tiny import passages
    from xdistill.tokenization import load_tokenizer

    tok = load_tokenizer("gemma3-270m")
    docs = passages(600, limit=600 + texts)[600:]
    rows, nbytes = [], 0
    for d in docs:
        enc = tok.encode(d)
        ids = [int(i) for i in enc.ids][:tokens]
        nbytes += int(enc.ends[len(ids) - 1]) - int(enc.starts[0])
        rows.append([tok.bos_id] + ids)
    T = max(len(r) for r in rows)
    ids_BT = torch.zeros(len(rows), T, dtype=torch.long)
    mask_BT = torch.zeros(len(rows), T, dtype=torch.bool)
    for b, r in enumerate(rows):
        ids_BT[b, :len(r)] = torch.tensor(r)
        mask_BT[b, :len(r)] = True
    return ids_BT, mask_BT, nbytes


def scores(worker, ids_BT, mask_BT, head_f32: bool = False) -> dict:
    """Float32 log-probs [B, T, V] and token log-probs of ``worker`` (optionally with a float32
    output layer on its hidden states)."""
    from xdistill.teacher import TeacherRequest

    if not head_f32:
        out = worker.forward(TeacherRequest(0, ids_BT, mask_BT))
        return {"logp": out.logits_BTtV.log_softmax(-1), "tok": out.token_logp_BTt}
    split = worker.split
    w_VH = split.head.weight.float()
    with torch.inference_mode():
        h = split.hidden(ids_BT, mask_BT.long()).float()
        z = h @ w_VH.t()
        if split.softcap is not None:
            z = torch.tanh(z / split.softcap) * split.softcap
    logp = z.log_softmax(-1)
    tok = torch.zeros(ids_BT.shape)
    tok[:, 1:] = logp[:, :-1].gather(-1, ids_BT[:, 1:, None]).squeeze(-1)
    return {"logp": logp, "tok": tok}


def compare(ref: dict, got: dict, mask_BT) -> dict:
    """Sums over the positions that predict a real next token: KL, argmax agreement, NLL."""
    pos = mask_BT.clone()
    pos[:, -1] = False
    pos[:, :-1] &= mask_BT[:, 1:]
    p, q = ref["logp"][pos].double(), got["logp"][pos].double()
    kl = (p.exp() * (p - q)).sum(-1)
    return {"kl": float(kl.sum()), "kl_max": float(kl.max()),
            "agree": float((p.argmax(-1) == q.argmax(-1)).sum()),
            "nll": float(-got["tok"][:, 1:][mask_BT[:, 1:]].double().sum()), "n": int(pos.sum())}


def accumulate(rows: list[dict], nbytes: int) -> dict:
    n = sum(r["n"] for r in rows)
    return {"kl": sum(r["kl"] for r in rows) / n, "kl_max": max(r["kl_max"] for r in rows),
            "agree": sum(r["agree"] for r in rows) / n, "n": n,
            "bpb": sum(r["nll"] for r in rows) / nbytes / math.log(2)}


def timed(fn, repeats: int, order: list) -> dict:
    times = {k: [] for k in order}
    for _ in range(repeats):
        for k in order:
            t = time.perf_counter()
            fn(k)
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "dtype_kl.md"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from xdistill.precision import resolve_compute_dtype
    from xdistill.teacher import TeacherConfig, TeacherWorker

    ids_BT, mask_BT, nbytes = batch(args.texts, args.tokens)
    workers = {d: TeacherWorker(TeacherConfig(name=d, model="gemma3-270m", dtype=d,
                                              micro_batch_size=4))
               for d in ("float32", "bfloat16")}
    assert all(w.split is not None for w in workers.values())
    names = ("bfloat16 (trunk + head)", "bfloat16 trunk, float32 head")
    parts: dict[str, list] = {n: [] for n in ("float32",) + names}
    for a in range(0, ids_BT.shape[0], 4):  # 4 rows at a time: [4, T, 262144] float32 each
        ids, mask = ids_BT[a:a + 4], mask_BT[a:a + 4]
        ref = scores(workers["float32"], ids, mask)
        parts["float32"].append(compare(ref, ref, mask))
        parts[names[0]].append(compare(ref, scores(workers["bfloat16"], ids, mask), mask))
        parts[names[1]].append(compare(ref, scores(workers["bfloat16"], ids, mask, True), mask))
    f32 = accumulate(parts["float32"], nbytes)
    rows = {n: accumulate(parts[n], nbytes) for n in names}
    speed = timed(lambda k: scores(workers[k], ids_BT[:4], mask_BT[:4]), args.repeats,
                  ["float32", "bfloat16"])
    auto = str(resolve_compute_dtype("auto", "cpu", "teacher")).removeprefix("torch.")
    lines = ["# Teacher numerics of dtype auto: Gemma-3-270M, float32 vs bfloat16 weights", "",
             f"{cpu_line()}; `dtype: auto` resolves to {auto} here. {args.texts} held-out "
             f"Shakespeare passages, {args.tokens} teacher tokens each (+ <bos>), "
             f"{f32['n']} scored positions, {nbytes} bytes; full float32 logits.", "",
             "| teacher | KL(f32 ‖ it) nats/token | max | argmax agreement | teacher bits/byte |",
             "|---|---|---|---|---|",
             f"| float32 | 0 | 0 | 1 | {f32['bpb']:.4f} |"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['kl']:.2e} | {r['kl_max']:.2e} | {r['agree']:.4f} | "
                     f"{r['bpb']:.4f} |")
    lines += ["", f"Teacher forward, 4 x {args.tokens + 1} tokens, medians of {args.repeats} "
              f"round-robin: float32 {speed['float32']:.3f} s, bfloat16 {speed['bfloat16']:.3f} s "
              f"(bfloat16 {speed['float32'] / speed['bfloat16']:.2f}x the speed of float32)."]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
