"""Prepare (and cache) everything the arms share: corpora, tokenizers, teachers, projections.

Teachers are trained by the project's own trainer in CE-only mode (``teachers: []``,
``loss.ce_weight: 1``, a fresh Llama of the teacher's size as the "student"), through the same
``xdistill train offpolicy --config`` command the arms use; the exported Hugging Face folder
(``<run>/export``) is the teacher model. Everything lands under ``<root>/<key>`` where ``key``
hashes the task and the preparation settings, so a second call reuses it.

Layout under ``<root>/<key>``: ``corpus/*.jsonl`` + prepared ``corpus/{teacher,student,eval_text}``,
``tok_teacher/``, ``tok_student/``, ``teacher_big/``, ``teacher_weak/`` and, when an arm asks for
it, ``teacher_same_big/`` (the same-tokenizer control: the student's tokenizer at the big
teacher's size and steps) and the second teachers ``teacher_big_t2/``, ``teacher_same_big_t2/``
(the same settings as ``teacher_big`` / ``teacher_same_big``, training seed 1; ``_t3``, ``_t4``:
seeds 2, 3) and the budget teachers ``teacher_big_s<steps>[_t<k>]`` /
``teacher_same_big_s<steps>[_t<k>]`` (the big settings at ``<steps>`` CE steps) (trainer runs;
models in ``export/``), ``proj_multitoken.npz``, ``proj_corpus.npz``, ``assets.json`` (paths,
teacher accuracies, timings).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

from toyq import task, toks
from toyq.runner import Watch, run_config, say

# teacher runs write a metrics record every this many steps: the harness's progress lines (and its
# stall detection) read them, so they come every few seconds even on a loaded machine
TEACHER_LOG_EVERY = 5
LLAMA = dict(num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
             tie_word_embeddings=True)


@dataclass(frozen=True)
class PrepConfig:
    """What to prepare (hashed into the cache key)."""

    task: task.TaskConfig = field(default_factory=task.TaskConfig)
    # cross-tokenizer teacher (teacher tokenizer): layers, width, CE training steps
    big_layers: int = 3
    big_hidden: int = 96
    big_steps: int = 3000
    # weaker same-tokenizer teacher (student tokenizer)
    weak_layers: int = 2
    weak_hidden: int = 64
    weak_steps: int = 600
    # windows per step, tokens per window, learning rate of teacher training
    batch: int = 32
    seq_len: int = 32
    lr: float = 3e-3
    threads: int = 1


def model_config(layers: int, hidden: int) -> dict:
    return dict(LLAMA, num_hidden_layers=layers, hidden_size=hidden, intermediate_size=hidden * 3)


# task fields added after caches existed: at their default they are left out of the cache key
OPTIONAL = ("answer_noise", "twin_free", "n_valid", "teacher_per_doc")


def cache_key(cfg: PrepConfig) -> str:
    d = asdict(cfg)
    for opt in OPTIONAL:          # caches made before an option existed stay valid at its default
        if not d["task"][opt]:
            del d["task"][opt]
    blob = json.dumps(d, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def prepare_corpora(root: Path, cfg: PrepConfig) -> dict:
    from xdistill.data.prepare import prepare

    info = task.build_corpora(root / "corpus", cfg.task)
    for name in ("teacher", "student", "eval_text"):
        prepare([info[f"{name}_jsonl"]], root / "corpus" / name, progress=False,
                overwrite=True)
        info[name] = str(root / "corpus" / name)
    return info


def ce_run_config(out: Path, tokenizer: str, data: str, eval_text: str, layers: int, hidden: int,
                  steps: int, cfg: PrepConfig, seed: int = 0) -> dict:
    """A CE-only trainer config that trains a fresh model (the teachers)."""
    return {
        # float32 pinned (not auto, which is bfloat16 on a CPU with bf16 units): every published
        # teacher was trained in float32
        "student": {"model_type": "llama", "model_config": model_config(layers, hidden),
                    "init_seed": seed, "param_dtype": "float32"},
        "student_tokenizer": tokenizer,
        "teachers": [],
        "data": {"paths": [data], "seq_len": cfg.seq_len, "batch_size": cfg.batch,
                 "num_workers": 0, "seed": seed},
        "loss": {"ce_weight": 1.0},
        "optim": {"lr": cfg.lr, "weight_decay": 0.01, "grad_clip": 1.0},
        "scheduler": {"kind": "cosine", "warmup_steps": 20, "min_lr_ratio": 0.05},
        "train": {"steps": steps, "global_batch_size": cfg.batch, "seed": seed,
                  "out_dir": str(out), "log_every": TEACHER_LOG_EVERY, "tensorboard": False,
                  "num_threads": cfg.threads},
        "checkpoint": {"every": 0, "resume": "", "export_hf": True},
        "eval": {"every": 0, "paths": [eval_text], "batches": 4},
    }


def train_teacher(out: Path, tokenizer: str, corpus: dict, layers: int, hidden: int, steps: int,
                  cfg: PrepConfig, log=say, watch: Watch = Watch(), seed: int = 0,
                  cancel: threading.Event | None = None) -> dict:
    """Train (or reuse) one teacher (``seed``: its initialisation and data order; ``cancel``:
    set, it stops the trainer run); returns its folder, held-out accuracy and bpb."""
    from xdistill.tokenization import load_tokenizer

    from toyq.evaluate import SCORING, greedy_accuracy, load_model

    export = out / "export"
    if not (export / "config.json").exists():
        log(f"[prepare] {out.name}: training {steps} steps on {cfg.threads} thread(s) "
            f"(log: {out / 'config.log'})")
        run_config(ce_run_config(out, tokenizer, corpus["teacher"], corpus["eval_text"], layers,
                                 hidden, steps, cfg, seed), out / "config.yaml", label=out.name,
                   watch=watch, log=log, cancel=cancel)
    with SCORING:
        acc = greedy_accuracy(load_model(str(export)), load_tokenizer(str(export)),
                              corpus["heldout"])
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    bpb = [m["eval/bpb"] for m in metrics if "eval/bpb" in m]
    return {"model": str(export), "accuracy": acc["accuracy"], "bpb": bpb[-1] if bpb else None,
            "examples": acc["examples"]}


def build_projections(root: Path, tok_s: str, tok_t: str, corpus_jsonl: str) -> dict:
    from xdistill.projection import BuildConfig, build_projection, save_projection
    from xdistill.tokenization import load_tokenizer

    s, t = load_tokenizer(tok_s), load_tokenizer(tok_t)
    out = {}
    for name, bc in (("multitoken", BuildConfig(methods=("multitoken", "exact"))),
                     ("corpus", BuildConfig(methods=("corpus", "multitoken", "exact"),
                                            corpus_files=(corpus_jsonl,)))):
        path = root / f"proj_{name}.npz"
        if not path.exists():
            save_projection(build_projection(s, t, bc), path)
        out[name] = str(path)
    return out


TEACHERS = ("teacher_big", "teacher_weak")
# teachers over the student's tokenizer, and each one's (layers, hidden, steps) settings
# further teachers of each big kind, ``<kind>_t<k>``: the same settings, data and tokenizer,
# training seed k - 1 (initialisation and data order): how much a gain depends on which teacher,
# not its tokenizer (``_t2`` is the eleventh protocol's second teacher, seed 1)
TEACHER_SUFFIXES = ("_t2", "_t3", "_t4")
SECOND_TEACHERS = tuple(f"{kind}{sfx}" for sfx in TEACHER_SUFFIXES
                        for kind in ("teacher_big", "teacher_same_big"))
SAME_TOKENIZER_TEACHERS = ("teacher_weak", "teacher_same_big",
                           *(t for t in SECOND_TEACHERS if t.startswith("teacher_same_big")))
BIG_TEACHERS = ("teacher_big", "teacher_same_big", *SECOND_TEACHERS)


# a big teacher of another budget, ``teacher_big_s<steps>[_t<k>]`` (cross-tokenizer) or
# ``teacher_same_big_s<steps>[_t<k>]`` (the student's tokenizer): the big teacher's size and data,
# ``<steps>`` CE steps, training seed k - 1 (0 without ``_t<k>``)
_BUDGET_TEACHER = re.compile(r"^(teacher_big|teacher_same_big)_s([1-9][0-9]*)(?:_t([234]))?$")


def budget_teacher(name: str) -> tuple[int, int] | None:
    """(steps, training seed) of a budget teacher's name, else ``None``."""
    m = _BUDGET_TEACHER.match(name)
    return (int(m.group(2)), int(m.group(3) or 1) - 1) if m else None


