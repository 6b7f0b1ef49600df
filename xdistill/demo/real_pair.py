"""The pieces of the real-pair demo: texts, teacher, projection, scoring and one arm's training run.

The adapted teacher and the projection are cached; each arm is scored by held-out bits per byte
and shows a greedy continuation.

Every training run is the product's trainer in this process (``core.build`` with
:class:`~xdistill.train.offpolicy.OffPolicyMode`, then ``core.train_step`` per step), as
``xdistill train offpolicy`` runs it; the configs are the real-model benchmark's recipe
(``benchmarks/real/RESULTS.md``) at a smaller budget.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from xdistill.assets.paths import ASSETS_VERSION, PLAYS, AssetError, model_dir
from xdistill.config import from_dict
from xdistill.data.prepare import prepare
from xdistill.demo.progress import Progress
from xdistill.demo.settings import (ARMS, EVAL_BATCH, EVAL_SEQ_LEN, HELD_OUT, STUDENT, TEACHER,
                                     DemoSettings)
from xdistill.projection import BuildConfig, build_projection, save_projection
from xdistill.projection.artifact import sidecar_path
from xdistill.student.mixed import master_weights
from xdistill.student.model import export_hf, load_causal_lm
from xdistill.tiny import passages
from xdistill.tokenization import load_tokenizer
from xdistill.train import core
from xdistill.train.config import OffPolicyConfig
from xdistill.train.evaluate import model_bits_per_byte
from xdistill.train.offpolicy import OffPolicyMode

# the sample prompt: the opening lines of this held-out passage (index into the play's passages)
PROMPT_PASSAGE, PROMPT_LINES = 60, 4
PROJECTION = BuildConfig(methods=("multitoken", "exact"), top_k=4)


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]


# ---------------------------------------------------------------- texts
def check_assets() -> None:
    """Both models and the plays are in the asset folder (``make assets`` fetches them)."""
    missing = [str(model_dir(m)) for m in (TEACHER, STUDENT) if not (model_dir(m) /
                                                                       "config.json").is_file()]
    missing += [f"the plays ({play})" for play in PLAYS if not passages(plays=[play], limit=1)]
    if missing:
        raise AssetError(f"missing assets: {', '.join(missing)}; fetch them with `make assets` "
                         "(python tools/fetch_assets.py)")


def text_kb(docs: list[str]) -> float:
    """The UTF-8 size of ``docs`` in KB (what ``slice_kb`` measures; not a JSONL file's size)."""
    return sum(len(d.encode()) for d in docs) / 1024


def texts(slice_kb: int) -> dict[str, list[str]]:
    """``domain`` (every play but the held-out one), ``slice`` (every n-th domain passage,
    ``slice_kb`` KB), ``heldout`` (*The Tempest*)."""
    domain = [p for play in PLAYS if play != HELD_OUT for p in passages(plays=[play])]
    every = max(1, round(text_kb(domain) / slice_kb))
    return {"domain": domain, "slice": domain[::every], "heldout": passages(plays=[HELD_OUT])}


def prepare_texts(root: Path, slice_kb: int) -> dict:
    """Arrow folders of the three texts under ``root/data`` (prepared once), their text KB, a
    digest of the domain text, and the sample prompt."""
    out = {}
    for name, docs in texts(slice_kb).items():
        key = f"slice_{slice_kb}kb" if name == "slice" else name
        raw = root / "data" / f"{key}.jsonl"
        body = "".join(json.dumps({"text": d}) + "\n" for d in docs)
        if not raw.exists() or raw.read_text(encoding="utf-8") != body:
            raw.parent.mkdir(parents=True, exist_ok=True)
            raw.write_text(body, encoding="utf-8")
        prepare([raw], root / "data" / key, progress=False, overwrite=True)
        out[name], out[f"{name}_kb"] = str(root / "data" / key), text_kb(docs)
        out[f"{name}_sha"] = digest(docs)
        if name == "heldout":
            out["prompt"] = "\n".join(docs[PROMPT_PASSAGE].splitlines()[:PROMPT_LINES]) + "\n"
    return out


# ---------------------------------------------------------------- evaluation and samples
def held_out_bpb(model, tok, data: dict, batches: int, add_bos: bool, progress: Progress) -> float:
    """Bits per byte on the first ``batches`` held-out windows (the model's own tokenizer), with
    its float32 master weights (a run computing in bf16 under ``dtype: auto`` is scored as the
    float32 stock model is: the change column is training, not precision); a model in training
    mode is left in it."""
    was_training = model.training
    with master_weights(model):
        res = model_bits_per_byte(model, tok, [data["heldout"]], seq_len=EVAL_SEQ_LEN,
                                  batch_size=EVAL_BATCH, batches=batches, add_bos=add_bos,
                                  progress=progress.advance)
    model.train(was_training)
    return res["bpb"]


def continuation(model, tok, prompt: str, new_tokens: int) -> str:
    """The model's greedy continuation of ``prompt`` (``new_tokens`` tokens at most)."""
    was_training = model.training
    model.eval()
    ids_BT = torch.tensor([[int(i) for i in tok.encode(prompt).ids]])
    with torch.no_grad(), master_weights(model):
        out_BT = model.generate(input_ids=ids_BT, attention_mask=torch.ones_like(ids_BT),
                                do_sample=False, max_new_tokens=new_tokens,
                                eos_token_id=tok.eos_id,
                                pad_token_id=tok.eos_id if tok.pad_id is None else tok.pad_id)
    model.train(was_training)
    new = [int(i) for i in out_BT[0, ids_BT.shape[1]:]]
    new = new[:new.index(tok.eos_id)] if tok.eos_id in new else new
    return b"".join(tok.table.token_bytes(i) for i in new).decode("utf-8", errors="replace")


def quiet_loading() -> None:
    """No per-tensor "Loading weights" bars: the demo's own progress lines say what loads."""
    hf_logging.disable_progress_bar()


def stock_student(s: DemoSettings, data: dict, progress: Progress) -> dict:
    """Held-out bits per byte and the sample of the untrained student (what both arms start
    from)."""
    with progress.stage("student before", s.eval_batches, "batch",
                        f"stock SmolLM2-135M: held-out bits per byte on {s.eval_batches} "
                        f"batch(es), greedy sample"):
        model, tok = load_causal_lm(model_dir(STUDENT)), load_tokenizer(STUDENT)
        bpb = held_out_bpb(model, tok, data, s.eval_batches, False, progress)
        sample = continuation(model, tok, data["prompt"], s.sample_tokens)
    return {"bpb": bpb, "sample": sample}


# ---------------------------------------------------------------- the adapted teacher
def teacher_config(s: DemoSettings, data: dict, out: Path) -> dict:
    """CE on the whole domain text with Gemma as the trainer's student (and its ``<bos>``)."""
    return {"student": {"path": str(model_dir(TEACHER))}, "student_tokenizer": TEACHER,
            "data": {"paths": [data["domain"]], "seq_len": s.teacher_seq_len,
                     "batch_size": s.batch, "num_workers": 0, "add_bos": True, "seed": s.seed},
            "loss": {"ce_weight": 1.0},
            "optim": {"lr": s.teacher_lr, "weight_decay": 0.0},
            "scheduler": {"kind": "cosine", "warmup_steps": max(1, s.teacher_steps // 10)},
            "train": {"steps": s.teacher_steps, "seed": s.seed, "out_dir": str(out),
                      "tensorboard": False},
            "checkpoint": {"export_hf": False, "resume": ""}}


def teacher_key(s: DemoSettings, data: dict) -> str:
    """The cache key of an adaptation: everything its weights depend on."""
    cfg = teacher_config(s, {"domain": data["domain_sha"]}, Path("."))
    return digest({"cfg": cfg, "assets": ASSETS_VERSION})


def adapted_teacher(s: DemoSettings, data: dict, root: Path, progress: Progress) -> dict:
    """The adapted teacher's folder and held-out bits per byte (stock and adapted), from the cache
    ``root/teacher-<key>`` or adapted now (then cached); ``cached`` says which."""
    folder = root / f"teacher-{teacher_key(s, data)}"
    done = folder / "done.json"
    if done.exists():
        record = json.loads(done.read_text())
        progress.line(f"[teacher] adapted teacher cached: {folder / 'export'} (adapted in "
                      f"{record['seconds']:.0f} s; key {folder.name})")
        figures = record["bpb"].get(str(s.eval_batches)) or _teacher_figures(s, data, folder,
                                                                             progress)
        if str(s.eval_batches) not in record["bpb"]:
            record["bpb"][str(s.eval_batches)] = figures
            done.write_text(json.dumps(record, indent=1))
        return {"path": str(folder / "export"), "cached": True, **figures}
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    record = _adapt(s, data, tmp, progress)
    tmp.rename(folder)   # the cache entry appears whole or not at all
    return {"path": str(folder / "export"), "cached": False, **record["bpb"][str(s.eval_batches)]}


def _adapt(s: DemoSettings, data: dict, out: Path, progress: Progress) -> dict:
    with progress.stage("teacher load", what=f"loading Gemma-3-270M for CE on the domain "
                                             f"({data['domain_kb']:.0f} KB, five plays)"):
        run = core.build(from_dict(OffPolicyConfig, teacher_config(s, data, out)),
                         OffPolicyMode())
    tok = run.plan.student_tok
    with progress.stage("teacher eval", s.eval_batches, "batch", "stock Gemma: held-out bpb"):
        stock = held_out_bpb(run.model, tok, data, s.eval_batches, True, progress)
    steps = _train(run, "teacher", progress, f"adapting Gemma: {s.teacher_steps} steps of "
                   f"{s.batch} x {s.teacher_seq_len} tokens, lr {s.teacher_lr:g}")
    with progress.stage("teacher eval", s.eval_batches, "batch", "adapted Gemma: held-out bpb"):
        adapted = held_out_bpb(run.model, tok, data, s.eval_batches, True, progress)
    with progress.stage("teacher export", what=f"writing {out.name}/export (float32)"):
        export_hf(run.model, out / "export", tok, dtype="float32", overwrite=True)
    record = {"settings": asdict(s), "seconds": steps["seconds"], "losses": steps["losses"],
              "bpb": {str(s.eval_batches): {"stock": stock, "adapted": adapted}}}
    (out / "done.json").write_text(json.dumps(record, indent=1))
    return record


def _teacher_figures(s: DemoSettings, data: dict, folder: Path, progress: Progress) -> dict:
    """Held-out bits per byte of the stock and the cached adapted teacher (for an
    ``eval_batches`` the cache has no figures for)."""
    tok, figures = load_tokenizer(TEACHER), {}
    for name, path in (("stock", model_dir(TEACHER)), ("adapted", folder / "export")):
        with progress.stage("teacher eval", s.eval_batches, "batch", f"{name} Gemma: held-out "
                                                                      "bpb"):
            figures[name] = held_out_bpb(load_causal_lm(path), tok, data, s.eval_batches, True,
                                         progress)
    return figures


def _train(run, name: str, progress: Progress, what: str) -> dict:
    """``train.steps`` optimizer steps of a built run (stage ``name``); its losses and time."""
    steps, losses = run.cfg.train.steps, []
    with progress.stage(name, steps, "step", what) as stage:
        run.mode.start(run)
        try:
            for step in range(1, steps + 1):
                losses.append(float(core.train_step(run, step).get("loss", float("nan"))))
                stage.advance()
        finally:
            run.mode.close()
    return {"losses": losses, "seconds": progress.times[name]}


# ---------------------------------------------------------------- projection
def projection_file(root: Path, progress: Progress) -> str:
    """The SmolLM2 -> Gemma projection (multitoken + exact, top-4), built once into ``root``."""
    key = digest({"cfg": asdict(PROJECTION), "pair": [STUDENT, TEACHER], "assets": ASSETS_VERSION})
    path = root / f"projection-{key}.npz"
    if sidecar_path(path).exists():   # written after the matrix
        progress.line(f"[projection] cached: {path}")
        return str(path)
    with progress.stage("projection", what=f"building {STUDENT} -> {TEACHER} "
                                           "(multitoken + exact, top-4; once, then cached)"):
        proj = build_projection(load_tokenizer(STUDENT), load_tokenizer(TEACHER), PROJECTION)
        save_projection(proj, path)
    return str(path)


# ---------------------------------------------------------------- the arms
def arm_config(arm: str, s: DemoSettings, paths: dict, out: Path) -> dict:
    """The trainer config of ``arm``: both arms read the same slice in the same order."""
    teachers = [] if arm == "ce" else [
        {"name": "gemma", "tokenizer": TEACHER, "add_bos": True,
         "worker": {"model": paths["teacher"], "micro_batch_size": s.batch, "output": "support"},
         "loss": {"kind": "pkl", "projection": paths["projection"]}}]
    return {"student": {"path": str(model_dir(STUDENT))}, "student_tokenizer": STUDENT,
            "teachers": teachers,
            "data": {"paths": [paths["slice"]], "seq_len": s.seq_len, "batch_size": s.batch,
                     "num_workers": 0, "seed": s.seed},
            "loss": {"ce_weight": 1.0, "chunk_size": 64},
            "optim": {"lr": s.lr, "weight_decay": 0.0},
            "scheduler": {"kind": "cosine", "warmup_steps": max(1, s.steps // 10)},
            "train": {"steps": s.steps, "seed": s.seed, "out_dir": str(out),
                      "tensorboard": False},
            "checkpoint": {"export_hf": False, "resume": ""}}


def run_arm(arm: str, s: DemoSettings, paths: dict, out: Path, progress: Progress) -> dict:
    """Train ``arm`` from stock SmolLM2-135M; its held-out bits per byte, sample and losses."""
    with progress.stage(f"{arm} load", what=f"{arm}: {ARMS[arm]}"):
        run = core.build(from_dict(OffPolicyConfig, arm_config(arm, s, paths, out / arm)),
                         OffPolicyMode())
    steps = _train(run, arm, progress, f"{s.steps} steps of {s.batch} x {s.seq_len} tokens, "
                                       f"lr {s.lr:g}")
    with progress.stage(f"{arm} eval", s.eval_batches, "batch",
                        f"{arm}: held-out bpb and greedy sample"):
        tok = run.plan.student_tok
        bpb = held_out_bpb(run.model, tok, paths, s.eval_batches, False, progress)
        sample = continuation(run.model, tok, paths["prompt"], s.sample_tokens)
    return {"bpb": bpb, "sample": sample, **steps}
