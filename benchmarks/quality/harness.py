"""Run arms x seeds through the trainer, score each student, aggregate mean +- std.

Per run ``<out>/runs/<arm>/seed<k>``: the generated ``config.yaml`` and its log, the trainer's
``metrics.jsonl`` and ``export/`` (the HF student), and ``score.json``: held-out greedy accuracy,
final held-out bits per byte, wall time. A run whose ``score.json`` exists is not repeated, so an
interrupted harness resumes where it stopped.
"""

from __future__ import annotations

import json
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
    return {"accuracy": acc["accuracy"], "n": acc["n"], "bpb": bits_per_byte(model, tok, eval_texts(assets)),
            "examples": acc["examples"]}


def eval_texts(assets: dict) -> list[str]:
    """The held-out text passages (``eval_text.jsonl``)."""
    path = Path(assets["corpus"]["eval_text_jsonl"])
    return [json.loads(x)["text"] for x in path.read_text(encoding="utf-8").splitlines() if x]


def run_arm(arm: str, seed: int, assets: dict, settings: ArmSettings, out: Path, log=print) -> dict:
    run_dir = out / "runs" / arm / f"seed{seed}"
    score_path = run_dir / "score.json"
    if score_path.exists():
        return json.loads(score_path.read_text())
    t0 = time.perf_counter()
    cfg = arm_config(arm, seed, assets, settings, str(run_dir))
    try:
        run_config(cfg, run_dir / "config.yaml", command=arm_command(arm))
    except RuntimeError as exc:  # a failing arm is reported, the others still run
        last = str(exc).strip().splitlines()[-1]
        log(f"[{arm} seed {seed}] FAILED: {last}")
        return {"arm": arm, "seed": seed, "error": last, "log": str(run_dir / "config.log")}
    train_s = time.perf_counter() - t0
    score = {"arm": arm, "seed": seed, **score_run(run_dir, assets), "train_s": train_s}
    score_path.write_text(json.dumps(score, indent=1))
    log(f"[{arm} seed {seed}] accuracy {score['accuracy']:.3f}  bpb {score['bpb']:.3f}  "
        f"({train_s:.0f}s)")
    return score


def run_harness(assets: dict, arms, seeds, settings: ArmSettings, out: str | Path,
                log=print, jobs: int = 1) -> dict:
    """All runs (cached per run), ``jobs`` trainer processes at a time; returns
    ``{"runs": [...], "summary": {arm: stats}, "failed": {arm: error}}``."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    out = Path(out)
    torch.set_num_threads(max(1, settings.threads))  # scoring in this process
    todo = [(arm, seed) for seed in seeds for arm in arms]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        runs = list(pool.map(lambda a_s: run_arm(a_s[0], a_s[1], assets, settings, out, log),
                             todo))
    failed = {r["arm"]: r["error"] for r in runs if "error" in r}
    return {"runs": runs, "summary": summarize(runs, arms), "failed": failed}


def _mean_std(xs: list[float]) -> tuple[float, float]:
    xs = [x for x in xs if x is not None]
    if not xs:
        return float("nan"), float("nan")
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def summarize(runs: list[dict], arms) -> dict:
    out = {}
    for arm in arms:
        rs = [r for r in runs if r["arm"] == arm and "error" not in r]
        if not rs:
            continue
        acc, acc_sd = _mean_std([r["accuracy"] for r in rs])
        bpb, bpb_sd = _mean_std([r["bpb"] for r in rs])
        out[arm] = {"accuracy": acc, "accuracy_std": acc_sd, "bpb": bpb, "bpb_std": bpb_sd,
                    "seeds": len(rs), "train_s": statistics.fmean(r["train_s"] for r in rs)}
    return out


def format_table(summary: dict) -> str:
    lines = ["| arm | held-out accuracy | bits per byte | seeds | train s/run |",
             "|---|---|---|---|---|"]
    for arm, s in summary.items():
        lines.append(f"| {arm} | {s['accuracy']:.3f} ± {s['accuracy_std']:.3f} | "
                     f"{s['bpb']:.3f} ± {s['bpb_std']:.3f} | {s['seeds']} | {s['train_s']:.0f} |")
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
