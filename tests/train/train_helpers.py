"""Helpers of the off-policy trainer tests (the fixtures are in this folder's conftest.py):
the tiny assets, run configs, the CLI in a subprocess, exported weights and metrics.
A module of its own name, so test modules import it directly (``from conftest import``
would find whichever folder's conftest was imported first).
"""


from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
import xdistill.tiny as mk  # noqa: E402

TINY_STUDENT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                    tie_word_embeddings=True)


def build_tiny_assets(root: Path) -> dict:
    from xdistill.projection import BuildConfig, build_projection, save_projection
    from xdistill.tokenization import load_tokenizer

    train, evald = mk.make_corpus(root / "corpus", n_train=60, n_eval=12, max_chars=400)
    texts = mk.passages(limit=150)
    tok_s = mk.train_bpe(root / "tok_s", 320, texts)
    tok_t = mk.train_bpe(root / "tok_t", 400, texts[::-1])
    same = mk.save_tiny_lm(root / "teacher_same", str(tok_s), seed=1)
    cross = mk.save_tiny_lm(root / "teacher_cross", str(tok_t), seed=2)
    s, t = load_tokenizer(str(tok_s)), load_tokenizer(str(tok_t))
    proj = build_projection(s, t, BuildConfig(methods=("multitoken", "exact")))
    save_projection(proj, root / "proj_s_t.npz")
    return {"root": str(root), "train": str(train), "eval": str(evald), "tok_s": str(tok_s),
            "tok_t": str(tok_t), "same": str(same), "cross": str(cross),
            "proj": str(root / "proj_s_t.npz")}


def base_config(assets: dict, out_dir: Path, *, cross_kind: str = "pkl") -> dict:
    """A 2-teacher run (cross: pkl or alm; same: forward_kl) on the tiny assets."""
    cross_loss = {"kind": cross_kind, "weight": 1.0}
    if cross_kind == "pkl":
        cross_loss["projection"] = assets["proj"]
    return {
        "student": {"model_type": "llama", "model_config": dict(TINY_STUDENT), "init_seed": 0},
        "student_tokenizer": assets["tok_s"],
        "teachers": [
            {"name": "cross", "tokenizer": assets["tok_t"],
             "worker": {"model": assets["cross"]}, "loss": cross_loss},
            {"name": "same", "tokenizer": assets["tok_s"],
             "worker": {"model": assets["same"]}, "loss": {"kind": "forward_kl", "weight": 0.5}},
        ],
        "data": {"paths": [assets["train"]], "seq_len": 48, "batch_size": 2, "num_workers": 0},
        "loss": {"ce_weight": 0.1, "chunk_size": 64},
        "optim": {"lr": 1.0e-2, "weight_decay": 0.01, "grad_clip": 1.0},
        "scheduler": {"kind": "cosine", "warmup_steps": 2, "min_lr_ratio": 0.1},
        "train": {"steps": 6, "global_batch_size": 4, "out_dir": str(out_dir), "log_samples": True,
                  "tensorboard": False, "num_threads": 1},
        "checkpoint": {"every": 0, "resume": "auto", "export_hf": False},
        "eval": {"every": -1},
    }


def write_config(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


def _env(extra: dict | None = None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=os.pathsep.join(
                   filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])))
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    for key, value in (extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run_cli(args: list[str], nproc: int = 1, timeout: float = 300,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """``xdistill <args>`` in a fresh process (torchrun with ``nproc`` ranks when > 1); ``env``
    overrides variables (None removes one, e.g. ``{"OMP_NUM_THREADS": None}``: torchrun's own
    default then applies)."""
    kwargs = dict(env=_env(env), cwd=str(REPO), capture_output=True, text=True, timeout=timeout)
    if nproc > 1:
        from distributed_helpers import run_on_free_port

        return run_on_free_port(lambda port: [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_port", str(port), "-m", "xdistill.cli", *args], **kwargs)
    return subprocess.run([sys.executable, "-m", "xdistill.cli", *args], **kwargs)


def exported_weights(out_dir: Path) -> dict:
    """The HF export's tensors of a finished run (``checkpoint.export_hf: true``)."""
    from safetensors.torch import load_file

    return load_file(str(out_dir / "export" / "model.safetensors"))


def train_records(out_dir: Path) -> list[dict]:
    """The per-step training records of ``<out_dir>/metrics.jsonl`` (those with a loss)."""
    from xdistill.metrics import read_metrics

    return [r for r in read_metrics(out_dir / "metrics.jsonl") if "loss" in r]
