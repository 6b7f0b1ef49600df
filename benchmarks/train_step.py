"""Off-policy train step vs the sum of its parts, with 1 and 2 teachers (CPU by default).

    python benchmarks/train_step.py [--steps 6] [--out benchmarks/results/train_step.md]

In one process, on the same pre-fetched batches (so data loading is excluded):

* ``full``: the trainer's own step (:func:`xdistill.train.core.train_step` pieces: global
  counts, per micro-batch teachers -> student forward -> MultiTeacherLoss -> backward, then clip +
  AdamW + scheduler);
* ``teacher``: the teacher forwards alone (``TeacherPool.forward`` on the same batches);
* ``student``: student forward + backward of a trivial loss (``logits.mean()``) + clip + AdamW;
* ``align``: the collator's time for those batches (alignment + teacher tokenization, done in the
  DataLoader workers during training, added here because it is part of the overhead).

``overhead = full + align - (teacher + student)``: alignment, transport (device moves, building
loss inputs) and the distillation losses. Target: overhead < 25% of ``teacher + student``.
The three run in interleaved rounds on the same batch, so a shared machine's load hits them
alike; wall time and process CPU time are reported (min and median over rounds), with the
per-phase split of the full step and each teacher's loss forward+backward alone on fixed logits
(plus a plain log-softmax forward KL as the reference for the same-tokenizer loss).
Models: Llama-architecture student and teachers over BPE tokenizers trained on Shakespeare
(student and cross teacher with different vocabularies; the second teacher shares the student's).

``--compare-reference`` also runs the whole measurement with the previous P-KL formulation
(:func:`reference_projected_kl`: autograd through dense @ sparse-CSR ``p @ W`` over ``[n, Vt]``)
patched in, for before/after figures from one process. ``--pkl-shape B,T,Vs,Vt`` times
``projected_kl`` alone (forward + backward) at that shape with a random multi-token-like W (~4
non-zeros per student row, 5% unmapped rows), current vs reference; ``--pkl-only`` skips the train
step. For single-thread figures on a shared machine: ``OMP_NUM_THREADS=1 taskset -c 1 python
benchmarks/train_step.py --threads 1``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
import xdistill.tiny as mk  # noqa: E402


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


def _timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process, all threads) of ``fn()``."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def _plain_forward_kl(z_s, z_t, mask):
    """Reference same-tokenizer forward KL: two full log-softmaxes, no blocking, no custom grad."""
    m = mask[:, 1:].bool()
    logq = torch.log_softmax(z_t[:, :-1][m].float(), -1)
    logp = torch.log_softmax(z_s[:, :-1][m].float(), -1)
    return (logq.exp() * (logq - logp)).sum() / m.sum()


def loss_parts(run, batch, rounds: int) -> dict:
    """Loss forward+backward alone, per teacher (MultiTeacherLoss with that teacher only) on
    fixed logits, and the plain reference KL for the same-tokenizer teacher."""
    from xdistill.losses import MultiTeacherLoss
    from xdistill.train.forward import student_logits
    from xdistill.train.step import global_counts, loss_inputs

    n = global_counts(run.mode.loss_fn, [batch], False)
    out = {}
    with run.mode.pool.forward(batch) as results, torch.no_grad():
        z_s = student_logits(run.model, batch)
        inputs = loss_inputs(run.mode.loss_fn.specs, batch, results)
        for spec, inp in zip(run.mode.loss_fn.specs, inputs):
            loss_fn = MultiTeacherLoss([spec], chunk_size=run.cfg.loss.chunk_size)

            def ours(spec=spec, inp=inp, loss_fn=loss_fn):
                with torch.enable_grad():
                    z = z_s.detach().requires_grad_()
                    loss, _ = loss_fn(z, batch.input_ids_BTs, batch.loss_mask_BTs, [inp],
                                      num_valid={spec.name: n[spec.name]})
                    loss.backward()

            out[f"{spec.name} ({spec.loss})"] = _best(ours, rounds)
            if spec.loss == "forward_kl":
                def plain(inp=inp):
                    with torch.enable_grad():
                        z = z_s.detach().requires_grad_()
                        _plain_forward_kl(z, inp.logits_BTtV, batch.loss_mask_BTs).backward()

                out["plain log-softmax forward KL (reference)"] = _best(plain, rounds)
        if len(inputs) > 1:
            def together():
                with torch.enable_grad():
                    z = z_s.detach().requires_grad_()
                    loss, _ = run.mode.loss_fn(z, batch.input_ids_BTs, batch.loss_mask_BTs,
                                               inputs, num_valid=n)
                    loss.backward()

            out["all teachers in one MultiTeacherLoss"] = _best(together, rounds)
    return out


def _best(fn, rounds: int) -> tuple[float, float]:
    fn()  # warm-up
    runs = [_timed(fn) for _ in range(rounds)]
    return min(w for w, _ in runs), min(c for _, c in runs)


def measure(cfg, steps: int) -> dict:
    """Interleaved rounds (teacher, student, full on the same batch, in turn) so that the load of
    a shared machine hits the three alike; per quantity the minimum and the median over rounds of
    wall time and of process CPU time."""
    from xdistill.train import core
    from xdistill.train.offpolicy import OffPolicyMode
    from xdistill.train.metrics import Timers
    from xdistill.train.forward import student_logits
    from xdistill.train.step import global_counts, micro_step

    run = core.build(cfg, OffPolicyMode())
    run.mode.pool.start()

    def optimizer_step(run):
        core.optimizer_step(run, 1, {"loss": 0.0})

    try:
        it = iter(run.mode.loaders[0])
        batches = [next(it) for _ in range(steps + 1)]
        timers = Timers()

        def full(b):
            with timers("counts"):
                n = global_counts(run.mode.loss_fn, [b], False)
            micro_step(run.model, run.mode.loss_fn, run.mode.pool, b, n, timers,
                       device=run.device)
            optimizer_step(run)

        def teacher(b):
            with run.mode.pool.forward(b):
                pass

        def student(b):
            student_logits(run.model, b).mean().backward()
            optimizer_step(run)

        fns = (("teacher", teacher), ("student", student), ("full", full))
        for _, fn in fns:
            fn(batches[0])  # warm-up
        samples, splits = {name: [] for name, _ in fns}, []
        for b in batches[1:]:
            for name, fn in fns:
                timers.seconds.clear()
                samples[name].append(_timed(lambda: fn(b)))
            splits.append(dict(timers.seconds))
        out = {name: {"wall_min": min(w for w, _ in v), "wall_med": statistics.median(w for w, _ in v),
                      "cpu_min": min(c for _, c in v), "cpu_med": statistics.median(c for _, c in v)}
               for name, v in samples.items()}
        out["split"] = {k: statistics.median(sp.get(k, 0.0) for sp in splits) for k in splits[0]}
        out["align"] = statistics.median(b.stats.collate_seconds for b in batches[1:])
        out["tokens"] = statistics.median(b.stats.student_tokens for b in batches[1:])
        out["loss_parts"] = loss_parts(run, batches[1], max(2, steps // 2))
    finally:
        run.mode.pool.close()
    return out


# ----------------------------------------------------------------------------- P-KL reference
def reference_projected_kl(student_logits_BTsVs, teacher_logits_BTtVt, align, proj_VsVt, *,
                           s_loss_mask_BTs=None, t_loss_mask_BTt=None, direction="forward",
                           beta=0.5, temperature=1.0, teacher_temperature=None, num_valid=None,
                           chunk_size=256):
    """The previous P-KL formulation (same math, same signature as ``projected_kl``): autograd
    through ``p @ W`` (dense @ sparse CSR) and masks over full ``[n, Vt]`` rows."""
    import xdistill.losses.cross as cross
    from xdistill.losses.engine import log_softmax_safe

    def safe_log(x):
        pos = x > 0
        return torch.where(pos, torch.log(torch.where(pos, x, torch.ones_like(x))),
                           torch.full_like(x, float("-inf")))

    tau = float(temperature)
    tau_t = tau if teacher_temperature is None else float(teacher_temperature)
    dt = torch.float64 if student_logits_BTsVs.dtype == torch.float64 else torch.float32
    W = proj_VsVt.to(dt)
    support_Vt = torch.zeros(W.shape[1], dtype=torch.bool)
    support_Vt[W.col_indices()[W.values() > 0]] = True
    div = cross._divergence(direction, beta)

    def rows_fn(z_s, z_t):
        m = torch.exp(log_softmax_safe(z_s / tau)) @ W
        m = torch.where(support_Vt, m, torch.zeros_like(m))
        logp = safe_log(m) - safe_log(m.sum(-1, keepdim=True))
        zt = (z_t / tau_t).masked_fill(~support_Vt, float("-inf"))
        return div(logp, log_softmax_safe(zt)).sum()

    return cross._chunk_start_loss(student_logits_BTsVs, teacher_logits_BTtVt, align,
                                   s_loss_mask_BTs, t_loss_mask_BTt, rows_fn, exact_only=False,
                                   num_valid=num_valid, chunk_size=chunk_size, scale=tau ** 2)


def pkl_inputs(B: int, T: int, Vs: int, Vt: int, nnz: int = 4, seed: int = 0):
    """Random logits, a random chunk alignment (1-2 tokens per side per chunk) and a random
    multi-token-like projection: ``nnz`` teacher tokens per student token with random weights
    summing to 1, 5% of student tokens unmapped."""
    from xdistill.losses import ChunkAlignment, projection_from_csr

    g = torch.Generator().manual_seed(seed)
    zs = torch.randn(B, T, Vs, generator=g) * 2
    zt = torch.randn(B, T, Vt, generator=g) * 2
    s_chunk = torch.full((B, T), -1, dtype=torch.long)
    t_chunk = torch.full((B, T), -1, dtype=torch.long)
    n_max = 0
    for b in range(B):
        lens = torch.randint(1, 3, (2, T), generator=g).tolist()
        i = j = k = 0
        while i + lens[0][k] <= T and j + lens[1][k] <= T:
            s_chunk[b, i:i + lens[0][k]], t_chunk[b, j:j + lens[1][k]] = k, k
            i, j, k = i + lens[0][k], j + lens[1][k], k + 1
        n_max = max(n_max, k)
    valid = torch.zeros(B, n_max, dtype=torch.bool)
    for b in range(B):
        valid[b, :int(s_chunk[b].max()) + 1] = True
    align = ChunkAlignment(s_chunk, t_chunk, valid, valid & (torch.rand(B, n_max, generator=g) < .5))
    mapped = torch.rand(Vs, generator=g) >= 0.05
    w = torch.rand(Vs, nnz, generator=g) * mapped[:, None]
    w = w / w.sum(1, keepdim=True).clamp_min(1e-30)
    cols = torch.randint(0, Vt, (Vs, nnz), generator=g)
    keep = (w > 0).reshape(-1)
    indptr = torch.zeros(Vs + 1, dtype=torch.long)
    indptr[1:] = torch.cumsum((w > 0).sum(1), 0)
    W = projection_from_csr(indptr, cols.reshape(-1)[keep], w.reshape(-1)[keep], (Vs, Vt))
    return zs, zt, align, W


def pkl_alone(shape: tuple[int, int, int, int], rounds: int) -> dict:
    """``projected_kl`` forward + backward alone, current vs reference formulation (wall, CPU s)."""
    from xdistill.losses import projected_kl

    B, T, Vs, Vt = shape
    zs, zt, align, W = pkl_inputs(B, T, Vs, Vt)
    out = {"rows": int(align.chunk_valid_BC.sum()), "nnz": int(W.values().numel())}
    for name, fn in (("current", projected_kl), ("reference", reference_projected_kl)):
        def run(fn=fn):
            z = zs.clone().requires_grad_()
            fn(z, zt, align, W, chunk_size=256).backward()

        out[name] = _best(run, rounds if name == "current" else 1)
    return out


def _load() -> str:
    try:
        return "load average (1/5/15 min) %.2f / %.2f / %.2f" % os.getloadavg()
    except OSError:
        return "load average unknown"


def report(results: dict, args, load_before: str, load_after: str, pkl: dict | None = None) -> str:
    lines = ["# Off-policy train step vs the sum of its parts", "",
             f"Hardware: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
             f"{torch.get_num_threads()} torch threads, CPU only (no GPU); torch {torch.__version__}. "
             f"Shared machine: {load_before} before, {load_after} after the run.",
             f"Models: Llama student/teachers hidden {args.hidden}, {args.layers} layers; "
             f"student vocab {args.vocab_s}, cross teacher vocab {args.vocab_t} (pkl through a "
             f"built projection), same-tokenizer teacher forward KL; batch {args.batch} x "
             f"{args.seq_len} tokens; {args.steps} interleaved rounds (teacher, student, full on "
             "the same batch in turn).", "",
             "overhead = full + align - (teacher + student): alignment, transport and the "
             "distillation losses. Target < 25% of teacher + student. Wall time on a loaded "
             "machine is noisy; CPU time (process_time, all threads) is the steadier figure.", "",
             "| teachers | measure | full step | align (collator) | teacher alone | student alone "
             "| overhead | overhead / (teacher+student) |", "|---|---|---|---|---|---|---|---|"]
    for n, r in results.items():
        for m in ("cpu_min", "cpu_med", "wall_min", "wall_med"):
            t, s, f = r["teacher"][m], r["student"][m], r["full"][m]
            base, over = t + s, f + r["align"] - (t + s)
            lines.append(f"| {n} | {m} | {f:.3f} | {r['align']:.3f} | {t:.3f} | {s:.3f} | "
                         f"{over:.3f} | {100 * over / base:.1f}% |")
    lines += ["", "Per-phase split of the full step (wall seconds, median over rounds; counts = the "
              "global loss-unit count, loss = loss forward, student = student forward + backward "
              "incl. the loss backward):", ""]
    for n, r in results.items():
        lines.append(f"* {n} teacher(s): " + ", ".join(f"{k} {v:.3f}" for k, v in r["split"].items()))
    lines += ["", "Loss forward + backward alone on fixed logits (best of rounds; wall s / CPU s):", ""]
    for n, r in results.items():
        for name, (w, c) in r["loss_parts"].items():
            lines.append(f"* {n} teacher(s), {name}: {w:.3f} / {c:.3f}")
    if pkl:
        (cw, cc), (rw, rc) = pkl["current"], pkl["reference"]
        lines += ["", f"`projected_kl` alone, forward + backward, B,T,Vs,Vt = {pkl['shape']}, "
                  f"{pkl['rows']} chunk-start rows, W with {pkl['nnz']} non-zeros (chunk_size 256; "
                  "wall s / CPU s):", "",
                  f"* current: {cw:.3f} / {cc:.3f} (best of {pkl['rounds']})",
                  f"* reference (previous formulation): {rw:.3f} / {rc:.3f} (one run)",
                  f"* speed-up: {rw / cw:.1f}x wall, {rc / cc:.1f}x CPU"]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- pipelined teachers
def pipeline_config(a: dict, args, out: Path, pipelined: bool):
    """One same-tokenizer subprocess teacher (forward KL), ``teacher_layers`` deep so that its
    forward takes about as long as the student's whole step; one thread each, so the two can
    run on the two cores at once."""
    from xdistill.config import from_dict
    from xdistill.train.config import OffPolicyConfig

    return from_dict(OffPolicyConfig, {
        "student": {"model_type": "llama", "model_config": dict(a["size"], vocab_size=args.vocab_s),
                    "init_seed": 0},
        "student_tokenizer": a["tok_s"],
        "teachers": [{"name": "sub", "tokenizer": a["tok_s"],
                      "worker": {"model": a["deep"], "placement": "subprocess", "num_threads": 1,
                                 "slots": 2, "micro_batch_size": args.batch},
                      "loss": {"kind": "forward_kl"}}],
        "data": {"paths": [a["train"]], "seq_len": args.seq_len, "batch_size": args.batch,
                 "num_workers": 0},
        "loss": {"chunk_size": 256, "ce_weight": 0.1}, "optim": {"implementation": "foreach"},
        "train": {"steps": args.pipeline_steps, "out_dir": str(out), "tensorboard": False,
                  "num_threads": 1, "pipeline_teachers": pipelined, "log_every": 1},
        "checkpoint": {"export_hf": True, "resume": ""}})


def measure_pipeline(assets: dict, args, root: Path) -> dict:
    """Sequential then pipelined runs of the real trainer (``core.train``) on the same config.

    From the sequential run (nothing overlaps): ``teacher`` = the step's teacher wait (forward +
    transport), ``student`` = the rest of the step minus data loading. Step times are medians
    over the steps after ``--warmup``. The pipelined run must equal the sequential one bitwise
    (per-step losses and the exported weights)."""
    from safetensors.torch import load_file

    from xdistill.metrics import read_metrics
    from xdistill.tiny import save_tiny_lm
    from xdistill.train.offpolicy import run_offpolicy

    deep = dict(assets["size"], num_hidden_layers=args.teacher_layers)
    assets = dict(assets, deep=str(save_tiny_lm(root / "deep", assets["tok_s"], seed=3, **deep)))
    runs = {}
    for name, pipelined in (("sequential", False), ("pipelined", True)):
        out = root / f"pipe_{name}"
        run_offpolicy(pipeline_config(assets, args, out, pipelined))
        recs = [r for r in read_metrics(out / "metrics.jsonl") if "loss" in r][args.warmup:]
        med = lambda k: statistics.median(r.get(k, 0.0) for r in recs)  # noqa: E731
        runs[name] = {"step": med("step_s"), "teacher": med("time/teacher"),
                      "data": med("time/data"), "losses": [r["loss"] for r in recs],
                      "weights": load_file(str(out / "export" / "model.safetensors"))}
    seq, pipe = runs["sequential"], runs["pipelined"]
    student = seq["step"] - seq["teacher"] - seq["data"]
    same_w = all(torch.equal(seq["weights"][k], pipe["weights"][k]) for k in seq["weights"])
    return {"sequential_step": seq["step"], "pipelined_step": pipe["step"],
            "teacher": seq["teacher"], "student": student,
            "bound": max(seq["teacher"], student), "sum": seq["teacher"] + student,
            "bitwise_losses": seq["losses"] == pipe["losses"], "bitwise_weights": same_w}


def pipeline_report(r: dict, args, load_before: str, load_after: str) -> str:
    ratio = r["pipelined_step"] / r["bound"]
    return "\n".join([
        "# Pipelined teachers: subprocess teacher overlapping the student", "",
        f"Hardware: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, CPU only; "
        f"torch {torch.__version__}. {load_before} before, {load_after} after.",
        f"Student: Llama hidden {args.hidden}, {args.layers} layers, vocab {args.vocab_s}, one "
        f"thread; teacher: the same with {args.teacher_layers} layers in a subprocess (one thread, "
        f"2 slots, shared memory); batch {args.batch} x {args.seq_len}; {args.pipeline_steps} steps "
        f"(medians after {args.warmup} warm-up steps), `core.train` with "
        "train.pipeline_teachers false, then true.", "",
        "| quantity | seconds |", "|---|---|",
        f"| teacher (forward + transport, sequential run) | {r['teacher']:.3f} |",
        f"| student (rest of the sequential step) | {r['student']:.3f} |",
        f"| max(teacher, student) | {r['bound']:.3f} |",
        f"| teacher + student | {r['sum']:.3f} |",
        f"| sequential step | {r['sequential_step']:.3f} |",
        f"| pipelined step | {r['pipelined_step']:.3f} |", "",
        f"pipelined / max(teacher, student) = {ratio:.2f} (target <= 1.15); "
        f"sequential / pipelined = {r['sequential_step'] / r['pipelined_step']:.2f}.",
        f"Bitwise equal to the sequential run: losses {r['bitwise_losses']}, exported weights "
        f"{r['bitwise_weights']}.", ""])


@contextlib.contextmanager
def _pkl_impl(fn):
    """Route MultiTeacherLoss's P-KL through ``fn`` (None: the current implementation)."""
    import xdistill.losses.cross as cross

    saved = cross.projected_kl
    cross.projected_kl = fn or saved
    try:
        yield
    finally:
        cross.projected_kl = saved


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
    p.add_argument("--compare-reference", action="store_true",
                   help="also measure with the previous P-KL formulation (before/after)")
    p.add_argument("--pkl-shape", default="",
                   help="B,T,Vs,Vt: also time projected_kl alone at this shape, e.g. 4,1024,32000,152064")
    p.add_argument("--pkl-only", action="store_true", help="skip the train step measurement")
    p.add_argument("--pipeline", action="store_true",
                   help="only the pipelined-teacher benchmark (subprocess teacher vs student)")
    p.add_argument("--teacher-layers", type=int, default=12)
    p.add_argument("--pipeline-steps", type=int, default=14)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    results, load_before = {}, _load()
    if args.pipeline:
        with tempfile.TemporaryDirectory() as tmp:
            assets = build_assets(Path(tmp), args)
            load_before = _load()
            r = measure_pipeline(assets, args, Path(tmp))
        text = pipeline_report(r, args, load_before, _load())
        print(text)
        out = Path(args.out).with_name("train_step_pipeline.md")
        out.write_text(text, encoding="utf-8")
        return 0 if r["bitwise_losses"] and r["bitwise_weights"] else 1
    impls = [("", None)] + ([(", reference P-KL", reference_projected_kl)]
                            if args.compare_reference else [])
    if not args.pkl_only:
        with tempfile.TemporaryDirectory() as tmp:
            assets = build_assets(Path(tmp), args)
            load_before = _load()
            for i, (label, fn) in enumerate(impls):
                with _pkl_impl(fn):
                    for n in (1, 2):
                        cfg = make_config(assets, n, args, Path(tmp) / f"run{n}_{i}")
                        results[f"{n}{label}"] = measure(cfg, args.steps)
    pkl = None
    if args.pkl_shape:
        shape = tuple(int(x) for x in args.pkl_shape.split(","))
        pkl = dict(pkl_alone(shape, 3), shape=shape, rounds=3)
    text = report(results, args, load_before, _load(), pkl)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
