"""Run reports on the console: the one-line start banner and end summary of a run.

``start: train offpolicy | student llama (fresh, 2.1M params, gpt2 tokenizer) | teachers qwen
(qwen2, exact_kl), gpt (gpt2, forward_kl) | cpu, 1 process x 2 threads | steps 1..24 of 24 |
out runs/offpolicy_tiny_cpu``: what runs, where, for how many steps and where it writes, before
the first step (rank 0).
"""

from __future__ import annotations

from pathlib import Path

import torch


def _student(run) -> str:
    cfg = run.cfg
    what = cfg.student.path or f"{cfg.student.model_type} (fresh)"
    params = sum(p.numel() for p in run.model.parameters())
    size = f"{params / 1e6:.1f}M" if params >= 1e6 else f"{params / 1e3:.0f}k"
    return f"student {what}, {size} params, {run.plan.student_tok.name} tokenizer"


def _teachers(cfg) -> str:
    parts = []
    for t in cfg.teachers:
        kind = getattr(t.loss, "kind", "")
        parts.append(f"{t.name} ({t.tokenizer or Path(t.worker.model).name}, {kind}, "
                     f"{t.worker.placement})")
    return "teachers " + ", ".join(parts) if parts else "no teachers (CE only)"


def start_line(run) -> str:
    """The start banner of ``run`` (a :class:`xdistill.train.core.Run`, after resume)."""
    cfg, env = run.cfg, run.env
    procs = f"{env.world_size} process{'es' if env.world_size != 1 else ''}"
    where = f"{run.device}, {procs} x {torch.get_num_threads()} threads"
    first, last = run.start_step + 1, cfg.train.steps
    steps = (f"steps {first}..{last} of {last}" if first <= last
             else f"no steps left ({run.start_step} done)")
    if run.start_step:
        steps += f" (resumed at step {run.start_step})"
    return " | ".join([f"start: train {run.mode.kind}", _student(run), _teachers(cfg), where,
                       steps, f"out {cfg.train.out_dir}"])


def end_line(run, metrics: dict, exported: Path | None, seconds: float) -> str:
    """The end-of-run summary: steps and time, final loss, where metrics, checkpoint and export
    are."""
    steps = max(0, run.cfg.train.steps - run.start_step)
    parts = [f"done: {steps} step(s) in {seconds:.1f} s"]
    if "loss" in metrics:
        parts.append(f"final loss {metrics['loss']:.4g}")
    parts.append(f"metrics {Path(run.cfg.train.out_dir) / 'metrics.jsonl'}")
    if run.last_checkpoint is not None:
        parts.append(f"checkpoint {run.last_checkpoint}")
    if exported is not None:
        parts.append(f"export {exported}")
    return "; ".join(parts)
