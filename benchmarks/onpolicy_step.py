"""On-policy trainer step per loss kind, as a ratio to k1 in the same process.

    .venv/bin/python benchmarks/onpolicy_step.py [--batch 8] [--new 48] [--steps 4]
        [--teacher mistral] [--out benchmarks/results/onpolicy_step.md]

One tiny Llama student over the GPT-2 tokenizer and one tiny Llama teacher over another
tokenizer (default: Mistral's SentencePiece vocabulary, a cross-tokenizer pair); for every kind
(k1, k3, reverse_kl through a built projection, strict_topk, dpca, simple_opd, bpm, escd) a fresh
run of the real trainer (``core.build`` + ``OnPolicyMode``) takes ``--steps`` steps through
``core.train_step`` (generation -> scoring -> teacher -> student -> loss -> backward -> AdamW);
the mean step time and its split over steps 2.. (step 1 warms up) are reported with the ratio to
k1's step time. Every kind runs on the same prompts with the same seeds, so the generation part is
the same work; the differences are the loss and what it needs from the teacher.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

KINDS = ("k1", "k3", "reverse_kl", "strict_topk", "dpca", "simple_opd", "bpm", "escd")
PHASES = ("generation", "score", "teacher", "student", "loss", "optim")
TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)


def build_assets(root: Path, args) -> dict:
    from xdistill.projection import BuildConfig, build_projection, save_projection
    from xdistill.tiny import save_tiny_lm
    from xdistill.tokenization import load_tokenizer

    teacher = save_tiny_lm(root / "teacher", args.teacher, seed=1, hidden_size=32,
                           intermediate_size=64)
    proj = build_projection(load_tokenizer("gpt2"), load_tokenizer(args.teacher),
                            BuildConfig(methods=("multitoken", "exact")))
    save_projection(proj, root / "proj.npz")
    prompts = [f"Question {i}: what is the capital of country number {i}?"
               for i in range(args.batch * (args.steps + 1))]
    (root / "p.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return {"teacher": str(teacher), "proj": str(root / "proj.npz"),
            "prompts": str(root / "p.jsonl")}


def config(kind: str, a: dict, args, out: Path):
    from xdistill.config import from_dict
    from xdistill.train.onpolicy_config import OnPolicyConfig

    loss = {"kind": kind}
    if kind == "reverse_kl":
        loss["projection"] = a["proj"]
    return from_dict(OnPolicyConfig, {
        "student": {"model_type": "llama", "model_config": dict(TINY), "init_seed": 0},
        "student_tokenizer": "gpt2",
        "teachers": [{"name": "t", "tokenizer": args.teacher, "worker": {"model": a["teacher"]},
                      "loss": loss}],
        "prompts": {"paths": [a["prompts"]], "batch_size": args.batch, "shuffle": False},
        "rollout": {"max_new_tokens": args.new, "max_prompt_len": 64, "seed": 3},
        "loss": {"chunk_size": 256},
        "optim": {"lr": 1e-3},
        "train": {"steps": args.steps, "out_dir": str(out), "num_threads": args.threads,
                  "tensorboard": False},
        "checkpoint": {"export_hf": False, "resume": ""}})


def measure(kinds: list[str], a: dict, args, root: Path, t0: float) -> dict:
    """Every kind's run built first, then stepped round-robin (step 1 of every kind, step 2, ...):
    a change of the machine's load falls on every kind alike, so the ratios hold on a busy machine."""
    from xdistill.train import core
    from xdistill.train.onpolicy import OnPolicyMode

    runs = {k: core.build(config(k, a, args, root / k), OnPolicyMode()) for k in kinds}
    steps: dict[str, list[dict]] = {k: [] for k in kinds}
    try:
        for run in runs.values():
            run.mode.start(run)
        order = list(runs)
        for s in range(1, args.steps + 1):
            for k in order[s % len(order):] + order[:s % len(order)]:  # rotated every step
                steps[k].append(core.train_step(runs[k], s))
            print(f"[onpolicy_step] step {s}/{args.steps} of every kind "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    finally:
        for run in runs.values():
            run.mode.close()
    return {k: _summary(ms[1:]) for k, ms in steps.items()}


def _summary(ms: list[dict]) -> dict:
    """Medians over the steps (a busy machine's stalls land on single steps)."""
    from statistics import median

    split = {k: median(m.get(f"time/{k}", 0.0) for m in ms) for k in PHASES}
    return {"step": median(m["step_s"] for m in ms), "split": split,
            "tokens": sum(m["response_tokens"] for m in ms) / len(ms),
            "loss": ms[-1]["loss"], "units": ms[-1]["units/t"]}


def report(res: dict, args, load: str, seconds: float) -> str:
    ref = res["k1"]["step"]
    ref_ng = ref - res["k1"]["split"]["generation"]
    lines = ["# On-policy step per loss kind (ratio to k1, same process)", "",
             f"Hardware: {platform.machine()}, {os.cpu_count()} cores, CPU only, torch "
             f"{torch.__version__}, {args.threads} torch threads; {load}. Student: tiny Llama "
             f"(hidden 32, 2 layers) on gpt2 (50,257 ids); teacher: tiny Llama on {args.teacher}; "
             f"batch {args.batch} prompts, up to {args.new} new tokens; steps 2..{args.steps}"
             f" of `core.train_step`; total {seconds:.0f} s.", "",
             "Kinds are stepped round-robin in one process (the order rotated every step); figures are "
             "medians over steps 2.. . Generation time follows the response "
             "lengths, which drift apart as each kind trains its own student; *x k1 w/o gen* "
             "compares the rest of the step (scoring, teacher, student, loss, optimizer).", "",
             "| kind | s/step | x k1 | x k1 w/o gen | response tok/s | units | "
             + " | ".join(PHASES) + " |", "|---|---|---|---|---|---|" + "---|" * len(PHASES)]
    for kind, r in res.items():
        split = " | ".join(f"{r['split'][k]:.3f}" for k in PHASES)
        no_gen = (r["step"] - r["split"]["generation"]) / ref_ng
        lines.append(f"| {kind} | {r['step']:.3f} | {r['step'] / ref:.2f} | {no_gen:.2f} | "
                     f"{r['tokens'] / r['step']:.0f} | {r['units']:.0f} | {split} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--teacher", default="mistral")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"
                                         / "onpolicy_step.md"))
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        a = build_assets(Path(tmp), args)
        res = measure(args.kinds.split(","), a, args, Path(tmp), t0)
    load = "load average %.2f / %.2f / %.2f" % os.getloadavg()
    text = report(res, args, load, time.perf_counter() - t0)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
