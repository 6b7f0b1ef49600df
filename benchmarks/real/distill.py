"""Distil Gemma-3-270M into SmolLM2-135M on Shakespeare, against CE-only on the same slice.

    .venv/bin/python benchmarks/real/distill.py                         # 4 arms x 3 seeds
    .venv/bin/python benchmarks/real/distill.py --seeds 0 --steps 3 --teacher-steps 2 \\
        --out /tmp/rd --report-dir /tmp/rd                               # smoke run

The realistic recipe (the stock pair is too close on this text to have much to distil):

1. **Data** (the asset script's corpus, six plays from a package archive): *The Tempest* is the
   held-out play; the other five are the domain corpus; the student's slice is every n-th passage
   of the domain corpus, ``--slice-kb`` in all.
2. **Teacher**: Gemma-3-270M (with its ``<bos>``) adapted to the domain with CE on the whole domain
   corpus through ``xdistill train offpolicy`` (Gemma as the student of a CE-only run), exported.
3. **Starting figures**: held-out bits per byte of stock Gemma, the adapted teacher and stock
   SmolLM2; the stock student's agreement with the teacher.
4. **Arms**, each from stock SmolLM2, on the slice, the same steps, learning rate and data order
   per seed (``train.seed``): ``ce`` (CE only), ``pkl`` (P-KL through a multitoken projection, +
   CE, weight 1 each), ``alm`` (ALM, no CE: tokenkit trains it as pure distillation), ``multi``
   (P-KL to the adapted Gemma + forward KL to stock SmolLM2 as a same-tokenizer teacher, + CE).
   Every run is the real trainer (``core.build`` + ``core.train_step``) in its own process; at
   step 0, every ``--eval-every`` steps and at the end it records held-out bits per byte and
   teacher agreement.

Teacher agreement: on the held-out passages, at every byte offset where both tokenizations start
a token, the student's and the teacher's greedy next tokens agree when one's bytes are a prefix
of the other's (the same next bytes). The teacher's predictions are computed once.

Writes ``<out>/results.json`` and, in ``--report-dir``, ``curves.png`` and the generated block of
``RESULTS.md`` (the discussion around it is kept). Finished runs are cached by configuration.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ARMS = ("ce", "pkl", "alm", "multi")
# the evidence protocol's extra arms (PROTOCOL.md): CE + label smoothing, P-KL to the *stock*
# Gemma, CE + forward KL to the stock student only (a soft target with nothing new to teach)
CONTROL_ARMS = ("ce_ls", "pkl_stock", "self_kl")
HELD_OUT = "tempest"
HERE = Path(__file__).resolve().parent


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/real_distill")
    ap.add_argument("--report-dir", default=str(HERE))
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=40, help="student optimizer steps per arm")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--slice-kb", type=int, default=40, help="the student's slice of the domain")
    ap.add_argument("--teacher-steps", type=int, default=80)
    ap.add_argument("--teacher-lr", type=float, default=3e-5)
    ap.add_argument("--teacher-seq-len", type=int, default=128)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-batches", type=int, default=8, help="held-out batches of 4 x 128")
    ap.add_argument("--agree-passages", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    return ap.parse_args(argv)


def say(msg: str) -> None:
    print(msg, flush=True)


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]


# ---------------------------------------------------------------- data
def prepare_data(root: Path, slice_kb: int) -> dict:
    from xdistill.assets import PLAYS
    from xdistill.data.prepare import prepare
    from xdistill.tiny import passages

    domain = [p for play in PLAYS if play != HELD_OUT for p in passages(plays=[play])]
    total = sum(len(p.encode()) for p in domain)
    every = max(1, round(total / (slice_kb * 1024)))
    parts = {"domain": domain, "slice": domain[::every], "heldout": passages(plays=[HELD_OUT])}
    out = {}
    for name, docs in parts.items():
        folder = root / "data" / name
        if not (folder / "index.json").exists():
            raw = root / "data" / f"{name}.jsonl"
            raw.parent.mkdir(parents=True, exist_ok=True)
            raw.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
            prepare([raw], folder, progress=False)
        out[name] = str(folder)
        out[f"{name}_kb"] = sum(len(d.encode()) for d in docs) / 1024
    out["agree_texts"] = parts["heldout"]
    return out


# ---------------------------------------------------------------- teacher adaptation
def teacher_config(args, data: dict, out: Path) -> dict:
    from xdistill.assets import model_dir

    return {"student": {"path": str(model_dir("gemma3-270m"))}, "student_tokenizer": "gemma3-270m",
            "data": {"paths": [data["domain"]], "seq_len": args.teacher_seq_len,
                     "batch_size": args.batch, "num_workers": 1, "add_bos": True},
            "loss": {"ce_weight": 1.0},
            "optim": {"lr": args.teacher_lr, "weight_decay": 0.0},
            "scheduler": {"kind": "cosine", "warmup_steps": max(1, args.teacher_steps // 10)},
            "train": {"steps": args.teacher_steps, "out_dir": str(out), "log_every": 1,
                      "num_threads": args.threads, "tensorboard": False},
            "checkpoint": {"every": 0, "keep_last": 1, "resume": "", "export_hf": True}}


def adapt_teacher(args, data: dict, root: Path) -> str:
    """CE on the whole domain corpus (``xdistill train offpolicy``); returns the export folder."""
    import shutil

    import yaml

    out = root / "teacher"
    cfg = teacher_config(args, data, out)
    done = out / "done.json"
    if done.exists() and json.loads(done.read_text())["digest"] == _digest(cfg):
        say(f"[teacher] adapted teacher cached: {out / 'export'}")
        return str(out / "export")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / "config.yaml").write_text(yaml.safe_dump(cfg))
    say(f"[teacher] adapting Gemma-3-270M: CE on {data['domain_kb']:.0f} KB of the domain, "
        f"{args.teacher_steps} steps of {args.batch}x{args.teacher_seq_len} tokens "
        f"(log: {out / 'train.log'})")
    cmd = [sys.executable, "-m", "xdistill", "train", "offpolicy", "--config", str(out / "config.yaml")]
    t0 = time.perf_counter()
    stream(cmd, out / "train.log", "teacher", args.teacher_steps)
    shutil.rmtree(out / "checkpoints", ignore_errors=True)  # 3 GB of optimizer state, not needed
    done.write_text(json.dumps({"digest": _digest(cfg), "seconds": time.perf_counter() - t0}))
    return str(out / "export")


def stream(cmd: list[str], log_path: Path, label: str, steps: int) -> None:
    """Run ``cmd``, append its output to ``log_path`` (a resumed run keeps the earlier lines),
    print a progress line at most every 10 s; the rate counts the steps this run made (a resumed
    run starts at its checkpoint's step)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    t0 = last = time.perf_counter()
    with open(log_path, "a") as log, subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
        step, first = 0, None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            step = _step_of(line, step)
            if first is None and step:
                first = step - 1   # the step this run started after
            now = time.perf_counter()
            if now - last >= 10:
                rate = (step - (first or 0)) / (now - t0)
                eta = (steps - step) / rate if rate > 0 else float("nan")
                say(f"[{label}] step {step}/{steps} | {rate * 60:.1f} steps/min | ETA {eta:.0f} s "
                    f"| {now - t0:.0f} s elapsed")
                last = now
    if proc.returncode != 0:
        raise SystemExit(f"[{label}] failed (exit {proc.returncode}); read {log_path}")


def _step_of(line: str, default: int) -> int:
    """The step number of a progress line (``step 12 | ...``, ``[xdistill] step 12 | ...``)."""
    words = line.replace("|", " ").split()
    for i, word in enumerate(words[:-1]):
        head = words[i + 1].split("/")[0]
        if word == "step" and head.isdigit():
            return int(head)
    return default


# ---------------------------------------------------------------- arms
def arm_config(arm: str, seed: int, args, a: dict, out: Path) -> dict:
    """The trainer config of ``arm`` (module doc; ``CONTROL_ARMS``: PROTOCOL.md). ``a`` may carry
    ``stock_teacher`` (the unadapted Gemma), ``label_smoothing`` and ``lr`` (per-arm rate)."""
    gemma = {"name": "gemma", "tokenizer": "gemma3-270m", "add_bos": True,
             "worker": {"model": a["teacher"], "micro_batch_size": args.batch, "output": "logits"},
             "loss": {"kind": "pkl", "projection": a["proj"]}}
    smol = {"name": "smollm2", "tokenizer": "smollm2-135m",
            "worker": {"model": a["student"], "micro_batch_size": args.batch},
            "loss": {"kind": "forward_kl"}}
    ce, teachers, smoothing = 1.0, [], 0.0
    if arm == "pkl":
        teachers = [gemma]
    elif arm == "pkl_stock":
        teachers = [dict(gemma, worker=dict(gemma["worker"], model=a["stock_teacher"]))]
    elif arm == "alm":
        ce, teachers = 0.0, [dict(gemma, loss={"kind": "alm"})]
    elif arm == "multi":
        teachers = [gemma, smol]
    elif arm == "self_kl":
        teachers = [smol]
    elif arm == "ce_ls":
        smoothing = a["label_smoothing"]
    elif arm != "ce":
        raise SystemExit(f"unknown arm {arm!r}; choose from {', '.join(ARMS + CONTROL_ARMS)}")
    return {"student": {"path": a["student"]}, "student_tokenizer": "smollm2-135m",
            "teachers": teachers,
            "data": {"paths": [a["slice"]], "seq_len": args.seq_len, "batch_size": args.batch,
                     "num_workers": 1, "seed": seed},  # the window order differs per seed
            "loss": {"ce_weight": ce, "chunk_size": 64,
                     **({"label_smoothing": smoothing} if smoothing else {})},
            "optim": {"lr": a.get("lr", args.lr), "weight_decay": 0.0},
            "scheduler": {"kind": "cosine", "warmup_steps": max(1, args.steps // 10)},
            "train": {"steps": args.steps, "seed": seed, "out_dir": str(out),
                      "num_threads": args.threads, "tensorboard": False},
            "checkpoint": {"export_hf": False, "resume": ""}}


def run_arm(arm: str, seed: int, args, a: dict, root: Path) -> dict:
    from onpolicy_arms import ONPOLICY_ARMS, onpolicy_config

    out = root / "runs" / arm / f"seed{seed}"
    onpolicy = arm in ONPOLICY_ARMS
    cfg = (onpolicy_config if onpolicy else arm_config)(arm, seed, args, a, out)
    every = args.eval_every * (cfg["train"]["steps"] // args.steps) if onpolicy else args.eval_every
    job = {"cfg": cfg, "eval": a["eval"], "eval_every": every,
           "teacher_preds": a["teacher_preds"],
           **({"final_evals": a["final_evals"]} if a.get("final_evals") else {}),
           **({"samples": a["samples"]} if a.get("samples") else {}),
           **({"score_masters": True} if a.get("score_masters") else {})}
    result = out / "result.json"
    if result.exists() and json.loads(result.read_text()).get("digest") == _digest(job):
        say(f"[{arm} seed {seed}] cached")
        return json.loads(result.read_text())
    out.mkdir(parents=True, exist_ok=True)
    (out / "job.json").write_text(json.dumps(job))
    steps = cfg["train"]["steps"]
    say(f"[{arm} seed {seed}] training {steps} steps (log: {out / 'run.log'})")
    stream([sys.executable, str(HERE / "distill_eval.py"), "arm", str(out / "job.json")],
           out / "run.log", f"{arm} seed {seed}", steps)
    res = json.loads(result.read_text())
    last = res["curve"][-1]
    agree = "" if last["agree"] is None else f", agreement {last['agree']:.4f}"
    say(f"[{arm} seed {seed}] held-out bpb {last['bpb']:.4f}{agree} ({res['seconds']:.0f} s)")
    return res


def build_projection_file(root: Path) -> str:
    from xdistill.projection import BuildConfig, build_projection, save_projection
    from xdistill.tokenization import load_tokenizer

    path = root / "proj_smollm2_gemma.npz"
    if not path.exists():
        say("[projection] smollm2-135m x gemma3-270m, multitoken + exact, top-4")
        proj = build_projection(load_tokenizer("smollm2-135m"), load_tokenizer("gemma3-270m"),
                                BuildConfig(methods=("multitoken", "exact"), top_k=4))
        save_projection(proj, path)
    return str(path)


def starting_figures(args, a: dict, root: Path) -> dict:
    """Held-out bpb of stock Gemma, the adapted teacher and stock SmolLM2; the teacher's greedy
    predictions for the agreement metric (a child process; cached)."""
    job = {"teacher": a["teacher"], "eval": a["eval"], "threads": args.threads,
           "preds": str(root / "teacher_preds.json")}
    path = root / "start.json"
    if path.exists() and json.loads(path.read_text()).get("digest") == _digest(job):
        return json.loads(path.read_text())
    (root / "start_job.json").write_text(json.dumps(job))
    say(f"[start] held-out bits per byte of the three models (log: {root / 'start.log'})")
    stream([sys.executable, str(HERE / "distill_eval.py"), "start", str(root / "start_job.json")],
           root / "start.log", "start", 3)
    res = json.loads(path.read_text())
    say("[start] " + ", ".join(f"{k} {v:.4f}" for k, v in res["figures"].items()))
    return res


def main(argv=None) -> int:
    args = parse(argv)
    from xdistill.assets import model_dir
    from distill_report import write_report

    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    data = prepare_data(root, args.slice_kb)
    say(f"[data] domain {data['domain_kb']:.0f} KB (five plays), student slice "
        f"{data['slice_kb']:.0f} KB, held-out {data['heldout_kb']:.0f} KB ({HELD_OUT})")
    a = {"teacher": adapt_teacher(args, data, root), "student": str(model_dir("smollm2-135m")),
         "slice": data["slice"], "proj": build_projection_file(root),
         "eval": {"paths": [data["heldout"]], "batches": args.eval_batches,
                  "texts": data["agree_texts"][:args.agree_passages]}}
    start = starting_figures(args, a, root)
    a["teacher_preds"] = start["preds"]
    results = {arm: {} for arm in args.arms.split(",")}
    for seed in [int(s) for s in args.seeds.split(",")]:
        for arm in results:
            results[arm][seed] = run_arm(arm, seed, args, a, root)
    meta = {"command": "python benchmarks/real/distill.py " + " ".join(argv or sys.argv[1:]),
            "hardware": f"{platform.machine()}, {os.cpu_count()} cores, no GPU",
            "wall_s": time.perf_counter() - t0, "data": {k: v for k, v in data.items()
                                                          if k.endswith("_kb")},
            "args": vars(args), "start": start}
    (root / "results.json").write_text(json.dumps({"meta": meta, "runs": results}, indent=1))
    write_report(results, meta, Path(args.report_dir))
    say(f"done in {meta['wall_s'] / 60:.1f} min: {root / 'results.json'}, "
        f"{Path(args.report_dir) / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
