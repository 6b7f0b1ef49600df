"""The on-policy step on the real pair with vLLM rollouts vs HF generate, as a ratio (.venv-vllm).

    .venv-vllm/bin/python benchmarks/onpolicy_engines.py [--steps 4] [--rounds 2] [--batch 8]
        [--new 64] [--dtype float32|auto] [--recipe real|tiny] [--out ...]

The whole trainer step, not only generation: SmolLM2-135M samples ``--batch``
prompts of ``configs/prompts_tiny.jsonl`` (up to ``--new`` tokens, T = 1), Gemma-3-270M scores
them (k1, byte-level credit), the student takes its optimizer step and, with vLLM, the engine gets
the new weights (``rollout.backend: vllm``; ``hf`` generates with the trainer's own model).
``--dtype float32`` (default) runs student, teacher and engine in float32; ``--dtype auto`` as a user's
default config does: the student computes and the teacher runs in ``auto``'s choice for this CPU
(bfloat16 where it has bf16 units), the engine in bfloat16 (``rollout.vllm_dtype``'s default).
``--recipe tiny`` runs ``configs/onpolicy_tiny_cpu.yaml`` instead (its own prompts, batch and
lengths; ``--batch``/``--new`` do not apply), with a student wide enough for vLLM's CPU attention
(head size 32) and the two tiny teachers ``python -m xdistill.tiny`` builds, here in a temporary
folder. Each
backend runs in a fresh process (``core.build`` + ``OnPolicyMode`` + ``core.train_step``), the
backends alternating round by round (``--rounds``, each round starting with the other backend),
so a change in the machine's load hits both alike. Reported per backend: the median over rounds
of the mean step time over steps 2..N (step 1 warms up), of its generation part
(``time/generation``; vLLM's weight sync after the optimizer step is in the whole step only) and of the sampled tokens per second;
the ratios HF / vLLM paired by round. The vLLM engine's start (once per run) is reported apart.
A progress line every 10 s.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("hf", "vllm")
# --dtype -> the engine's rollout.vllm_dtype (auto: the engine's own default, bfloat16)
ENGINE_DTYPE = {"float32": "float32", "auto": "bfloat16"}


def say(msg: str) -> None:
    print(f"[onpolicy_engines {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def config(backend: str, args, out: Path) -> dict:
    if args.recipe == "tiny":
        return tiny_config(backend, args, out)
    from xdistill.assets.paths import model_dir

    rollout = {"backend": backend, "max_new_tokens": args.new, "max_prompt_len": 32, "seed": 0}
    dtype = args.dtype
    if backend == "vllm":
        rollout.update(vllm_dtype=ENGINE_DTYPE[dtype],
                       vllm_kv_cache_gb=1, vllm_enforce_eager=not args.compile)
    return {"student": {"path": str(model_dir("smollm2-135m")), "param_dtype": dtype},
            "student_tokenizer": "smollm2-135m",
            "teachers": [{"name": "gemma", "tokenizer": "gemma3-270m", "add_bos": True,
                          "worker": {"model": str(model_dir("gemma3-270m")), "output": "logits",
                                     "dtype": dtype},
                          "loss": {"kind": "k1"}}],
            "prompts": {"paths": [str(ROOT / "configs" / "prompts_tiny.jsonl")],
                        "batch_size": args.batch},
            "rollout": rollout, "loss": {"chunk_size": 64, "credit": "byte"},
            "optim": {"lr": 1e-5}, "scheduler": {"kind": "constant"},
            "train": {"steps": args.steps, "out_dir": str(out), "tensorboard": False,
                      "num_threads": 2},
            "checkpoint": {"export_hf": False, "every": 0, "resume": ""}}


def tiny_config(backend: str, args, out: Path) -> dict:
    """``configs/onpolicy_tiny_cpu.yaml`` with ``backend``, as ``tests/rollout/test_vllm_engine.py``
    runs it with vLLM (the shipped student's head size, 8, is below vLLM's CPU minimum of 32)."""
    from xdistill.config import load_config, to_dict
    from xdistill.tiny import save_tiny_lm
    from xdistill.train.onpolicy_config import OnPolicyConfig

    assets = out.parent.parent / "tiny_teachers"   # shared by every round's runs
    if not assets.exists():
        save_tiny_lm(assets / "qwen2", "qwen2", seed=1)
        save_tiny_lm(assets / "gpt2", "gpt2", seed=2)
    dtype = args.dtype
    overrides = [f"teachers.0.worker.model={assets / 'qwen2'}",
                 f"teachers.1.worker.model={assets / 'gpt2'}",
                 f"teachers.0.worker.dtype={dtype}", f"teachers.1.worker.dtype={dtype}",
                 f"prompts.paths=[{ROOT / 'configs' / 'prompts_tiny.jsonl'}]",
                 "student.model_config.hidden_size=64", "student.model_config.num_attention_heads=2",
                 "student.model_config.num_key_value_heads=1",
                 "student.model_config.intermediate_size=128", f"student.param_dtype={dtype}",
                 f"rollout.backend={backend}", "rollout.vllm_kv_cache_gb=0.25",
                 f"rollout.vllm_enforce_eager={str(not args.compile).lower()}",
                 f"rollout.vllm_dtype={ENGINE_DTYPE[dtype]}",
                 f"train.steps={args.steps}", "train.tensorboard=false", f"train.out_dir={out}",
                 "train.num_threads=2", "checkpoint.every=0", "checkpoint.export_hf=false",
                 "checkpoint.resume="]
    return to_dict(load_config(OnPolicyConfig, ROOT / "configs" / "onpolicy_tiny_cpu.yaml",
                               overrides))


def child(cfg_path: str) -> dict:
    """One backend's run in this (fresh) process: per step its time, generation time and tokens."""
    from xdistill.config import from_dict
    from xdistill.train import core
    from xdistill.train.onpolicy import OnPolicyMode
    from xdistill.train.onpolicy_config import OnPolicyConfig

    cfg = from_dict(OnPolicyConfig, json.loads(Path(cfg_path).read_text()))
    Path(cfg.train.out_dir).mkdir(parents=True, exist_ok=True)  # core.train would make it (samples log)
    t0 = time.perf_counter()
    run = core.build(cfg, OnPolicyMode())
    run.mode.start(run)        # the vLLM engine starts here
    start_s = time.perf_counter() - t0
    syncs = _time_syncs(run.mode.engine)  # the weight sync after each update (not a phase)
    try:
        steps = [core.train_step(run, s) for s in range(1, cfg.train.steps + 1)]
    finally:
        run.mode.close()
    rows = [{"step_s": m["step_s"], "gen_s": m["time/generation"],
             "phases": dict({k[5:]: v for k, v in m.items() if k.startswith("time/")},
                            sync=sync),
             "tokens": m["response_len"] * cfg.prompts.batch_size} for m, sync in zip(steps, syncs)]
    return {"start_s": start_s, "steps": rows}


