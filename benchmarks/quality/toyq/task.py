"""The task: seeded arithmetic problems with worked answers, mixed with natural text.

Problems read ``Q: 37+48=? A:85.`` (operands 0..``max_operand``; the answer follows ``A:``
without a space so that the teacher's first answer token is the leading digit -- see RESULTS.md).
Natural text is Shakespeare from the asset cache (fetched offline by ``tools/fetch_assets.py``),
split into passages; one play is held out for bits-per-byte.

Splits (all deterministic in ``seed``):

* the (a, b) pairs are shuffled once; ``n_heldout`` pairs are held out for accuracy and never
  appear in any training corpus (teacher or student);
* ``teacher`` corpus: documents of ``per_doc`` problems over all remaining pairs, plus text
  (``teacher_per_doc`` > 0: documents of that many problems instead, the same problems and the
  same text documents; 1 = every problem document ends after its answer, as rollouts do);
* ``student`` corpus: the distillation corpus (``student_pairs`` of the remaining pairs, see
  :func:`student_side`; the other training pairs are then prompts without labels), plus text;
  with ``answer_noise > 0`` that fraction of its worked answers is wrong (each occurrence
  independently: a uniformly drawn other sum), like scraped solutions; the teachers' corpus is
  always clean, so the teachers know more than the student's labels;
* ``eval_text``: passages of the held-out play (bits per byte).

With ``twin_free`` (the issue-24 protocol) whole *unordered* pairs ``{a, b}`` are assigned to one
side, so no held-out problem has its swapped twin ``b+a`` in training (with the plain shuffle most
held-out problems do), and ``n_valid`` more pairs are carved out the same way for a validation
split (:func:`split_pairs_protocol`); the test split is the held-out one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xdistill.assets.paths import asset_dir

HELDOUT_PLAY = "tempest.txt"


@dataclass(frozen=True)
class TaskConfig:
    """Size of the synthetic task."""

    # operands are drawn from 0..max_operand
    max_operand: int = 29
    # (a, b) pairs held out for the accuracy metric
    n_heldout: int = 150
    # distinct training pairs in the student's distillation corpus (0 = all non-held-out pairs)
    student_pairs: int = 0
    # problems per document
    per_doc: int = 4
    # passes over the training pairs when writing a corpus (each pass reshuffles)
    passes: int = 8
    # fraction of documents that are natural text
    text_fraction: float = 0.25
    # characters per text passage
    passage_chars: int = 240
    seed: int = 0
    # fraction of the answers in the student's distillation corpus that are wrong (drawn per
    # occurrence: uniformly among the other sums 0..2*max_operand); teachers' corpus stays clean.
    # 0.5 is the published protocol (the teacher knows more than the labels); 0 = clean answers
    answer_noise: float = 0.5
    # hold out whole unordered pairs {a, b}: a problem and its swapped twin on the same side
    twin_free: bool = False
    # twin-free validation pairs carved from the training side (0 = none; needs twin_free)
    n_valid: int = 0
    # problems per document of the teachers' corpus only (0 = per_doc); the number of text
    # documents stays that of per_doc, so the problem/text mix by bytes does not change
    teacher_per_doc: int = 0


def problem(a: int, b: int, answer: int | None = None) -> str:
    """``Q: a+b=? A:<answer>.``; ``answer`` defaults to the correct sum."""
    return f"Q: {a}+{b}=? A:{a + b if answer is None else answer}."


def noisy_answer(a: int, b: int, cfg: TaskConfig, rng: np.random.Generator) -> int:
    """The correct sum, or with probability ``cfg.answer_noise`` a uniformly drawn other sum."""
    if cfg.answer_noise <= 0 or rng.random() >= cfg.answer_noise:
        return a + b
    wrong = int(rng.integers(0, 2 * cfg.max_operand))  # 2*max_operand values besides a+b
    return wrong + (wrong >= a + b)


def prompt(a: int, b: int) -> str:
    """The part of a problem the model sees before answering."""
    return f"Q: {a}+{b}=? A:"


def shakespeare_passages(max_chars: int, heldout: bool) -> list[str]:
    """Passages of up to ``max_chars`` characters (paragraphs regrouped); held-out play or not."""
    root = asset_dir() / "corpus" / "shakespeare"
    files = sorted(root.glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"no Shakespeare text under {root}: run `python tools/fetch_assets.py`")
    out = []
    for path in files:
        if (path.name == HELDOUT_PLAY) != heldout:
            continue
        cur = ""
        for para in path.read_text(encoding="utf-8").split("\n\n"):
            para = " ".join(para.split())
            if not para:
                continue
            if cur and len(cur) + len(para) > max_chars:
                out.append(cur)
                cur = ""
            cur = f"{cur}\n{para}" if cur else para[:max_chars]
        if cur:
            out.append(cur)
    return out


def split_pairs(cfg: TaskConfig) -> tuple[np.ndarray, np.ndarray]:
    """(train pairs [N, 2], held-out pairs [n_heldout, 2]) from one seeded shuffle; with
    ``twin_free`` the train side excludes the validation pairs (:func:`split_pairs_protocol`)."""
    if cfg.twin_free:
        train, _, test = split_pairs_protocol(cfg)
        return train, test
    if cfg.n_valid:
        raise ValueError("TaskConfig.n_valid needs twin_free = True")
    m = cfg.max_operand + 1
    grid = np.stack(np.meshgrid(np.arange(m), np.arange(m), indexing="ij"), -1).reshape(-1, 2)
    perm = np.random.default_rng([cfg.seed, 1]).permutation(len(grid))
    return grid[perm[cfg.n_heldout:]], grid[perm[:cfg.n_heldout]]


def split_pairs_protocol(cfg: TaskConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, validation, test) pairs, twin-free: the unordered pairs ``{a, b}`` are shuffled
    once and dealt to test until it holds ``n_heldout`` problems, then to validation until
    ``n_valid``, the rest to train (a side may exceed its count by one twin)."""
    m = cfg.max_operand + 1
    keys = [(a, b) for a in range(m) for b in range(a, m)]
    perm = np.random.default_rng([cfg.seed, 5]).permutation(len(keys))
    sides: list[list[tuple[int, int]]] = [[], [], []]       # test, valid, train
    wants = (cfg.n_heldout, cfg.n_valid)
    for k in perm.tolist():
        a, b = keys[k]
        both = [(a, b)] if a == b else [(a, b), (b, a)]
        side = next((i for i in (0, 1) if len(sides[i]) < wants[i]), 2)
        sides[side] += both
    arr = [np.asarray(x, dtype=np.int64).reshape(-1, 2) for x in sides]
    return arr[2], arr[1], arr[0]