def same_tokenizer(name: str) -> bool:
    """Whether the prepared teacher ``name`` reads the student's tokenizer."""
    return name in SAME_TOKENIZER_TEACHERS or (budget_teacher(name) is not None
                                               and name.startswith("teacher_same_big_s"))


def teacher_size(cfg: "PrepConfig", name: str) -> tuple[int, int, int]:
    """(layers, hidden, steps) of a prepared teacher: the big ones share the big settings (a
    budget teacher its own steps)."""
    budget = budget_teacher(name)
    if budget is not None:
        return cfg.big_layers, cfg.big_hidden, budget[0]
    if name in BIG_TEACHERS:
        return cfg.big_layers, cfg.big_hidden, cfg.big_steps
    return cfg.weak_layers, cfg.weak_hidden, cfg.weak_steps


def teacher_seed(name: str) -> int:
    """The training seed of a prepared teacher: 0, or k - 1 for a further one (``..._t<k>``)."""
    budget = budget_teacher(name)
    if budget is not None:
        return budget[1]
    return int(name.rsplit("_t", 1)[1]) - 1 if name in SECOND_TEACHERS else 0


def prepare_all(root: str | Path, cfg: PrepConfig = PrepConfig(), log=say,
                teachers=TEACHERS, watch: Watch = Watch(), jobs: int = 1) -> dict:
    """Everything the arms need (cached under ``root/<key>``); returns ``assets.json``'s content.

    ``teachers`` names the teachers to have ready (``--short`` needs only ``teacher_big``); one that
    a later call asks for is trained then and added to the manifest, ``jobs`` of them at a time
    (each a trainer child process on ``cfg.threads`` threads). A teacher's trainer run is
    watched (progress lines, stall detection: :mod:`toyq.runner`); one that fails
    raises :class:`~toyq.runner.RunFailed` naming its log.
    """
    root = Path(root).resolve() / cache_key(cfg)  # the manifest's paths work from any cwd
    manifest = root / "assets.json"
    if manifest.exists():
        assets = json.loads(manifest.read_text())
    else:
        assets = _prepare_base(root, cfg, log)
    missing = [name for name in teachers if name not in assets]
    to_train = []
    for name in missing:
        reused = reusable_teacher(root, assets, name, _teacher_tokenizer(assets, name))
        if reused:
            assets[name] = reused
            log(f"[prepare] {name}: reusing {reused['model']} (same teacher settings, corpus "
                f"and tokenizer; held-out accuracy {reused['accuracy']:.3f})")
        else:
            to_train.append(name)
    failure = _train_all(root, assets, to_train, cfg, log, watch, jobs)
    if missing or not manifest.exists():       # the teachers that finished are kept either way
        manifest.write_text(json.dumps(assets, indent=1))
    if failure is not None:
        raise failure
    return assets