def _time_syncs(engine) -> list[float]:
    """Wrap ``engine.sync_weights`` so each call's seconds are appended to the returned list."""
    times, sync = [], engine.sync_weights

    def timed(model):
        t = time.perf_counter()
        sync(model)
        times.append(time.perf_counter() - t)
    engine.sync_weights = timed
    return times


def run_backend(backend: str, args, root: Path) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    path, log = root / f"{backend}.json", root / f"{backend}.log"
    path.write_text(json.dumps(config(backend, args, root / backend)))
    t0 = last = time.perf_counter()
    with open(log, "w") as err:   # vLLM logs plenty: a file, not a pipe nobody reads meanwhile
        proc = subprocess.Popen([sys.executable, __file__, "--child", str(path)],
                                stdout=err, stderr=subprocess.STDOUT, text=True)
        while proc.poll() is None:
            time.sleep(1)
            if time.perf_counter() - last >= 10:
                say(f"{backend}: {time.perf_counter() - t0:.0f} s elapsed")
                last = time.perf_counter()
    if proc.returncode != 0:
        raise SystemExit(f"onpolicy_engines: the {backend} run failed:\n"
                         f"{log.read_text()[-4000:]}")
    res = json.loads(path.with_suffix(".result.json").read_text())
    later = res["steps"][1:]
    res["step_s"] = statistics.fmean(r["step_s"] for r in later)
    res["gen_s"] = statistics.fmean(r["gen_s"] for r in later)
    res["tok_s"] = sum(r["tokens"] for r in later) / sum(r["gen_s"] for r in later)
    res["phases"] = {k: statistics.fmean(r["phases"].get(k, 0.0) for r in later)
                     for k in later[0]["phases"]}
    say(f"{backend}: {res['step_s']:.2f} s/step, generation {res['gen_s']:.2f} s, "
        f"{res['tok_s']:.1f} sampled tok/s (start {res['start_s']:.0f} s)")
    return res