def student_side(train: np.ndarray, cfg: TaskConfig) -> np.ndarray:
    """The training problems with labels in the student's corpus: all of ``train``, or its first
    ``student_pairs`` (with ``twin_free``, rounded up so that a problem and its swapped twin stay
    on the same side: the rest of ``train`` is then a twin-free unlabeled prompt pool)."""
    n = cfg.student_pairs
    if not n or n >= len(train):
        return train
    a, b = map(int, train[n - 1])
    if cfg.twin_free and a != b and n < len(train) and tuple(map(int, train[n])) == (b, a):
        n += 1
    return train[:n]


def unlabeled_pairs(cfg: TaskConfig) -> np.ndarray:
    """The training problems the student's corpus has no label for (the rest of ``train`` after
    :func:`student_side`): prompts whose answer only a teacher can give. Empty unless
    ``student_pairs`` leaves some out."""
    train, _ = split_pairs(cfg)
    return train[len(student_side(train, cfg)):]


UNLABELED_HALVES = ("unlabeled_tune", "unlabeled_test")


def unlabeled_halves(cfg: TaskConfig) -> dict[str, np.ndarray]:
    """:func:`unlabeled_pairs` cut in two for the fifth protocol: ``unlabeled_tune`` (rates are
    chosen on it) and ``unlabeled_test`` (scored once, in the confirmation). In the pool's
    order, each unordered pair {a, b} (a problem with its swapped twin, or a lone problem) goes
    whole to the half with fewer problems so far (ties: the tuning half), so twins share a half
    and the halves differ by at most 2; both halves stay in the on-policy prompt pool."""
    groups: dict[frozenset, list] = {}
    for a, b in unlabeled_pairs(cfg).tolist():
        groups.setdefault(frozenset((a, b)), []).append((a, b))
    halves: tuple[list, list] = ([], [])
    for group in groups.values():
        halves[int(len(halves[1]) < len(halves[0]))].extend(group)
    return {name: np.asarray(h, dtype=np.int64).reshape(-1, 2)
            for name, h in zip(UNLABELED_HALVES, halves)}


