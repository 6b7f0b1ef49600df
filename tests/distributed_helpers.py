"""Shared helpers for multi-process tests: a torchrun launcher and a tiny-Llama training worker.

``run_torchrun(args, nproc)`` runs this file under ``torchrun --nproc_per_node nproc`` on its own
free port (gloo, OMP_NUM_THREADS=1). ``run_python(args)`` runs it as one plain process (no process
group). ``train(...)`` is the worker itself; tests also call it in-process for the 1-process
reference run.

The worker trains a tiny Llama with AdamW + warmup/cosine on a deterministic sequence of global
batches: every step has ``MICRO`` micro-batches of ``ROWS`` global rows; each rank takes its
contiguous slice of the rows. Labels are masked at random (global torch RNG, seeded identically on
every rank) so ranks hold different valid-token counts; the loss is the summed token CE divided by
the global valid-token count over all ranks and micro-batches. With ``grad_reduce="sum"`` the
update therefore equals one process on the whole global batch.

Axes: ``M`` micro-batches of a step, ``B`` rows, ``T`` tokens, ``V`` vocabulary.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
TINY_LLAMA = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  tie_word_embeddings=True)
ROWS, MICRO, SEQ = 4, 2, 16
CLIP = 0.5  # below the tiny model's gradient norms, so clipping is active in every step


# --------------------------------------------------------------------------- launching
def free_port() -> int:
    """A TCP port nobody listens on right now (each multi-process test gets its own)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_taken(proc: subprocess.CompletedProcess) -> bool:
    """The rendezvous lost its port: another process took it between :func:`free_port` closing
    it and torchrun binding it (rare; the other xdist worker's connections share the range)."""
    text = f"{proc.stdout}\n{proc.stderr}"
    return "EADDRINUSE" in text or "ddress already in use" in text


def run_on_free_port(make_cmd, **run_kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(make_cmd(port))`` on a fresh free port, tried again (up to 3 times in
    all) when the port was taken before torchrun bound it."""
    for _ in range(3):
        proc = subprocess.run(make_cmd(free_port()), **run_kwargs)
        if proc.returncode == 0 or not port_taken(proc):
            break
    return proc


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=os.pathsep.join(
                   filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])))
    env.pop("WORLD_SIZE", None)
    return env


def _clip(text: str, keep: int = 5000) -> str:
    """Head and tail of a long log (the first rank's error is near the top, torchrun's summary at
    the bottom)."""
    return text if len(text) <= 2 * keep else f"{text[:keep]}\n[...]\n{text[-keep:]}"


def _check(proc: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    if proc.returncode != 0:
        raise AssertionError(f"{what} failed with exit code {proc.returncode}\n"
                             f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{_clip(proc.stderr)}")
    return proc


def run_torchrun(args: list[str], nproc: int = 2, timeout: float = 120.0, script: Path = HERE,
                 check: bool = True) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node nproc --master_port <free> script args`` (gloo on CPU)."""
    def cmd(port: int) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node",
                str(nproc), "--master_addr", "127.0.0.1", "--master_port", str(port),
                str(script), *args]

    proc = run_on_free_port(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)
    return _check(proc, f"torchrun {script.name} {' '.join(args)}") if check else proc


def run_python(args: list[str], timeout: float = 120.0, script: Path = HERE,
               check: bool = True) -> subprocess.CompletedProcess:
    """``python script args`` in a fresh process without a process group."""
    proc = subprocess.run([sys.executable, str(script), *args], env=_env(), capture_output=True,
                          text=True, timeout=timeout)
    return _check(proc, f"python {script.name} {' '.join(args)}") if check else proc


# --------------------------------------------------------------------------- the worker
def build_tiny(student_overrides: dict | None = None):
    from xdistill.student.config import StudentConfig
    from xdistill.student.model import load_student

    cfg = StudentConfig(model_type="llama", model_config=dict(TINY_LLAMA), init_seed=1234,
                        **(student_overrides or {}))
    return load_student(cfg), cfg


