"""Real-pair off-policy step on CPU: Gemma-3-270M teacher -> SmolLM2-135M student (P-KL).

    .venv/bin/python benchmarks/real/step.py [--steps 6] [--batch 4] [--seq-len 64]
        [--variants before,split,threads,projected,pipelined,bf16,bf16_sdpa,eager,cached,float32,auto,
                    system,support,support_auto]
        [--repeats 1] [--random-init] [--projection NPZ]
        [--out FILE]

``--random-init`` times random-initialised models of the two real architectures (same shapes,
same step cost) where only the assets' configs and tokenizers exist, as on the GPU check's
machine (``tools/gpu_check.py --parts cpu``).

Every variant is the real trainer (``core.build`` + ``OffPolicyMode`` + ``core.train_step``) in a
fresh subprocess (its own peak RSS), on the same Shakespeare windows and projection; the table
gives the mean step time over steps 2.. with its split, the peak RSS, and the ratio to
``before`` (the first variant listed when ``before`` is not run). With ``--repeats N`` the
variants run round-robin N times, each round starting one variant later (so a change in the
machine's load, or a position in the round, hits all of them alike), and
each row is the run with the median step time; the spread column gives min-max over the runs.
The header names the CPU and the bf16 units torch reports on it. Every variant but ``auto`` sets
the teacher's ``dtype`` and the student's ``param_dtype`` explicitly (float32 unless it says
otherwise), so they mean the same on every CPU. Variants (each changes one thing from the one
above it, except the last four):

* ``before``    the trainer as it was: in-process teacher computing its full logits through the
                model's own forward (logits + soft-cap temporaries), OpenMP's spinning wait policy;
* ``split``     teacher outputs written block by block from hidden states (one logits buffer);
* ``threads``   + xdistill's OpenMP wait default (``OMP_WAIT_POLICY=PASSIVE`` when this variant
                was added, ``GOMP_SPINCOUNT=1000`` since: ``xdistill/__init__.py``);
* ``projected`` + the teacher returns log-probs already projected into the student vocabulary
                (49k instead of 262k floats per position);
* ``pipelined`` full logits, the teacher in a subprocess with one thread, scoring the next
                micro-batch while the student (one thread) computes;
* ``bf16``      ``threads`` with the teacher's weights *and* the student's compute dtype in
                bfloat16 (float32 master weights and AdamW state): what ``auto`` picks on a device
                with fast bf16 units, forced (slower on CPUs without AMX);
* ``bf16_sdpa`` ``bf16`` with the student's attention forced to transformers' bfloat16 ``sdpa``
                (what a bf16 student ran before it got float32 attention on CPUs:
                ``xdistill/student/attention.py``); compare it with ``bf16``;
* ``eager``     ``threads`` with eager attention in teacher and student instead of transformers'
                default (SDPA);
* ``cached``    ``threads`` with the teacher output cache (``worker.cache_mb``) over a one-document
                corpus packed the same way every epoch (``data.shuffle: false``): from step 2 on
                every window is a cache hit, the steady state of epochs >= 2 of a multi-epoch run;
* ``float32``   ``threads`` again under this name: teacher and student compute in float32;
* ``auto``      ``threads`` with ``dtype: auto`` (teacher) and ``param_dtype: auto`` (student),
                the defaults: bfloat16 where torch reports fast bf16 units, else float32.
                Compare it with ``float32`` in the same run.
* ``system``    ``float32`` with ``train.host_allocator: system``: glibc returns every large
                freed block to the OS and page-faults it in again next step (every other variant
                runs with the default, ``auto`` = reuse on CPU; ``xdistill/host_memory.py``).
* ``support``   ``float32`` with the teacher's ``output: support``: its head computes only the
                projection's support columns (46,445 of Gemma's 262,144) and no token
                log-probs, all that P-KL reads (``xdistill/teacher/outputs.py``);
* ``support_auto`` ``support`` with ``dtype: auto`` / ``param_dtype: auto``: compare it with
                ``support`` for the bf16 ratio of a step that uses it.

Any variant takes an OpenMP wait-policy suffix (``support_auto@spin1000``): ``@passive``
(``OMP_WAIT_POLICY=PASSIVE``), ``@active`` (spinning until the next parallel region) or
``@spin<N>`` (``GOMP_SPINCOUNT=N``: spin N iterations, then sleep). Without one, a variant runs
with xdistill's default (``before`` and ``split``: ``ACTIVE``, as the trainer then was). Wait
policies change timings, never numbers.

Top-k teacher outputs are not a variant: cross-tokenizer P-KL needs the teacher's full
distribution (logits or projected); ``output: topk`` serves same-tokenizer ``topk_kl``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = ("before", "split", "threads", "projected", "pipelined", "bf16", "bf16_sdpa", "eager",
            "cached", "float32", "auto", "system", "support", "support_auto")
PHASES = ("data", "teacher", "transport", "student", "loss", "optim")


def build_projection(path: Path) -> Path:
    """The SmolLM2 <- Gemma-3 projection every variant reads (``multitoken,exact``, top 4)."""
    from xdistill.projection import BuildConfig, save_projection
    from xdistill.projection import build_projection as build
    from xdistill.tokenization import load_tokenizer

    proj = build(load_tokenizer("smollm2-135m"), load_tokenizer("gemma3-270m"),
                 BuildConfig(methods=("multitoken", "exact"), top_k=4))
    save_projection(proj, path)
    return path


def random_model(name: str, root: Path) -> str:
    """A random-initialised model of asset ``name``'s architecture (its ``config.json``), saved
    as a float32 Hugging Face folder under ``root``: step timings need the shapes, not the
    weights (a machine that gets only the tokenizers and configs, e.g. ``tools/gpu_check.py``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from xdistill.assets import model_dir

    torch.manual_seed(0)
    cfg = AutoConfig.from_pretrained(model_dir(name))
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    out = root / f"random_{name}"
    model.save_pretrained(out)
    return str(out)


def assets(root: Path, args) -> dict:
    from xdistill.assets import model_dir
    from xdistill.tiny import make_corpus

    train, _ = make_corpus(root / "corpus", n_train=120, n_eval=4, max_chars=600)
    one, _ = make_corpus(root / "one_doc", n_train=1, n_eval=1, max_chars=600)
    proj = Path(args.projection) if args.projection else build_projection(root / "proj.npz")
    if args.random_init:
        student, teacher = (random_model(n, root) for n in ("smollm2-135m", "gemma3-270m"))
    else:
        student, teacher = (str(model_dir(n)) for n in ("smollm2-135m", "gemma3-270m"))
    return {"train": str(train), "one_doc": str(one), "proj": str(proj),
            "student": student, "teacher": teacher}


def config(variant: str, a: dict, args, out: Path) -> dict:
    worker = {"model": a["teacher"], "micro_batch_size": args.batch}
    threads = 2
    if variant == "projected":
        worker["output"] = "projected"
    if variant.startswith("support"):
        worker["output"] = "support"
    if variant == "pipelined":
        worker.update(placement="subprocess", num_threads=1, slots=2)
        threads = 1
    dtype = {"bf16": "bfloat16", "bf16_sdpa": "bfloat16", "auto": "auto",
             "support_auto": "auto"}.get(variant, "float32")
    worker["dtype"] = dtype
    student = {"path": a["student"], "param_dtype": dtype}
    if variant == "bf16_sdpa":
        student["attn_implementation"] = "sdpa"
    if variant == "eager":
        worker["attn_implementation"] = student["attn_implementation"] = "eager"
    data = {"paths": [a["train"]], "seq_len": args.seq_len, "batch_size": args.batch,
            "num_workers": 1}
    if variant == "cached":
        worker["cache_mb"] = 4096
        data.update(paths=[a["one_doc"]], shuffle=False)
    return {"student": student, "student_tokenizer": "smollm2-135m",
            "teachers": [{"name": "gemma", "tokenizer": "gemma3-270m", "add_bos": True,
                          "worker": worker,
                          "loss": {"kind": "pkl", "projection": a["proj"]}}],
            "data": data,
            "loss": {"ce_weight": 0.1, "chunk_size": 64},
            "optim": {"lr": 1e-5}, "scheduler": {"kind": "constant"},
            "train": {"steps": args.steps, "out_dir": str(out), "tensorboard": False,
                      "num_threads": threads, "pipeline_teachers": variant == "pipelined",
                      "host_allocator": "system" if variant == "system" else "auto"},
            "checkpoint": {"export_hf": False, "resume": ""}}


def child(variant: str, cfg_path: str) -> dict:
    """One variant in this (fresh) process: its steps' metrics and the peak RSS."""
    from xdistill.config import from_dict
    from xdistill.metrics import peak_rss_mb
    from xdistill.train import core
    from xdistill.train.config import OffPolicyConfig
    from xdistill.train.offpolicy import OffPolicyMode

    if variant == "before":
        from xdistill.teacher.worker import TeacherWorker

        TeacherWorker._split_head = lambda self: None
    cfg = from_dict(OffPolicyConfig, json.loads(Path(cfg_path).read_text()))
    run = core.build(cfg, OffPolicyMode())
    run.mode.start(run)
    engine = getattr(run.mode.pool.clients["gemma"], "engine", None)
    try:
        every = [core.train_step(run, s) for s in range(1, cfg.train.steps + 1)]
        ms = every[1:]
        cache = getattr(engine, "cache", None)
        note = "" if cache is None else cache.summary()
        if variant in ("float32", "bf16", "bf16_sdpa", "auto", "system", "support",
                       "support_auto"):
            from xdistill.student.mixed import compute_dtype_of

            weights = next(engine.model.parameters()).dtype if engine is not None else "?"
            note = (f"teacher weights {str(weights).removeprefix('torch.')}, student compute "
                    f"{str(compute_dtype_of(run.model)).removeprefix('torch.')}, master "
                    f"{str(next(run.model.parameters()).dtype).removeprefix('torch.')}")
    finally:
        run.mode.close()
    mean = lambda k: sum(m.get(k, 0.0) for m in ms) / len(ms)  # noqa: E731
    return {"step": mean("step_s"), "split": {k: mean(f"time/{k}") for k in PHASES},
            "tokens": mean("tokens"), "loss": ms[-1]["loss"], "first_loss": every[0]["loss"],
            "peak_mb": peak_rss_mb(), "note": note}


def wait_env(variant: str) -> dict[str, str]:
    """The OpenMP wait-policy variables of ``variant`` (``base@policy``; module doc)."""
    base, _, policy = variant.partition("@")
    policy = policy or ("active" if base in ("before", "split") else "")
    if not policy:
        return {}                       # xdistill's default (set when the child imports it)
    if policy in ("active", "passive"):
        return {"OMP_WAIT_POLICY": policy.upper()}
    if policy.startswith("spin") and policy[4:].isdigit():
        return {"GOMP_SPINCOUNT": policy[4:]}
    raise SystemExit(f"variant {variant!r}: wait policy {policy!r} is not active, passive or "
                     "spin<N>")


def run_variant(variant: str, a: dict, args, root: Path) -> dict:
    base = variant.partition("@")[0]
    if base not in VARIANTS:
        raise SystemExit(f"unknown variant {base!r}; choose from {', '.join(VARIANTS)}")
    path = root / f"{variant}.json"
    path.write_text(json.dumps(config(base, a, args, root / variant)))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("XDISTILL_AUTO_DTYPE", None)  # auto means this CPU's detection
    for key in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        env.pop(key, None)
    env.update(wait_env(variant))
    proc = subprocess.run([sys.executable, __file__, "--child", base, str(path)], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"variant {variant} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median_runs(runs: dict) -> dict:
    """Per variant: its run with the median step time, with the min and max of all its runs, and
    the median over rounds of its step time divided by the reference's in the same round
    (``paired``: load that changes between rounds cancels)."""
    out = {}
    ref = runs.get("before", next(iter(runs.values())))
    for name, rs in runs.items():
        ratios = sorted(r["step"] / q["step"] for r, q in zip(rs, ref))
        rs = sorted(rs, key=lambda r: r["step"])
        out[name] = dict(rs[(len(rs) - 1) // 2], lo=rs[0]["step"], hi=rs[-1]["step"], n=len(rs),
                         paired=ratios[(len(ratios) - 1) // 2])
    return out


def cpu_line() -> str:
    """The CPU's model name and the bf16 units torch reports on it (what ``auto`` reads)."""
    from xdistill.precision import cpu_bf16_units, fast_bf16

    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    name = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")),
                platform.processor() or "unknown CPU")
    units = ", ".join(k for k, v in cpu_bf16_units().items() if v) or "none"
    return f"{name} (bf16 units torch reports: {units}; auto: {fast_bf16('cpu')[1]})"


def report(res: dict, args, seconds: float, load: str) -> str:
    ref = res.get("before", next(iter(res.values())))["step"]
    lines = ["# Real pair, off-policy P-KL step: Gemma-3-270M -> SmolLM2-135M (CPU)", "",
             f"{cpu_line()}; {platform.machine()}, {os.cpu_count()} cores "
             f"({len(os.sched_getaffinity(0))} usable by this process), run on the CPU; {load}; "
             f"{'random-initialised models of the real shapes; ' if args.random_init else ''}"
             f"batch {args.batch} x "
             f"{args.seq_len} student tokens; mean over steps 2..{args.steps}; every variant a fresh "
             f"process; {args.repeats} round(s), median run shown; total {seconds:.0f} s.", "",
             "| variant | s/step | min-max | x ref | x ref paired | student tok/s | "
             "peak RSS (MB) | " + " | ".join(PHASES) + " | first loss | last loss |",
             "|---|---|---|---|---|---|---|" + "---|" * (len(PHASES) + 2)]
    for name, r in res.items():
        split = " | ".join(f"{r['split'][k]:.2f}" for k in PHASES)
        lines.append(f"| {name} | {r['step']:.2f} | {r['lo']:.2f}-{r['hi']:.2f} | "
                     f"{r['step'] / ref:.2f} | {r['paired']:.2f} | "
                     f"{r['tokens'] / r['step']:.0f} | {r['peak_mb']:.0f} | {split} | "
                     f"{r.get('first_loss', float('nan')):.6f} | {r['loss']:.6f} |")
    notes = [f"* {name}: {r['note']}" for name, r in res.items() if r.get("note")]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "step.md"))
    ap.add_argument("--random-init", action="store_true",
                    help="random-initialised models of the real shapes (needs only the assets' "
                         "config.json and tokenizers): timings without the weights")
    ap.add_argument("--projection", default="",
                    help="a prebuilt SmolLM2 <- Gemma-3 projection (.npz) instead of building it")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    t0 = time.perf_counter()
    names = args.variants.split(",")
    runs: dict[str, list] = {n: [] for n in names}
    total = len(names) * args.repeats
    with tempfile.TemporaryDirectory() as tmp:
        a = assets(Path(tmp), args)
        for i in range(total):
            rnd, k = divmod(i, len(names))
            name = names[(k + rnd) % len(names)]  # each round starts one variant later
            r = run_variant(name, a, args, Path(tmp))
            runs[name].append(r)
            el = time.perf_counter() - t0
            split = ", ".join(f"{k} {r['split'][k]:.2f}" for k in PHASES)
            print(f"[real step] {name}: {r['step']:.2f} s/step ({split}), peak "
                  f"{r['peak_mb']:.0f} MB, loss {r['first_loss']:.6f} -> {r['loss']:.6f} "
                  f"({i + 1}/{total}, {el:.0f} s,"
                  f" ETA {el / (i + 1) * (total - i - 1):.0f} s)", flush=True)
            if i + 1 < total:  # a kill (a time limit) keeps the table of the runs so far
                Path(args.out).write_text(_table(runs, args, t0, f" (partial: {i + 1} of "
                                                 f"{total} runs)"), encoding="utf-8")
    text = _table(runs, args, t0)
    print(text)
    Path(args.out).write_text(text, encoding="utf-8")
    return 0


def _table(runs: dict, args, t0: float, note: str = "") -> str:
    res = median_runs({n: rs for n, rs in runs.items() if rs})
    load = "load average %.2f / %.2f / %.2f" % os.getloadavg() + note
    return report(res, args, time.perf_counter() - t0, load)


if __name__ == "__main__":
    sys.exit(main())
