"""Where a real-pair step's time goes: torch.profiler over steps of one ``step.py`` variant.

    .venv/bin/python benchmarks/real/profile_step.py [--variants float32,auto] [--random-init]
        [--projection NPZ] [--steps 2] [--top 30] [--out FILE]

Each variant runs in a fresh process (the same config as ``benchmarks/real/step.py``), takes two
warm-up steps, then profiles ``--steps`` steps and writes, per variant, the trainer's phase split
and the ops with the most self CPU time per step, grouped by op and input shapes (a 49152 x 576
``add`` is the tied embedding's gradient, a 128 x 262144 ``mm`` the teacher's head block). It
answers "which ops keep the bf16 step from being N times faster", which the phase split alone
does not.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _step_module():
    spec = importlib.util.spec_from_file_location("real_step", HERE / "step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def child(variant: str, cfg_path: str, steps: int, top: int) -> dict:
    """Profile ``steps`` steps after two warm-up steps, in this (fresh) process."""
    from torch.profiler import ProfilerActivity, profile

    from xdistill.config import from_dict
    from xdistill.train import core
    from xdistill.train.config import OffPolicyConfig
    from xdistill.train.offpolicy import OffPolicyMode

    cfg = from_dict(OffPolicyConfig, json.loads(Path(cfg_path).read_text()))
    run = core.build(cfg, OffPolicyMode())
    run.mode.start(run)
    try:
        for s in (1, 2):
            core.train_step(run, s)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            ms = [core.train_step(run, s) for s in range(3, 3 + steps)]
    finally:
        run.mode.close()
    events = sorted(prof.key_averages(group_by_input_shape=True),
                    key=lambda e: -e.self_cpu_time_total)
    rows = [{"op": e.key, "ms": e.self_cpu_time_total / 1e3 / steps, "calls": e.count // steps,
             "shapes": str(e.input_shapes)[:120]} for e in events[:top]]
    total = sum(e.self_cpu_time_total for e in events) / 1e3 / steps
    split = {k: sum(m.get(f"time/{k}", 0.0) for m in ms) / steps
             for k in ("teacher", "student", "loss", "optim")}
    return {"step": sum(m["step_s"] for m in ms) / steps, "split": split, "self_ms": total,
            "rows": rows}


def report(results: dict, args) -> str:
    lines = ["# Where the real-pair step's time goes (torch.profiler, self CPU time per step)", "",
             f"{_step_module().cpu_line()}; {len(os.sched_getaffinity(0))} usable cores; "
             f"{'random-initialised models of the real shapes; ' if args.random_init else ''}"
             f"batch {args.batch} x {args.seq_len}; {args.steps} profiled step(s) after 2.", ""]
    for name, r in results.items():
        split = ", ".join(f"{k} {v:.2f}" for k, v in r["split"].items())
        lines += [f"## {name}: {r['step']:.2f} s/step ({split}); profiled self time "
                  f"{r['self_ms']:.0f} ms/step", "", "| op | ms/step | calls/step | input shapes |",
                  "|---|---|---|---|"]
        lines += [f"| {x['op']} | {x['ms']:.1f} | {x['calls']} | {x['shapes']} |"
                  for x in r["rows"]]
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="float32,auto")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--random-init", action="store_true")
    ap.add_argument("--projection", default="")
    ap.add_argument("--out", default=str(HERE / "profile_step.md"))
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.steps, args.top)))
        return 0
    step = _step_module()
    results, t0 = {}, time.perf_counter()
    names = [v for v in args.variants.split(",") if v]
    with tempfile.TemporaryDirectory(prefix="xd_profile_") as tmp:
        root = Path(tmp)
        a = step.assets(root, argparse.Namespace(**dict(vars(args), steps=2 + args.steps)))
        for i, name in enumerate(names, 1):
            cfg = step.config(name, a, argparse.Namespace(**vars(args)), root / name)
            cfg["train"]["steps"] = 2 + args.steps
            path = root / f"{name}.json"
            path.write_text(json.dumps(cfg))
            env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
            env.pop("XDISTILL_AUTO_DTYPE", None)
            cmd = [sys.executable, __file__, "--child", name, str(path), "--steps",
                   str(args.steps), "--top", str(args.top)]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"variant {name} failed:\n{proc.stderr[-4000:]}")
            results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
            took = time.perf_counter() - t0
            print(f"[profile] {name}: {results[name]['step']:.2f} s/step ({i}/{len(names)}, "
                  f"{took:.0f} s, ETA {took / i * (len(names) - i):.0f} s)", flush=True)
    text = report(results, args)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
