"""Off-policy step at real model shapes on one GPU: teacher / align / transport / loss / student.

    python benchmarks/gpu_step.py [--variants logits,projected,topk,ipc] [--steps 4]
        [--batch 8] [--micro-batch 4] [--seq-len 2048] [--projection P.npz] [--budget-s 300]
        [--tiny] [--out-md FILE] [--out-json FILE]

Models are **random-initialised from configs of real architectures and sizes** (no weights travel;
throughput does not depend on the weights' values): a Llama-3.2-1B-shaped student (16 layers,
hidden 2048, vocab 128,256, Llama-3 tokenizer) and a Qwen2.5-1.5B-shaped teacher (28 layers,
hidden 1536, vocab 151,936, Qwen2 tokenizer); the ``topk`` variant uses a second Llama-3.2-1B-shaped
teacher with the student's own tokenizer (top-k outputs feed the same-tokenizer ``topk_kl`` only).
Tokenizers and text are real (the fetched assets; Shakespeare packed into ``--seq-len`` windows).
The student runs under FSDP2 with one rank (``torchrun --nproc_per_node 1``, NCCL on a GPU):
float32 master weights, bfloat16 compute, float32 gradient reduction; teachers in bfloat16.

Variants (each a fresh ``torchrun`` process running the real trainer: ``core.build`` +
``core.train_step``; step 1 is a warm-up, the others are averaged):

* ``logits``     Qwen2.5-1.5B shape, in-process teacher, full logits, cross-tokenizer P-KL
                 through a ``multitoken,exact`` top-4 projection Llama-3 -> Qwen2;
* ``projected``  the same teacher returning log-probs already projected into the student vocabulary;
* ``topk``       a Llama-3.2-1B-shaped same-tokenizer teacher, top-64 log-probs, ``topk_kl``;
* ``ipc``        ``logits`` with the teacher in a subprocess on the same GPU: outputs cross over
                 CUDA IPC (the ``transport`` column).

Columns: student tokens/s over the whole step; the trainer's own per-phase timers (``data`` = waiting
for the DataLoader, whose workers tokenise and align; ``teacher``; ``transport``; ``student`` forward
+ backward; ``loss``; ``optim``); ``align`` = the collator's own seconds per step (tokenisation +
Numba alignment, in the loader workers, overlapped with the GPU); peak GPU memory.
``--tiny`` runs everything on CPU with 2-layer models of the same vocabularies (used by
``tools/gpu_check.py --dry-run`` so that this script cannot rot). ``--budget-s``: a variant is not
started when the time left is less than the slowest variant so far took.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("logits", "topk", "projected", "ipc")  # in order of value: a short budget runs the first
PHASES = ("data", "teacher", "transport", "student", "loss", "optim")

LLAMA_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                tie_word_embeddings=True, max_position_embeddings=8192)
QWEN_1_5B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                 tie_word_embeddings=True, max_position_embeddings=8192)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)


def shapes(tiny: bool) -> dict:
    """{"student": llama kwargs, "cross": qwen2 kwargs, "same": llama kwargs}."""
    if not tiny:
        return {"student": LLAMA_1B, "cross": QWEN_1_5B, "same": LLAMA_1B}
    return {"student": dict(LLAMA_1B, **TINY), "cross": dict(QWEN_1_5B, **TINY),
            "same": dict(LLAMA_1B, **TINY)}


def save_random_lm(out: Path, model_type: str, kwargs: dict, device: str, seed: int) -> Path:
    """A random-init causal LM of ``model_type`` saved in bfloat16 (initialised on ``device``:
    seconds on a GPU for 1.5B parameters instead of a minute on CPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    from xdistill.student.model import make_config

    config = make_config(model_type, kwargs)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(str(out))
    del model
    return out


def build_assets(root: Path, args) -> dict:
    """Corpus, projection (built unless ``--projection`` names one) and the teachers' folders."""
    from xdistill.tiny import make_corpus

    device = "cpu" if args.tiny else "cuda"
    n_docs = max(40, 3 * args.steps * args.batch * args.seq_len // 500)
    train, _ = make_corpus(root / "corpus", n_train=n_docs, n_eval=1, max_chars=2000)
    proj = args.projection or str(build_projection(root / "proj_llama3_qwen2.npz"))
    sh = shapes(args.tiny)
    t0 = time.perf_counter()
    cross = save_random_lm(root / "teacher_qwen2", "qwen2", sh["cross"], device, seed=1)
    same = save_random_lm(root / "teacher_llama", "llama", sh["same"], device, seed=2) \
        if "topk" in args.variants.split(",") else None
    print(f"[gpu_step] teachers initialised and saved in {time.perf_counter() - t0:.1f} s",
          flush=True)
    return {"train": str(train), "proj": proj, "cross": str(cross),
            "same": str(same) if same else "", "shapes": sh}


def build_projection(path: Path) -> Path:
    """The Llama-3 -> Qwen2 ``multitoken,exact`` top-4 projection (what the CLI builds)."""
    from xdistill.projection import BuildConfig, build_projection as build, save_projection
    from xdistill.tokenization import load_tokenizer

    t0 = time.perf_counter()
    proj = build(load_tokenizer("llama3"), load_tokenizer("qwen2"),
                 BuildConfig(methods=("multitoken", "exact"), top_k=4))
    save_projection(proj, path)
    print(f"[gpu_step] projection llama3 -> qwen2 built in {time.perf_counter() - t0:.1f} s",
          flush=True)
    return path


def warm_aligner() -> float:
    """Compile the Numba aligner once here: the loader workers then load it from Numba's on-disk
    cache instead of each compiling it during the first step (~45 s on a bare GPU machine)."""
    from xdistill.align import align_pair
    from xdistill.tokenization import load_tokenizer

    t0 = time.perf_counter()
    s, t = load_tokenizer("llama3"), load_tokenizer("qwen2")
    text = "Warming the aligner: 1,274 ships, two tokenizers."
    align_pair(s.encode(text).ids, t.encode(text).ids, s.table, t.table)
    return time.perf_counter() - t0


def config(variant: str, a: dict, args, out: Path) -> dict:
    """The trainer config of one variant."""
    tiny = args.tiny
    device = "cpu" if tiny else "cuda"
    # bf16 full logits as the GPU recipes set them (and as the 2026-11-26 H200 run measured)
    worker = {"model": a["cross"], "dtype": "bfloat16", "logits_dtype": "bfloat16",
              "device": device, "micro_batch_size": args.micro_batch, "output": "logits"}
    teacher = {"name": "qwen", "tokenizer": "qwen2", "worker": worker,
               "loss": {"kind": "pkl", "projection": a["proj"]}}
    if variant == "projected":
        worker["output"] = "projected"
    elif variant == "ipc":
        worker.update(placement="subprocess", slots=2)
    elif variant == "topk":
        worker.update(model=a["same"], output="topk", top_k=64)
        teacher.update(name="llama", tokenizer="llama3", loss={"kind": "topk_kl"})
    return {"student": {"model_type": "llama", "model_config": dict(a["shapes"]["student"]),
                        "dtype": "float32", "param_dtype": "bfloat16", "reduce_dtype": "float32",
                        "attn_implementation": "sdpa"},
            "student_tokenizer": "llama3", "teachers": [teacher],
            "data": {"paths": [a["train"]], "seq_len": args.seq_len,
                     "batch_size": args.micro_batch, "num_workers": args.workers,
                     "prefetch_factor": 2, "multiprocessing_context": args.mp_context},
            "loss": {"ce_weight": 0.1, "chunk_size": 256 if tiny else 1024},
            "optim": {"lr": 1e-5, "implementation": "foreach" if tiny else "fused"},
            "scheduler": {"kind": "constant"},
            "train": {"steps": args.steps, "global_batch_size": args.batch, "out_dir": str(out),
                      "tensorboard": False, "log_every": 1, "device": device},
            "checkpoint": {"export_hf": False, "resume": ""}, "eval": {"every": -1}}


def child(variant: str, cfg_path: str, result_path: str) -> None:
    """One variant in this fresh (torchrun) process; writes its figures to ``result_path``."""
    import torch

    from xdistill.config import from_dict
    from xdistill.metrics import peak_rss_mb
    from xdistill.train import core
    from xdistill.train.config import OffPolicyConfig
    from xdistill.train.offpolicy import OffPolicyMode

    from xdistill.log import init_logging

    init_logging()
    cfg = from_dict(OffPolicyConfig, json.loads(Path(cfg_path).read_text()))
    t0 = time.perf_counter()
    run = core.build(cfg, OffPolicyMode())
    print(f"[gpu_step] {variant}: student and teacher built in {time.perf_counter() - t0:.1f} s",
          flush=True)
    run.mode.start(run)
    build_s = time.perf_counter() - t0
    collate: dict[int, float] = {}
    take = run.mode.micro_batches

    def micro_batches(run_, step, timers):
        micros = take(run_, step, timers)
        collate[step] = sum(m.batch.stats.collate_seconds for m in micros)  # PendingMicro
        return micros

    run.mode.micro_batches = micro_batches
    metrics = []
    hang_s = float(os.environ.get("XDISTILL_HANG_DUMP_S", "0"))
    try:
        for s in range(1, cfg.train.steps + 1):
            if hang_s > 0:  # where a slow or stuck step spends its time, every hang_s seconds
                faulthandler.dump_traceback_later(hang_s, repeat=True)
            metrics.append(core.train_step(run, s))
            faulthandler.cancel_dump_traceback_later()
            m = metrics[-1]
            print(f"[gpu_step] {variant} step {s}/{cfg.train.steps}: {m['step_s']:.2f} s, "
                  f"loss {m['loss']:.4f}", flush=True)
    finally:
        run.mode.close()
    timed = metrics[1:] or metrics
    mean = lambda k: sum(m.get(k, 0.0) for m in timed) / len(timed)  # noqa: E731
    gpu = torch.cuda.is_available() and run.device.type == "cuda"
    result = {"variant": variant, "step_s": mean("step_s"), "tokens": mean("tokens"),
              "split": {k: mean(f"time/{k}") for k in PHASES},
              "align_s": sum(collate.get(s, 0.0) for s in range(2, cfg.train.steps + 1))
              / max(1, len(timed)),
              "losses": [m["loss"] for m in metrics], "build_s": build_s,
              "peak_gpu_gb": torch.cuda.max_memory_allocated() / 2**30 if gpu else 0.0,
              "peak_rss_mb": peak_rss_mb(), "device": str(run.device)}
    Path(result_path).write_text(json.dumps(result))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_variant(variant: str, a: dict, args, root: Path) -> dict:
    """``torchrun --nproc_per_node 1`` on this script's child mode; output streamed through."""
    cfg_path, res_path = root / f"{variant}.json", root / f"{variant}.result.json"
    cfg_path.write_text(json.dumps(config(variant, a, args, root / variant)))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
           "--master_port", str(_free_port()), str(Path(__file__).resolve()),
           "--child", variant, str(cfg_path), str(res_path)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1",
               XDISTILL_HANG_DUMP_S=str(args.hang_dump_s))
    if args.tiny:
        env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(cmd, env=env, cwd=str(REPO), stdout=sys.stdout, stderr=subprocess.STDOUT)
    if proc.returncode != 0 or not res_path.is_file():
        return {"variant": variant, "error": f"exit code {proc.returncode} (its output is above)"}
    return json.loads(res_path.read_text())


def report(results: list[dict], args, env_line: str) -> str:
    sh = "tiny 2-layer shapes (dry run)" if args.tiny else \
        "Llama-3.2-1B-shaped student, Qwen2.5-1.5B-shaped teacher (topk: Llama-3.2-1B-shaped)"
    lines = ["# Off-policy step at real model shapes", "",
             f"{env_line}. {sh}, random-initialised; batch {args.batch} x {args.seq_len} student "
             f"tokens per step (micro-batches of {args.micro_batch}); student fp32 master + bf16 "
             f"compute (FSDP2, 1 rank), teachers bf16; mean over steps 2..{args.steps}.", "",
             "| variant | s/step | student tok/s | align (collator) | " + " | ".join(PHASES)
             + " | peak GPU GB | first/last loss |", "|---|---|---|---|" + "---|" * len(PHASES)
             + "---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['variant']} | failed: {r['error']} |")
            continue
        split = " | ".join(f"{r['split'][k]:.3f}" for k in PHASES)
        lines.append(f"| {r['variant']} | {r['step_s']:.3f} | {r['tokens'] / r['step_s']:,.0f} | "
                     f"{r['align_s']:.3f} | {split} | {r['peak_gpu_gb']:.1f} | "
                     f"{r['losses'][0]:.3f} / {r['losses'][-1]:.3f} |")
    return "\n".join(lines) + "\n"


def env_line() -> str:
    import torch

    if torch.cuda.is_available():
        return (f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA "
                f"{torch.version.cuda}")
    return f"CPU only ({platform.machine()}, {os.cpu_count()} cores), torch {torch.__version__}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--projection", default="", help="a prebuilt llama3 -> qwen2 projection")
    ap.add_argument("--workers", type=int, default=4, help="DataLoader workers (collator)")
    ap.add_argument("--mp-context", default="spawn", choices=("fork", "spawn", "forkserver"),
                    help="DataLoader workers' start method (spawn: the GPU recipes' choice)")
    ap.add_argument("--hang-dump-s", type=float, default=60.0,
                    help="dump every thread's stack when a step takes longer than this")
    ap.add_argument("--budget-s", type=float, default=0.0, help="0 = no limit")
    ap.add_argument("--tiny", action="store_true", help="CPU dry run with 2-layer models")
    ap.add_argument("--out-md", default="")
    ap.add_argument("--out-json", default="")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    bad = set(args.variants.split(",")) - set(VARIANTS)
    if bad:
        ap.error(f"unknown variant(s) {sorted(bad)}; known: {', '.join(VARIANTS)}")
    import torch

    if not args.tiny and not torch.cuda.is_available():   # `make bench` runs every script
        print("gpu_step: skipped: no CUDA GPU here (1B-parameter models at 8 x 2048 tokens); "
              "--tiny is the CPU dry run", flush=True)
        return 0
    t0 = time.perf_counter()
    results: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        a = build_assets(Path(tmp), args)
        print(f"[gpu_step] aligner compiled (or loaded from cache) in {warm_aligner():.1f} s",
              flush=True)
        names = args.variants.split(",")
        slowest = 0.0
        for i, name in enumerate(names):
            left = args.budget_s - (time.perf_counter() - t0) if args.budget_s else float("inf")
            if left < slowest:
                results.append({"variant": name, "error": f"skipped: {left:.0f} s left of the "
                                f"budget, the slowest variant took {slowest:.0f} s"})
                continue
            v0 = time.perf_counter()
            results.append(run_variant(name, a, args, Path(tmp)))
            slowest = max(slowest, time.perf_counter() - v0)
            el = time.perf_counter() - t0
            print(f"[gpu_step] {name} done in {time.perf_counter() - v0:.0f} s ({i + 1}/"
                  f"{len(names)}, {el:.0f} s elapsed, ETA {el / (i + 1) * (len(names) - i - 1):.0f}"
                  " s)", flush=True)
            if args.out_json:  # partial results survive a kill
                Path(args.out_json).write_text(json.dumps(results, indent=1))
    text = report(results, args, env_line())
    print(text, flush=True)
    if args.out_md:
        Path(args.out_md).write_text(text, encoding="utf-8")
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(results, indent=1))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
