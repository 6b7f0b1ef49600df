"""Run arms x seeds through the trainer, score each student, aggregate mean +- std.

Per run ``<out>/runs/<arm>/seed<k>``: the generated ``config.yaml`` and its log, the trainer's
``metrics.jsonl`` and ``export/`` (the HF student), and ``score.json``: held-out greedy accuracy,
final held-out bits per byte, wall time and ``curve``: ``[[step, held-out accuracy], ...]`` of the
checkpoints saved every ``ArmSettings.eval_every`` steps (and at the last step), which are deleted
once scored. A run whose ``score.json`` exists is not repeated, so an interrupted harness resumes
where it stopped.

Learning speed: ``acc_auc`` = the mean of a run's curve accuracies, i.e. the area under the
accuracy-vs-step curve (step rule, one point per ``eval_every`` steps) divided by the steps. It is
defined only for curves of at least two points (``eval_every = 0`` leaves just the final
checkpoint, whose accuracy is the final accuracy, not a learning speed).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

from benchmarks.quality.arms import ArmSettings, arm_command, arm_config
from benchmarks.quality.runner import run_config


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def score_run(run_dir: Path, assets: dict) -> dict:
    """Greedy accuracy and held-out bits per byte of the exported student (the same scorer for
    every arm, off- and on-policy)."""
    from xdistill.tokenization import load_tokenizer

    from benchmarks.quality.evaluate import bits_per_byte, greedy_accuracy, load_model

    model, tok = load_model(str(run_dir / "export")), load_tokenizer(assets["tok_student"])
    acc = greedy_accuracy(model, tok, assets["corpus"]["heldout"])
    return {"accuracy": acc["accuracy"], "n": acc["n"],
            "bpb": bits_per_byte(model, tok, eval_texts(assets)), "examples": acc["examples"]}


def accuracy_curve(run_dir: Path, assets: dict, prune: bool = True) -> list:
    """``[[step, held-out accuracy], ...]`` of every checkpoint the run saved (each loaded, as a
    resume would, into the architecture of the run's ``export/``); checkpoints are deleted
    afterwards unless ``prune`` is false (``export/`` stays)."""
    import shutil

    from xdistill.tokenization import load_tokenizer
    from xdistill.train.checkpoint import list_checkpoints, load_checkpoint

    from benchmarks.quality.evaluate import greedy_accuracy, load_model

    tok, curve = load_tokenizer(assets["tok_student"]), []
    root = run_dir / "checkpoints"
    found = list_checkpoints(root)
    model = load_model(str(run_dir / "export")) if found else None  # every weight is overwritten
    for step, path in found:
        load_checkpoint(path, model, restore_rng=False)
        curve.append([step, greedy_accuracy(model, tok, assets["corpus"]["heldout"])["accuracy"]])
    if prune and root.is_dir():
        shutil.rmtree(root)
    return curve


def eval_texts(assets: dict) -> list[str]:
    """The held-out text passages (``eval_text.jsonl``)."""
    path = Path(assets["corpus"]["eval_text_jsonl"])
    return [json.loads(x)["text"] for x in path.read_text(encoding="utf-8").splitlines() if x]


def run_arm(arm: str, seed: int, assets: dict, settings: ArmSettings, out: Path, log=print,
            keep_checkpoints: bool = False) -> dict:
    run_dir = out / "runs" / arm / f"seed{seed}"
    score_path = run_dir / "score.json"
    cfg = arm_config(arm, seed, assets, settings, str(run_dir))
    if score_path.exists():
        check_same_config(run_dir, cfg)
        return json.loads(score_path.read_text())
    t0 = time.perf_counter()
    try:
        run_config(cfg, run_dir / "config.yaml", command=arm_command(arm))
    except RuntimeError as exc:  # a failing arm is reported, the others still run
        last = str(exc).strip().splitlines()[-1]
        log(f"[{arm} seed {seed}] FAILED: {last}")
        return {"arm": arm, "seed": seed, "error": last, "log": str(run_dir / "config.log")}
    train_s = time.perf_counter() - t0
    score = {"arm": arm, "seed": seed, **score_run(run_dir, assets), "train_s": train_s,
             "curve": accuracy_curve(run_dir, assets, prune=not keep_checkpoints)}
    score_path.write_text(json.dumps(score, indent=1))
    log(f"[{arm} seed {seed}] accuracy {score['accuracy']:.3f}  bpb {score['bpb']:.3f}  "
        f"({train_s:.0f}s)")
    return score


def check_same_config(run_dir: Path, cfg: dict) -> None:
    """A finished run is reused only under the config that made it: another task (e.g.
    ``--answer-noise``), teacher or budget in the same ``--out`` is an error, not a silent mix."""
    import yaml

    def where_free(c: dict) -> dict:  # a run moved or copied from another --out is the same run
        return {**c, "train": {k: v for k, v in c.get("train", {}).items() if k != "out_dir"}}

    path = run_dir / "config.yaml"
    old = where_free(yaml.safe_load(path.read_text(encoding="utf-8"))) if path.exists() else {}
    new = where_free(cfg)
    if old != new:
        diff = sorted(k for k in set(new) | set(old) if old.get(k) != new.get(k))
        raise RuntimeError(f"{run_dir} holds a finished run made with another config (differs in "
                           f"{', '.join(diff) or 'everything'}: e.g. another --answer-noise, "
                           f"--teacher-steps or --steps); pick another --out or delete that run")


def run_harness(assets: dict, arms, seeds, settings: ArmSettings, out: str | Path,
                log=print, jobs: int = 1, keep_checkpoints: bool = False) -> dict:
    """All runs (cached per run), ``jobs`` trainer processes at a time; returns
    ``{"runs": [...], "summary": {arm: stats}, "failed": {arm: error}}``. Each run's
    ``checkpoints/`` is deleted once scored into its curve unless ``keep_checkpoints``."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    out = Path(out)
    torch.set_num_threads(max(1, settings.threads))  # scoring in this process
    todo = [(arm, seed) for seed in seeds for arm in arms]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        runs = list(pool.map(lambda a_s: run_arm(a_s[0], a_s[1], assets, settings, out, log,
                                                 keep_checkpoints), todo))
    failed = {r["arm"]: r["error"] for r in runs if "error" in r}
    return {"runs": runs, "summary": summarize(runs, arms), "failed": failed}


def _mean_std(xs: list[float]) -> tuple[float, float]:
    xs = [x for x in xs if x is not None]
    if not xs:
        return float("nan"), float("nan")
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def acc_auc(run: dict) -> float | None:
    """Mean held-out accuracy over the run's curve points; None without a curve of >= 2 points
    (score.json files written before curves existed have none)."""
    curve = run.get("curve") or []
    if len(curve) < 2:
        return None
    return statistics.fmean(float(acc) for _, acc in curve)


def summarize(runs: list[dict], arms) -> dict:
    """Per arm, over its successful seeds: mean and std of final accuracy, bits per byte and
    ``acc_auc`` (None where no run has a curve, so results.json stays strict JSON; ``auc_seeds``
    counts the runs that have one)."""
    out = {}
    for arm in arms:
        rs = [r for r in runs if r["arm"] == arm and "error" not in r]
        if not rs:
            continue
        acc, acc_sd = _mean_std([r["accuracy"] for r in rs])
        bpb, bpb_sd = _mean_std([r["bpb"] for r in rs])
        aucs = [acc_auc(r) for r in rs]
        auc, auc_sd = _mean_std(aucs) if any(a is not None for a in aucs) else (None, None)
        out[arm] = {"accuracy": acc, "accuracy_std": acc_sd, "bpb": bpb, "bpb_std": bpb_sd,
                    "acc_auc": auc, "acc_auc_std": auc_sd,
                    "auc_seeds": sum(a is not None for a in aucs),
                    "seeds": len(rs), "train_s": statistics.fmean(r["train_s"] for r in rs)}
    return out


def _pm(mean, std) -> str:
    """``mean ± std`` with 3 decimals, ``-`` when missing (nan/None)."""
    if mean is None or math.isnan(mean):
        return "-"
    return f"{mean:.3f} ± {std:.3f}"


def format_table(summary: dict) -> str:
    """Markdown table: final accuracy, mean accuracy over training (``acc_auc``), bits per byte,
    mean ± std over seeds."""
    lines = ["| arm | held-out accuracy | mean accuracy over training | bits per byte | seeds "
             "| train s/run |", "|---|---|---|---|---|---|"]
    for arm, s in summary.items():
        auc = _pm(s.get("acc_auc"), s.get("acc_auc_std"))
        lines.append(f"| {arm} | {_pm(s['accuracy'], s['accuracy_std'])} | {auc} | "
                     f"{_pm(s['bpb'], s['bpb_std'])} | {s['seeds']} | {s['train_s']:.0f} |")
    return "\n".join(lines)


def uncommon_answer_fraction(assets: dict) -> float:
    """GOLD diagnostic: fraction of held-out answer tokens (student side) without an
    identical-bytes teacher token, i.e. in GOLD's "uncommon" set."""
    from xdistill.tokenization import load_tokenizer
    from xdistill.train.setup import shared_vocab

    s, t = load_tokenizer(assets["tok_student"]), load_tokenizer(assets["tok_teacher"])
    shared = set(shared_vocab(s, t)[0].tolist())
    ids = [int(i) for a, b in assets["corpus"]["heldout"]
           for i in s.encode(str(a + b), add_special_tokens=False).ids]
    return sum(i not in shared for i in ids) / max(len(ids), 1)