def build_optim(model, total_steps: int):
    from xdistill.train.optim import OptimConfig, SchedulerConfig, build_optimizer, build_scheduler

    opt = build_optimizer(model, OptimConfig(lr=3e-3, weight_decay=0.1, grad_clip=1.0))
    sched = build_scheduler(opt, SchedulerConfig(kind="cosine", warmup_steps=2,
                                                 total_steps=total_steps, min_lr_ratio=0.1))
    return opt, sched


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids of step ``step`` (fixed by the step) and labels masked with the *global* RNG, which
    every rank advances identically (so a resume must restore it to reproduce the masks)."""
    gen = torch.Generator().manual_seed(10_000 + step)
    ids_MBT = torch.randint(0, TINY_LLAMA["vocab_size"], (MICRO, ROWS, SEQ), generator=gen)
    keep_MBT = torch.rand(MICRO, ROWS, SEQ) < 0.7
    labels_MBT = torch.where(keep_MBT, ids_MBT, torch.full_like(ids_MBT, -100))
    return ids_MBT, labels_MBT


def train_step(model, opt, sched, step: int, rank: int, world: int) -> tuple[float, float]:
    """One optimizer step over MICRO micro-batches; loss normalised by the global token count.
    Returns (loss, gradient norm before clipping)."""
    from xdistill import distributed as xdist
    from xdistill.train.optim import clip_grad_norm

    ids_MBT, labels_MBT = global_batch(step)
    rows = slice(rank * ROWS // world, (rank + 1) * ROWS // world)
    # next-token targets: position t predicts labels[t + 1]
    targets_MBT = labels_MBT[:, rows, 1:]
    n_global = xdist.all_reduce_sum(int((targets_MBT != -100).sum()))
    total = 0.0
    for mb in range(MICRO):
        logits_BTV = model(input_ids=ids_MBT[mb, rows]).logits[:, :-1].float()
        loss_sum = F.cross_entropy(logits_BTV.reshape(-1, logits_BTV.shape[-1]),
                                   targets_MBT[mb].reshape(-1), ignore_index=-100, reduction="sum")
        (loss_sum / n_global).backward()
        total += float(loss_sum.detach())
    norm = clip_grad_norm(model, CLIP)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return xdist.all_reduce_sum(total) / n_global, norm


def _assert_sharded(model) -> None:
    """Every parameter is a DTensor sharded on dim 0 over the mesh's "dp_shard" dimension."""
    from torch.distributed.tensor import DTensor, Shard

    for name, param in model.named_parameters():
        assert isinstance(param, DTensor), name
        assert param.placements[-1] == Shard(0), (name, param.placements)
        shard = param.device_mesh.size(-1)
        assert param.to_local().shape[0] <= -(-param.shape[0] // shard), (name, param.to_local().shape)


def check_collectives(out_dir: str) -> None:
    """Exercise xdistill.distributed on every rank; rank r writes its results to JSON."""
    import json

    from xdistill import distributed as xdist

    env = xdist.init_distributed()
    r = env.rank
    results = {
        "rank": xdist.get_rank(), "world": xdist.get_world_size(), "backend": env.backend,
        "sum_int": xdist.all_reduce_sum(r + 1), "sum_float": xdist.all_reduce_sum(0.5 * (r + 1)),
        "sum_tensor": xdist.all_reduce_sum(torch.tensor([r, 10 * r], dtype=torch.float32)).tolist(),
        "max_int": xdist.all_reduce_max(r * 7), "mean": xdist.all_reduce_mean(float(r)),
        "broadcast": xdist.broadcast_object({"from": r}),
        "mesh": list(xdist.build_device_mesh(env).mesh.shape),
    }
    xdist.barrier()
    Path(out_dir, f"collectives_rank{r}.json").write_text(json.dumps(results))


def train(out: str, steps: int, *, save_at: int = -1, ckpt: str = "", resume: str = "",
          hf: str = "", student: dict | None = None) -> list[float]:
    """Train (or resume and finish) a run; rank 0 writes the final full state dict to ``out``."""
    from xdistill import distributed as xdist
    from xdistill.student.model import export_hf, full_state_dict
    from xdistill.student.parallelize import parallelize_student
    from xdistill.train.checkpoint import load_checkpoint, save_checkpoint

    env = xdist.init_distributed()
    torch.manual_seed(77)  # same global RNG stream on every rank
    model, cfg = build_tiny(student)
    parallelize_student(model, None, cfg)
    if env.world_size > 1:
        _assert_sharded(model)
    opt, sched = build_optim(model, steps)
    start, losses, norms = 0, [], []
    if resume:
        state = load_checkpoint(resume, model, opt, sched)
        want = {"next_step": state.step, "rank": env.rank}
        assert state.dataloader_state == want, (state.dataloader_state, want)
        start = state.step
    for step in range(start, steps):
        loss, norm = train_step(model, opt, sched, step, env.rank, env.world_size)
        losses.append(loss)
        norms.append(norm)
        if step + 1 == save_at:
            save_checkpoint(ckpt, step + 1, model, opt, sched, keep_last=2,
                            dataloader_state={"next_step": step + 1, "rank": env.rank})
    state = full_state_dict(model)
    if env.is_main:
        torch.save({"state": state, "losses": losses, "norms": norms, "lr": sched.get_last_lr()}, out)
    if hf:
        export_hf(model, hf)
    return losses


def main(argv: list[str] | None = None) -> int:
    """Each ``--job JSON`` is the keyword arguments of one :func:`train` call; runs go in order
    inside one process group (one torchrun launch covers several variants)."""
    import json

    from xdistill import distributed as xdist

    ap = argparse.ArgumentParser()
    ap.add_argument("--job", action="append", default=[], help="JSON kwargs of train()")
    ap.add_argument("--check-collectives", default="", help="folder for collective results")
    args = ap.parse_args(argv)
    if args.check_collectives:
        check_collectives(args.check_collectives)
    for run in args.job:
        train(**json.loads(run))
    ran_group = xdist.is_distributed()
    xdist.destroy_distributed()
    if ran_group:   # as the CLI leaves: no interpreter teardown beside gloo's threads (it once
        xdist.leave_process(0)   # aborted rank 0 of this helper in CI; leave_process's doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
