"""Run arms x seeds through the trainer, score each student, aggregate mean +- std.

Per run ``<out>/runs/<arm>/seed<k>``: the generated ``config.yaml`` and its log, the trainer's
``metrics.jsonl`` and ``export/`` (the HF student), and ``score.json``: held-out greedy accuracy,
final held-out bits per byte, wall time and ``curve``: ``[[step, held-out accuracy], ...]`` of the
checkpoints saved every ``ArmSettings.eval_every`` steps (and at the last step), which are deleted
once scored. A run whose ``score.json`` exists is not repeated, so an interrupted harness resumes
where it stopped.

Every trainer child is watched by :mod:`toyq.runner` (progress lines, stall detection). A failing
run is reported and the others go on, unless ``fail_fast`` (``--short``): then the first failure
cancels the runs in flight and is raised as one :class:`RunFailed`.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from toyq.arms import ArmSettings, arm_command, arm_config
from toyq.evaluate import SCORING
from toyq.runner import RunFailed, Watch, format_duration, run_config, say
from toyq.summary import summarize

# run-config keys that do not change what is trained: a finished run made with other values is
# the same run (where it was written, how often it logged, whether TensorBoard was on). Torch
# threads are among them: they can change float reductions, hence the digits of a run, but not
# the protocol; the run-to-run spread this leaves is measured in RESULTS.md
LOCATION_AND_LOGGING = ("out_dir", "log_every", "tensorboard", "wandb", "wandb_project",
                        "num_threads")


class _Ticker:
    """``log`` at most once per ``every`` seconds (progress of in-process phases such as
    scoring), unless forced."""

    def __init__(self, log, label: str, every: float = 10.0):
        self.log, self.label, self.every = log, label, every
        self.t0 = self.last = time.monotonic()

    def __call__(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= self.every:
            self.last = now
            self.log(f"[{self.label}] {text} ({format_duration(now - self.t0)} elapsed)")


def eval_split(assets: dict) -> str:
    """The problems accuracy is measured on (``assets["eval_split"]``): ``heldout`` (the test
    split, default), ``valid`` (the twin-free validation split of the issue-24 screening) or
    ``unlabeled`` (the training problems the student's corpus has no label for; ``run.py`` adds
    them)."""
    split = assets.get("eval_split", "heldout")
    if split not in assets["corpus"]:
        raise KeyError(f"the prepared corpus has no {split!r} split (twin_free with n_valid > 0 "
                       "makes the validation one)")
    return split


def score_run(run_dir: Path, assets: dict) -> dict:
    """Greedy accuracy, format rate and held-out bits per byte of the exported student (the same
    scorer for every arm, off- and on-policy), on :func:`eval_split`'s problems."""
    from toyq.evaluate import bits_per_byte, greedy_accuracy, load_model
    from xdistill.tokenization import load_tokenizer

    model, tok = load_model(str(run_dir / "export")), load_tokenizer(assets["tok_student"])
    split = eval_split(assets)
    acc = greedy_accuracy(model, tok, assets["corpus"][split])
    return {"accuracy": acc["accuracy"], "format_rate": acc["format_rate"], "split": split,
            "n": acc["n"],
            "bpb": bits_per_byte(model, tok, eval_texts(assets)), "examples": acc["examples"]}


def accuracy_curve(run_dir: Path, assets: dict, prune: bool = True, tick=None) -> list:
    """``[[step, held-out accuracy], ...]`` of every checkpoint the run saved (each loaded, as a
    resume would, into the architecture of the run's ``export/``); checkpoints are deleted
    afterwards unless ``prune`` is false (``export/`` stays)."""
    import shutil

    from toyq.evaluate import greedy_accuracy, load_model
    from xdistill.tokenization import load_tokenizer
    from xdistill.train.checkpoint import list_checkpoints, load_checkpoint

    tok, curve = load_tokenizer(assets["tok_student"]), []
    root = run_dir / "checkpoints"
    found = list_checkpoints(root)
    model = load_model(str(run_dir / "export")) if found else None  # every weight is overwritten
    for i, (step, path) in enumerate(found):
        load_checkpoint(path, model, restore_rng=False)
        curve.append([step, greedy_accuracy(model, tok,
                                            assets["corpus"][eval_split(assets)])["accuracy"]])
        if tick is not None:
            tick(f"scoring checkpoints: {i + 1}/{len(found)} (step {step})")
    if prune and root.is_dir():
        shutil.rmtree(root)
    return curve


def eval_texts(assets: dict) -> list[str]:
    """The held-out text passages (``eval_text.jsonl``)."""
    path = Path(assets["corpus"]["eval_text_jsonl"])
    return [json.loads(x)["text"] for x in path.read_text(encoding="utf-8").splitlines() if x]