def documents(pairs: np.ndarray, texts: list[str], cfg: TaskConfig, salt: int,
              noisy: bool = False, per_doc: int = 0) -> list[str]:
    """Problem documents (``per_doc`` problems each, default ``cfg.per_doc``; ``passes`` shuffled
    passes) + text docs, as many as ``cfg.per_doc`` problem documents call for at
    ``text_fraction``; ``noisy``: answers go through :func:`noisy_answer` (own random stream, so
    the documents' order and text are the clean corpus's)."""
    per_doc = per_doc or cfg.per_doc
    rng = np.random.default_rng([cfg.seed, salt])
    noise_rng = np.random.default_rng([cfg.seed, salt, 7])
    docs = []
    for _ in range(cfg.passes):
        order = rng.permutation(len(pairs))
        for i in range(0, len(order), per_doc):
            lines = []
            for j in order[i:i + per_doc]:
                a, b = map(int, pairs[j])
                lines.append(problem(a, b, noisy_answer(a, b, cfg, noise_rng) if noisy else None))
            docs.append("\n".join(lines))
    n_problem_docs = cfg.passes * -(-len(pairs) // cfg.per_doc)   # at cfg.per_doc
    n_text = int(round(n_problem_docs * cfg.text_fraction / max(1e-9, 1 - cfg.text_fraction)))
    if texts and n_text:
        docs += [texts[int(k) % len(texts)] for k in rng.permutation(max(n_text, 1))[:n_text]]
    return [docs[int(k)] for k in rng.permutation(len(docs))]


def write_jsonl(path: Path, docs: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    return path


def build_corpora(out: Path, cfg: TaskConfig) -> dict:
    """Write the jsonl corpora and the held-out problems; returns their paths and the pairs."""
    train, held = split_pairs(cfg)
    student = student_side(train, cfg)
    texts = shakespeare_passages(cfg.passage_chars, heldout=False)
    eval_texts = shakespeare_passages(cfg.passage_chars, heldout=True)
    paths = {
        "teacher_jsonl": write_jsonl(out / "teacher.jsonl",
                                     documents(train, texts, cfg, 2, per_doc=cfg.teacher_per_doc)),
        "student_jsonl": write_jsonl(out / "student.jsonl",
                                     documents(student, texts, cfg, 3, noisy=True)),
        "eval_text_jsonl": write_jsonl(out / "eval_text.jsonl", eval_texts[:120]),
    }
    (out / "heldout.json").write_text(json.dumps(held.tolist()), encoding="utf-8")
    extra = {}
    if cfg.twin_free and cfg.n_valid:          # the protocol's validation split (screening)
        extra["valid"] = split_pairs_protocol(cfg)[1].tolist()
    return {**{k: str(v) for k, v in paths.items()}, "heldout": held.tolist(), **extra,
            "tokenizer_texts": texts[:400]}
