"""Peak memory and time of the chunked losses vs naive fully materialised versions (same run).

Legend: B batch, T tokens, Vs/Vt vocabularies, K top-k, C chunks.

Each (loss, implementation) pair runs forward + backward (gradient w.r.t. the student logits) in
its own fresh subprocess, one at a time, so peaks do not mix and freed memory does not linger.
Memory: resident set size sampled every 1 ms from ``/proc/self/statm`` in a thread; "extra" is the
peak during forward+backward minus the RSS just before it (inputs already allocated). This sees
torch's CPU allocations (tracemalloc does not). Time: wall clock of one forward+backward.

    python benchmarks/losses.py            # B=4, T=1024, Vs=32k, Vt=152k, fp32 (~15 GiB peak)
    python benchmarks/losses.py --small    # B=1, T=256 (quick)
    python benchmarks/losses.py --only pkl --out benchmarks/results/losses.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import torch

SAME = ("forward_kl", "reverse_kl", "jsd", "topk_kl", "ce", "ce+overwrite")
CROSS = ("pkl", "exact_kl", "uld", "gold", "alm", "alm+overwrite")
# "+overwrite": the same loss with overwrite_logits=True (opt-in: the gradient is written over the
# student logits in backward, so no separate [B, T, Vs] gradient buffer exists); same naive version
OVERWRITE = "+overwrite"
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakRSS:
    def __enter__(self):
        self.base = self.peak = rss()
        self._stop = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop:
            self.peak = max(self.peak, rss())
            time.sleep(0.001)

    def __exit__(self, *exc):
        self._stop = True
        self._t.join()
        self.peak = max(self.peak, rss())


def make_inputs(B, T, Vs, Vt, seed=0):
    """Random logits, a random chunk alignment (1-3 tokens per side per chunk), maps, W."""
    from xdistill.losses import ChunkAlignment, projection_from_csr
    g = torch.Generator().manual_seed(seed)
    zs = torch.randn(B, T, Vs, generator=g) * 2
    zt_same = torch.randn(B, T, Vs, generator=g) * 2
    zt = torch.randn(B, T, Vt, generator=g) * 2
    s_chunk = torch.full((B, T), -1, dtype=torch.long)
    t_chunk = torch.full((B, T), -1, dtype=torch.long)
    n_max = 0
    for b in range(B):
        i = j = k = 0
        while True:
            ls, lt = int(torch.randint(1, 3, (1,), generator=g)), int(torch.randint(1, 3, (1,), generator=g))
            if i + ls > T or j + lt > T:
                break
            s_chunk[b, i:i + ls], t_chunk[b, j:j + lt] = k, k
            i, j, k = i + ls, j + lt, k + 1
        n_max = max(n_max, k)
    valid = torch.zeros(B, n_max, dtype=torch.bool)
    exact = torch.zeros(B, n_max, dtype=torch.bool)
    for b in range(B):
        n = int(s_chunk[b].max()) + 1
        valid[b, :n] = True
        exact[b, :n] = torch.rand(n, generator=g) < 0.5
    align = ChunkAlignment(s_chunk, t_chunk, valid, exact)
    shared = torch.randperm(Vs, generator=g)[: Vs // 2]
    shared_t = torch.randperm(Vt, generator=g)[: Vs // 2]
    rows = torch.arange(Vs).repeat_interleave(2)
    cols = torch.randint(0, Vt, (2 * Vs,), generator=g)
    indptr = torch.arange(0, 2 * Vs + 1, 2)
    W = projection_from_csr(indptr, cols, torch.full((2 * Vs,), 0.5), (Vs, Vt))
    mask = torch.ones(B, T, dtype=torch.bool)
    ids = torch.randint(0, Vs, (B, T), generator=g)
    t_ids = torch.randint(0, Vt, (B, T), generator=g)
    topv, topi = torch.log_softmax(zt_same, -1).topk(64, dim=-1)
    del rows
    return dict(zs=zs, zt_same=zt_same, zt=zt, align=align, shared=shared, shared_t=shared_t, W=W,
                mask=mask, ids=ids, t_ids=t_ids, topv=topv, topi=topi)


# ----------------------------------------------------------------------------- naive versions
def _naive_kl(logq, logp):
    q = logq.exp()
    return torch.where(q > 0, q * (logq - logp), torch.zeros_like(q)).sum(-1)


def _naive_same(name, x, zs):
    m = x["mask"][:, 1:]
    logp = torch.log_softmax(zs[:, :-1], -1)
    if name == "ce":
        return torch.nn.functional.cross_entropy(zs[:, :-1].reshape(-1, zs.shape[2]),
                                                 x["ids"][:, 1:].reshape(-1))
    if name == "topk_kl":
        tv, ti = x["topv"][:, :-1], x["topi"][:, :-1]
        lpk = logp.gather(2, ti)
        lpr = torch.logsumexp(logp.scatter(2, ti, float("-inf")), -1)
        lqr = torch.log1p(-tv.exp().sum(-1).clamp_max(1 - 1e-7))
        t = (tv.exp() * (tv - lpk)).sum(-1) + lqr.exp() * (lqr - lpr)
        return t[m].sum() / m.sum()
    logq = torch.log_softmax(x["zt_same"][:, :-1], -1)
    if name == "forward_kl":
        t = _naive_kl(logq, logp)
    elif name == "reverse_kl":
        t = _naive_kl(logp, logq)
    else:
        logm = torch.logaddexp(logq + torch.log(torch.tensor(0.5)), logp + torch.log(torch.tensor(0.5)))
        t = 0.5 * _naive_kl(logq, logm) + 0.5 * _naive_kl(logp, logm)
    return t[m].sum() / m.sum()


def _naive_cross(name, x, zs):
    from xdistill.losses.chunks import chunk_start_rows, loss_chunks
    from xdistill.losses.cross import sorted_l1_rows
    align = x["align"]
    ok = loss_chunks(align, x["mask"], exact_only=name == "exact_kl")
    b, sr, tr = chunk_start_rows(align, ok)
    logp_all = torch.log_softmax(zs, -1)                 # [B, T, Vs]
    logq_all = torch.log_softmax(x["zt"], -1)            # [B, T, Vt]
    if name == "alm":
        from xdistill.losses.chunks import chunk_sum
        lp = logp_all[:, :-1].gather(2, x["ids"][:, 1:, None]).squeeze(2)
        lq = logq_all[:, :-1].gather(2, x["t_ids"][:, 1:, None]).squeeze(2)
        lp = torch.cat([torch.zeros_like(lp[:, :1]), lp], 1)
        lq = torch.cat([torch.zeros_like(lq[:, :1]), lq], 1)
        C = align.num_chunks
        ls, lt = chunk_sum(lp, align.s_chunk_BTs, C) / 100, chunk_sum(lq, align.t_chunk_BTt, C) / 100
        a = lt.exp()
        d = -(a * ls + (1 - a) * torch.log(-torch.expm1(ls.clamp_max(-1e-30))))
        return d[ok].sum() / ok.sum()
    if name == "pkl":
        support = torch.zeros(x["zt"].shape[2], dtype=torch.bool)
        support[x["W"].col_indices()] = True
        proj_all = (logp_all.exp().reshape(-1, zs.shape[2]) @ x["W"]).reshape(
            *zs.shape[:2], -1)[..., support]             # [B, T, |support|]
        lp = torch.log(proj_all[b, sr])
        lq = torch.log_softmax(x["zt"][..., support], -1)[b, tr]
        return _naive_kl(lq, lp - torch.logsumexp(lp, -1, keepdim=True)).sum() / b.numel()
    if name == "exact_kl":
        lp = torch.log_softmax(logp_all[b, sr][:, x["shared"]], -1)
        lq = torch.log_softmax(logq_all[b, tr][:, x["shared_t"]], -1)
        return _naive_kl(lq, lp).sum() / b.numel()
    p_all, q_all = logp_all.exp(), logq_all.exp()
    if name == "uld":
        return sorted_l1_rows(p_all[b, sr], q_all[b, tr]).sum() / b.numel()
    keep_s = torch.ones(zs.shape[2], dtype=torch.bool)
    keep_s[x["shared"]] = False
    keep_t = torch.ones(x["zt"].shape[2], dtype=torch.bool)
    keep_t[x["shared_t"]] = False
    lp = torch.log_softmax(logp_all[b, sr][:, x["shared"]], -1)
    lq = torch.log_softmax(logq_all[b, tr][:, x["shared_t"]], -1)
    tail = sorted_l1_rows(p_all[b, sr][:, keep_s], q_all[b, tr][:, keep_t])
    return (_naive_kl(lq, lp) + tail).sum() / b.numel()


def _chunked(name, x, zs, chunk):
    import xdistill.losses as L
    m, align = x["mask"], x["align"]
    kw = dict(chunk_size=chunk)
    if name.endswith(OVERWRITE):
        name, kw["overwrite_logits"] = name[: -len(OVERWRITE)], True
    if name == "forward_kl":
        return L.forward_kl(zs, x["zt_same"], m, **kw)
    if name == "reverse_kl":
        return L.reverse_kl(zs, x["zt_same"], m, **kw)
    if name == "jsd":
        return L.jsd(zs, x["zt_same"], m, beta=0.5, **kw)
    if name == "topk_kl":
        return L.topk_forward_kl(zs, x["topv"], x["topi"], m, **kw)
    if name == "ce":
        return L.cross_entropy(zs, x["ids"], **kw)
    kw["s_loss_mask_BTs"] = m
    if name == "pkl":
        return L.projected_kl(zs, x["zt"], align, x["W"], **kw)
    if name == "exact_kl":
        return L.exact_kl(zs, x["zt"], align, x["shared"], x["shared_t"], **kw)
    if name == "uld":
        return L.uld(zs, x["zt"], align, **kw)
    if name == "gold":
        return L.gold_hybrid(zs, x["zt"], align, x["shared"], x["shared_t"], **kw)
    return L.alm(zs, x["ids"], align, teacher_logits_BTtVt=x["zt"], teacher_ids_BTt=x["t_ids"], **kw)


def child(args) -> None:
    """One measurement in this (fresh) process; prints a JSON line."""
    torch.set_num_threads(args.threads)
    x = make_inputs(args.B, args.T, args.Vs, args.Vt)
    zs = x["zs"].requires_grad_(True)
    import warnings
    warnings.filterwarnings("ignore")
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        if args.impl == "naive":
            name = args.loss.removesuffix(OVERWRITE)
            loss = (_naive_same if args.loss in SAME else _naive_cross)(name, x, zs)
        else:
            loss = _chunked(args.loss, x, zs, args.chunk_size)
        value = float(loss.detach())
        loss.backward()
        seconds = time.perf_counter() - t0
    assert zs.grad is not None and zs.grad.shape == zs.shape
    print(json.dumps(dict(loss=args.loss, impl=args.impl, value=value, seconds=seconds,
                          extra_bytes=mem.peak - mem.base, base_bytes=mem.base)))


def run_one(args, loss, impl) -> dict:
    cmd = [sys.executable, __file__, "--child", "--loss", loss, "--impl", impl,
           "--B", str(args.B), "--T", str(args.T), "--Vs", str(args.Vs), "--Vt", str(args.Vt),
           "--chunk-size", str(args.chunk_size), "--threads", str(args.threads)]
    # a fixed mmap threshold returns freed blocks to the OS at once, so RSS tracks live memory
    # instead of glibc's heap cache (which otherwise keeps freed ~32 MiB blocks resident)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(1 << 20))
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        return dict(loss=loss, impl=impl,
                    error=f"{impl} exit {res.returncode}: {res.stderr.strip().splitlines()[-1:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="B=1, T=256 instead of B=4, T=1024")
    ap.add_argument("--only", nargs="*", default=None, help="losses to run (default: all)")
    ap.add_argument("--chunk-size", type=int, default=None,
                    help="rows per block (default 256, or 64 with --small)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="write a markdown table here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--loss", help=argparse.SUPPRESS)
    ap.add_argument("--impl", help=argparse.SUPPRESS)
    for n, d in (("B", 4), ("T", 1024), ("Vs", 32000), ("Vt", 152064)):
        ap.add_argument(f"--{n}", type=int, default=d)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if args.small:
        args.B, args.T = 1, 256
    if args.chunk_size is None:
        args.chunk_size = 64 if args.small else 256
    rows = []
    args.load = [os.getloadavg()]
    print(f"B={args.B} T={args.T} Vs={args.Vs} Vt={args.Vt} fp32, chunk_size={args.chunk_size}, "
          f"{args.threads} threads; fwd+bwd; extra = peak RSS - RSS before the call", flush=True)
    for loss in args.only or (SAME + CROSS):
        naive, chunked = run_one(args, loss, "naive"), run_one(args, loss, "chunked")
        rows.append((loss, naive, chunked))
        print(_fmt(loss, naive, chunked, 4 * args.B * args.T * args.Vs), flush=True)
    args.load.append(os.getloadavg())
    if args.out:
        _write(args, rows)


def _fmt(loss, n, c, grad_bytes) -> str:
    """One table row; ``grad_bytes`` is the size of the student gradient (B*T*Vs*4)."""
    if "error" in n or "error" in c:
        return f"| {loss} | error: {n.get('error') or c.get('error')} |"
    gib = 1 / 2 ** 30
    if loss.endswith(OVERWRITE):  # no separate gradient buffer: nothing to take out
        no_grad = "(no buffer)"
    else:
        no_grad = f"{(c['extra_bytes'] - grad_bytes) / max(n['extra_bytes'] - grad_bytes, 1):.0%}"
    return (f"| {loss} | {n['extra_bytes'] * gib:.2f} | {c['extra_bytes'] * gib:.2f} | "
            f"{c['extra_bytes'] / max(n['extra_bytes'], 1):.0%} | {no_grad} | {n['seconds']:.2f} | "
            f"{c['seconds']:.2f} | {c['seconds'] / n['seconds']:.2f}x | "
            f"{abs(c['value'] - n['value']) / max(abs(n['value']), 1e-12):.1e} |")


HEADER = ("| loss | naive extra GiB | chunked extra GiB | mem ratio | mem ratio excl. grad | "
          "naive s | chunked s | time ratio | rel. diff |\n|---|---|---|---|---|---|---|---|---|")


def _write(args, rows) -> None:
    import platform
    lines = [f"# Loss benchmark ({'small' if args.small else 'full'} size)", "",
             f"Hardware: {platform.machine()} CPU, {os.cpu_count()} cores, no GPU; torch "
             f"{torch.__version__}; {args.threads} thread(s), CPU affinity "
             f"{sorted(os.sched_getaffinity(0))}; load average (1/5/15 min) "
             f"{'/'.join(f'{v:.1f}' for v in args.load[0])} at the start and "
             f"{'/'.join(f'{v:.1f}' for v in args.load[-1])} at the end (the machine was shared "
             "with other jobs).",
             f"Shapes: B={args.B}, T={args.T}, Vs={args.Vs}, Vt={args.Vt}, float32 logits; "
             f"chunk_size={args.chunk_size} rows. Forward + backward w.r.t. the student logits.",
             "Memory: peak RSS (sampled every 1 ms from /proc/self/statm in a thread) minus RSS "
             "before the call, each measurement in a fresh subprocess with "
             "MALLOC_MMAP_THRESHOLD_=1MiB (freed blocks go back to the OS, so RSS tracks live "
             "tensors). The student gradient itself (B*T*Vs*4 bytes) is part of both columns; "
             "'mem ratio excl. grad' subtracts it from both. '+overwrite' rows: "
             "overwrite_logits=True, the gradient is written over the student logits (no "
             "separate gradient buffer), against the same naive version.",
             "", HEADER]
    lines += [_fmt(loss, n, c, 4 * args.B * args.T * args.Vs) for loss, n, c in rows]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