def _train_all(root: Path, assets: dict, names: list[str], cfg: PrepConfig, log, watch: Watch,
               jobs: int) -> BaseException | None:
    """Train ``names`` ``jobs`` at a time into ``assets`` (the threads only wait on trainer
    children); the first failure (or Ctrl-C) stops the runs in flight and starts no other, and
    is returned (raised for Ctrl-C) after the finished ones are in ``assets``."""
    cancel, failure = threading.Event(), None
    pool = ThreadPoolExecutor(max(1, min(jobs, len(names) or 1)))
    try:
        futures = {pool.submit(_train_one, root, assets, n, cfg, log, watch, cancel): n
                   for n in names}
        for future in as_completed(futures):
            try:
                result = future.result()
            except Exception as exc:    # noqa: BLE001 - the first one is raised by the caller
                failure = failure or exc
                continue
            if result is not None:
                assets[futures[future]], assets["timings"][futures[future]] = result
    except BaseException:
        cancel.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return failure


def _teacher_tokenizer(assets: dict, name: str) -> str:
    return assets["tok_student"] if same_tokenizer(name) else assets["tok_teacher"]


def _train_one(root: Path, assets: dict, name: str, cfg: PrepConfig, log, watch: Watch,
               cancel: threading.Event) -> tuple[dict, float] | None:
    """Train one teacher of ``prepare_all``; returns its manifest entry and seconds taken, or
    ``None`` when an earlier failure set ``cancel`` before it started. Its own failure sets
    ``cancel`` (here, so that no queued teacher starts in between) and is raised."""
    if cancel.is_set():
        return None
    layers, hidden, steps = teacher_size(cfg, name)
    t1 = time.perf_counter()
    try:
        entry = train_teacher(root / name, _teacher_tokenizer(assets, name), assets["corpus"],
                              layers, hidden, steps, cfg, log=log, watch=watch,
                              seed=teacher_seed(name), cancel=cancel)
    except BaseException:
        cancel.set()
        raise
    took = time.perf_counter() - t1
    log(f"[prepare] {name}: held-out accuracy {entry['accuracy']:.3f}, "
        f"bpb {entry['bpb']:.3f} ({took:.0f}s)")
    return entry, took