def report(args, rounds: list[dict], seconds: float) -> str:
    from real.step import cpu_line  # benchmarks/ (this script's folder) is on the path

    med = {b: {k: statistics.median(r[b][k] for r in rounds) for k in
               ("step_s", "gen_s", "tok_s", "start_s")} for b in BACKENDS}
    step_x = [r["hf"]["step_s"] / r["vllm"]["step_s"] for r in rounds]
    gen_x = [r["hf"]["gen_s"] / r["vllm"]["gen_s"] for r in rounds]
    what = (f"SmolLM2-135M student ({args.dtype}, 2 threads), Gemma-3-270M teacher ({args.dtype}, "
            f"k1, byte credit), vLLM engine in {ENGINE_DTYPE[args.dtype]}, "
            f"{args.batch} prompts x <= {args.new} tokens" if args.recipe == "real" else
            f"`configs/onpolicy_tiny_cpu.yaml` (student hidden size 64, {args.dtype}, 2 threads; "
            f"two tiny teachers; 4 prompts x <= 24 tokens), vLLM engine in "
            f"{ENGINE_DTYPE[args.dtype]}")
    title = "real pair" if args.recipe == "real" else "tiny recipe"
    lines = [f"# On-policy step, {title}: vLLM rollouts vs HF generate", "",
             f"{cpu_line()}; load average {' / '.join(f'{x:.2f}' for x in os.getloadavg())}; "
             f"{time.strftime('%Y-%m-%d')}; {len(rounds)} round(s), {seconds / 60:.0f} min", "",
             f"{what}, T = 1; mean over steps "
             f"2..{args.steps} of each run, median over rounds.", "",
             "| backend | s/step | generation s/step | sampled tok/s | engine start s |",
             "|---|---|---|---|---|"]
    lines += [f"| {b} | {med[b]['step_s']:.2f} | {med[b]['gen_s']:.2f} | {med[b]['tok_s']:.1f} | "
              f"{med[b]['start_s']:.0f} |" for b in BACKENDS]
    lines += ["", f"- whole step, HF / vLLM per round: {', '.join(f'{x:.2f}' for x in step_x)} "
              f"(median **{statistics.median(step_x):.2f}x**)",
              f"- generation (vLLM's weight sync is in the whole step only), HF / vLLM per round: "
              f"{', '.join(f'{x:.2f}' for x in gen_x)} (median **{statistics.median(gen_x):.2f}x**)"]
    return "\n".join(lines + phase_table(rounds)) + "\n"


def phase_table(rounds: list[dict]) -> list[str]:
    """Where each backend's step goes: the trainer's phase timers plus the weight sync (s per
    step, median over rounds); ``other`` is the step time none of them covers."""
    names = sorted({k for r in rounds for b in BACKENDS for k in r[b]["phases"]})
    med = {b: {k: statistics.median(r[b]["phases"].get(k, 0.0) for r in rounds) for k in names}
           for b in BACKENDS}
    steps = {b: statistics.median(r[b]["step_s"] for r in rounds) for b in BACKENDS}
    rows = ["", "| backend | " + " | ".join(names) + " | other |",
            "|---|" + "---|" * (len(names) + 1)]
    for b in BACKENDS:
        other = steps[b] - sum(med[b].values())
        rows.append(f"| {b} | " + " | ".join(f"{med[b][k]:.2f}" for k in names)
                    + f" | {other:.2f} |")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--dtype", choices=("float32", "auto"), default="float32",
                   help="float32 everywhere, or a user's default (auto; engine in bfloat16)")
    p.add_argument("--compile", action="store_true",
                   help="let vLLM compile its model (rollout.vllm_enforce_eager: false)")
    p.add_argument("--recipe", choices=("real", "tiny"), default="real",
                   help="the real pair (default) or configs/onpolicy_tiny_cpu.yaml")
    p.add_argument("--out", default="")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.child:
        Path(args.child).with_suffix(".result.json").write_text(json.dumps(child(args.child)))
        return 0
    if importlib.util.find_spec("vllm") is None:  # `make bench` runs every script in .venv
        print("onpolicy_engines: skipped: vllm is not installed here (make vllm-env, then run "
              "this script with .venv-vllm/bin/python)")
        return 0
    t0, rounds = time.perf_counter(), []
    with tempfile.TemporaryDirectory(prefix="xdistill-onpolicy-engines-") as tmp:
        for r in range(args.rounds):
            order = BACKENDS if r % 2 == 0 else BACKENDS[::-1]
            rounds.append({b: run_backend(b, args, Path(tmp) / f"r{r}") for b in order})
    text = report(args, rounds, time.perf_counter() - t0)
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