def run_arm(arm: str, seed: int, assets: dict, settings: ArmSettings, out: Path, log=say,
            keep_checkpoints: bool = False, watch: Watch = Watch(),
            cancel: threading.Event | None = None) -> dict:
    """Train (or reuse) and score one run; raises :class:`RunFailed` if its trainer fails."""
    run_dir = out / "runs" / arm / f"seed{seed}"
    score_path = run_dir / "score.json"
    cfg = arm_config(arm, seed, assets, settings, str(run_dir))
    if score_path.exists():
        check_same_config(run_dir, cfg)
        score = json.loads(score_path.read_text())
        if score.get("split", "heldout") != eval_split(assets):
            raise RuntimeError(f"{run_dir} was scored on the {score.get('split', 'heldout')!r} "
                               f"split, this invocation scores {eval_split(assets)!r}; pick "
                               "another --out")
        return score
    label = f"{arm} seed {seed}"
    log(f"[{label}] training: {cfg['train']['steps']} steps (log: {run_dir / 'config.log'})")
    t0 = time.perf_counter()
    run_config(cfg, run_dir / "config.yaml", command=arm_command(arm), label=label, watch=watch,
               log=log, cancel=cancel)
    train_s = time.perf_counter() - t0
    tick = _Ticker(log, label)
    tick("trained; scoring the exported student", force=True)
    with SCORING:  # one model in this process at a time (see evaluate.SCORING)
        score = {"arm": arm, "seed": seed, **score_run(run_dir, assets), "train_s": train_s,
                 "curve": accuracy_curve(run_dir, assets, prune=not keep_checkpoints, tick=tick)}
    score_path.write_text(json.dumps(score, indent=1))
    log(f"[{label}] accuracy {score['accuracy']:.3f}  bpb {score['bpb']:.3f}  "
        f"(trained in {train_s:.0f}s, scored in {time.perf_counter() - t0 - train_s:.0f}s)")
    return score


def check_same_config(run_dir: Path, cfg: dict) -> None:
    """A finished run is reused only under the config that made it: another task (e.g.
    ``--answer-noise``), teacher, weighting or budget in the same ``--out`` is an error, not a
    silent mix (keys in ``LOCATION_AND_LOGGING`` may differ; paths that exist are compared after
    resolving links, so a finished run linked from another study's folder, warm start included,
    is the same run)."""
    import yaml

    def resolved(v):
        if isinstance(v, dict):
            return {k: resolved(x) for k, x in v.items()}
        if isinstance(v, list):
            return [resolved(x) for x in v]
        if isinstance(v, str) and v.startswith("/") and Path(v).exists():
            return str(Path(v).resolve())
        return v

    def where_free(c: dict) -> dict:
        return resolved({**c, "train": {k: v for k, v in c.get("train", {}).items()
                                        if k not in LOCATION_AND_LOGGING}})

    path = run_dir / "config.yaml"
    old = where_free(yaml.safe_load(path.read_text(encoding="utf-8"))) if path.exists() else {}
    new = where_free(cfg)
    if old != new:
        diff = sorted(k for k in set(new) | set(old) if old.get(k) != new.get(k))
        raise RuntimeError(f"{run_dir} holds a finished run made with another config (differs in "
                           f"{', '.join(diff) or 'everything'}: e.g. another --answer-noise, "
                           f"--teacher-steps or --steps); pick another --out or delete that run")


def run_harness(assets: dict, arms, seeds, settings: ArmSettings, out: str | Path,
                log=say, jobs: int = 1, keep_checkpoints: bool = False,
                watch: Watch = Watch(), fail_fast: bool = False,
                cancel: threading.Event | None = None) -> dict:
    """All runs (cached per run), ``jobs`` trainer processes at a time; returns
    ``{"runs": [...], "summary": {arm: stats}, "failed": {arm: error}}``. Each run's
    ``checkpoints/`` is deleted once scored into its curve unless ``keep_checkpoints``.
    ``fail_fast``: the first failing run cancels the others and raises its :class:`RunFailed`.
    ``cancel``: set by the caller, it stops the runs in flight (each fails as cancelled)."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    out = Path(out)
    torch.set_num_threads(max(1, settings.threads))  # scoring in this process
    todo = [(arm, seed) for seed in seeds for arm in arms]
    cancel = cancel or threading.Event()

    def one(arm_seed):
        arm, seed = arm_seed
        if cancel.is_set():
            return {"arm": arm, "seed": seed, "error": "not run (cancelled)", "cancelled": True}
        try:
            return run_arm(arm, seed, assets, settings, out, log, keep_checkpoints, watch, cancel)
        except RunFailed as exc:
            if fail_fast and not exc.cancelled:
                cancel.set()
            if not exc.cancelled and not fail_fast:  # fail_fast: the caller reports it once
                log(f"[{arm} seed {seed}] FAILED: {exc}")
            return {"arm": arm, "seed": seed, "error": str(exc), "exc": exc,
                    "cancelled": exc.cancelled, "log": str(exc.log_path)}

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        runs = list(pool.map(one, todo))
    errors = sorted((r for r in runs if "exc" in r), key=lambda r: r["cancelled"])
    if fail_fast and errors:  # the first real failure, else (cancelled by the caller) any
        raise errors[0]["exc"]
    runs = [{k: v for k, v in r.items() if k != "exc"} for r in runs]
    failed = {r["arm"]: r["error"] for r in runs if "error" in r}
    return {"runs": runs, "summary": summarize(runs, arms), "failed": failed}


def uncommon_answer_fraction(assets: dict) -> float:
    """GOLD diagnostic: fraction of held-out answer tokens (student side) without an
    identical-bytes teacher token, i.e. in GOLD's "uncommon" set."""
    from xdistill.tokenization import load_tokenizer
    from xdistill.train.teacher_plan import shared_vocab

    s, t = load_tokenizer(assets["tok_student"]), load_tokenizer(assets["tok_teacher"])
    shared = set(shared_vocab(s, t)[0].tolist())
    ids = [int(i) for a, b in assets["corpus"]["heldout"]
           for i in s.encode(str(a + b), add_special_tokens=False).ids]
    return sum(i not in shared for i in ids) / max(len(ids), 1)