# task fields that only change the student's distillation corpus, not what a teacher trains on
STUDENT_ONLY = ("student_pairs", "answer_noise")


def _teacher_side(prep: dict) -> dict:
    task_cfg = {k: v for k, v in prep["task"].items() if k not in STUDENT_ONLY
                and not (k in OPTIONAL and not v)}   # an option at its default = absent
    return {**prep, "task": task_cfg}


def _same_file(a: Path, b: Path) -> bool:
    return a.is_file() and b.is_file() and a.read_bytes() == b.read_bytes()


def reusable_teacher(root: Path, assets: dict, name: str, tok: str) -> dict | None:
    """The ``name`` entry of a sibling cache (``root.parent/*``) prepared with the same
    teacher-side settings, whose teacher corpus and tokenizer files are byte-identical to this
    cache's (preparations that differ only in the student's corpus share their teachers)."""
    mine = Path(tok)
    for manifest in sorted(root.parent.glob("*/assets.json")):
        other = json.loads(manifest.read_text())
        if manifest.parent == root or name not in other:
            continue
        if _teacher_side(other["prep"]) != _teacher_side(assets["prep"]):
            continue
        other_tok = Path(other["tok_student"] if same_tokenizer(name)
                         else other["tok_teacher"])
        corpus = ("corpus", "teacher.jsonl")
        if (_same_file(mine / "tokenizer.json", other_tok / "tokenizer.json")
                and _same_file(root.joinpath(*corpus), manifest.parent.joinpath(*corpus))
                and Path(other[name]["model"], "config.json").exists()):
            return other[name]
    return None


def _prepare_base(root: Path, cfg: PrepConfig, log) -> dict:
    """Corpora, both tokenizers and the projections (no teachers)."""
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    corpus = prepare_corpora(root, cfg)
    texts = corpus.pop("tokenizer_texts")
    texts += [task.problem(a, b) for a, b in task.split_pairs(cfg.task)[0][:2000].tolist()]
    tok_t = str(toks.train_teacher_tokenizer(root / "tok_teacher", texts))
    tok_s = str(toks.train_student_tokenizer(root / "tok_student", texts))
    _check_tokenizers(tok_s, tok_t)
    projections = build_projections(root, tok_s, tok_t, corpus["student_jsonl"])
    log(f"[prepare] corpora, tokenizers and projections in {time.perf_counter() - t0:.0f}s "
        f"under {root}")
    return {"root": str(root), "prep": asdict(cfg), "corpus": corpus, "tok_teacher": tok_t,
            "tok_student": tok_s, "projections": projections,
            "timings": {"base": time.perf_counter() - t0}}


PROMPT_POOLS = ("student", "train")


def prompts_file(assets: dict, pool: str = "student") -> str:
    """The on-policy prompts, written on first use (caches prepared before they existed work):
    ``student`` = the problems with labels in the student's corpus
    (``<root>/corpus/prompts.jsonl``); ``train`` = every training problem, the labeled ones and
    the unlabeled pool the teachers trained on (``prompts_train.jsonl``)."""
    if pool not in PROMPT_POOLS:
        raise ValueError(f"prompt pool {pool!r}: expected one of {', '.join(PROMPT_POOLS)}")
    name = "prompts.jsonl" if pool == "student" else "prompts_train.jsonl"
    path = Path(assets["root"]) / "corpus" / name
    if not path.exists():
        cfg = task.TaskConfig(**assets["prep"]["task"])
        train = task.split_pairs(cfg)[0]
        pairs = task.student_side(train, cfg) if pool == "student" else train
        rows = [json.dumps({"prompt": task.prompt(int(a), int(b))}) + "\n" for a, b in pairs]
        path.write_text("".join(rows), encoding="utf-8")
    return str(path)


def _check_tokenizers(tok_s: str, tok_t: str) -> None:
    from xdistill.tokenization import load_tokenizer

    bad = toks.check_whole_numbers(load_tokenizer(tok_s))
    if bad:
        raise RuntimeError(f"student tokenizer splits {len(bad)} numbers, e.g. {bad[:5]}")
    bad = toks.check_split_digits(load_tokenizer(tok_t))
    if bad:
        raise RuntimeError(f"teacher tokenizer merges digits, e.g. {bad[:5]}")
