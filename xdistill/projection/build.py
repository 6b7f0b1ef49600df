"""Compose projection methods, keep the top-k per row, renormalise: the build orchestration.

Composition (``methods`` is an ordered list, e.g. ``corpus,multitoken,exact``):

1. the non-exact methods fill rows in order of precedence: a row takes the (row-normalised)
   weights of the *first* listed method that maps it (``corpus,multitoken`` = corpus rows, and
   multitoken rows for tokens the corpus never saw);
2. role tokens (bos/eos/pad/unk) are mapped by role (:func:`methods.role_pairs`) whatever the list;
3. ``exact``, wherever it appears in the list, *pins*: a student token whose bytes equal a teacher
   token's gets the one-hot row ``W[s,t] = 1``. (NeMo-RL re-pins 1.0 and then renormalises, which
   leaves exact rows with weight below 1 next to other entries; here, pinned rows are exactly
   one-hot, so every exact pair is exactly 1.)
4. each row keeps its ``top_k`` largest weights (ties broken by the smaller teacher id) and is
   renormalised to sum to 1 (float64, then stored as float32). Unmapped rows stay empty.

Everything is done on sparse triplets: memory is proportional to the non-zeros, never ``Vs x Vt``.
The result is deterministic: only stable sorts and sequential sums.

Legend: ``Vs``/``Vt`` vocabularies, ``N`` non-zeros.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import scipy.sparse as sp
from tqdm import tqdm

import xdistill
from xdistill.errors import ProjectionError
from xdistill.projection import methods as M
from xdistill.projection.artifact import (
    DIRECTION, FORMAT, FORMAT_VERSION, SOURCE_CORPUS, SOURCE_EXACT, SOURCE_MULTITOKEN,
    SOURCE_NAMES, SOURCE_ROLE, SOURCE_UNMAPPED, Projection)
from xdistill.projection.corpus import corpus_triplets

METHODS = ("exact", "multitoken", "corpus")
_SOURCE_OF = {"multitoken": SOURCE_MULTITOKEN, "corpus": SOURCE_CORPUS}


@dataclass(frozen=True)
class BuildConfig:
    """Parameters of one build (all recorded in the sidecar)."""

    # ordered methods; see the module docstring for how they compose
    methods: tuple[str, ...] = ("multitoken", "exact")
    # weights kept per student row
    top_k: int = 4
    # multitoken piece i weighs decay**i (normalised); NeMo-RL's 0.9*0.1**i is decay=0.1
    multitoken_decay: float = 0.1
    # also add teacher tokens the student re-tokenizes into a single token
    reverse: bool = False
    # weight of each reverse entry, added before the row is renormalised
    reverse_weight: float = 1.0
    # corpus files (.arrow/.parquet/.jsonl/.txt) for the corpus method
    corpus_files: tuple[str, ...] = ()
    # stop reading the corpus after this many texts (0 = all)
    corpus_max_texts: int = 0
    # pairs seen fewer times than this are dropped from corpus rows
    corpus_min_count: int = 1
    # texts per tokenize/align batch
    batch_size: int = 256
    # extra, recorded-only details (e.g. corpus file sizes)
    extra: dict = field(default_factory=dict)


def parse_methods(spec: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``"corpus,multitoken,exact"`` -> tuple, validated (unknown or repeated names are errors)."""
    names = [m.strip() for m in (spec.split(",") if isinstance(spec, str) else spec) if m.strip()]
    if not names:
        raise ProjectionError("no projection method given; choose from " + ", ".join(METHODS))
    for name in names:
        if name not in METHODS:
            raise ProjectionError(f"unknown projection method {name!r}; choose from {', '.join(METHODS)}")
    if len(set(names)) != len(names):
        raise ProjectionError(f"projection method listed twice in {','.join(names)!r}")
    return tuple(names)


def coalesce(rows_N, cols_N, vals_N, n_cols: int):
    """Sum duplicate ``(row, col)`` entries; output sorted by row then col."""
    key = rows_N.astype(np.int64) * n_cols + cols_N.astype(np.int64)
    order = np.argsort(key, kind="stable")
    key, vals = key[order], vals_N.astype(np.float64)[order]
    if key.size == 0:
        return key, key.copy(), vals
    uniq, start = np.unique(key, return_index=True)
    return uniq // n_cols, uniq % n_cols, np.add.reduceat(vals, start)


def row_normalise(rows_N, vals_N, n_rows: int) -> np.ndarray:
    """Divide each entry by its row sum (rows must have positive sums)."""
    sums = np.bincount(rows_N, weights=vals_N, minlength=n_rows)
    return vals_N / sums[rows_N]


def top_k_renormalise(rows_N, cols_N, vals_N, n_rows: int, k: int):
    """Keep the ``k`` largest weights per row (ties: smaller column first), renormalise to 1."""
    if k < 1:
        raise ProjectionError(f"top-k must be at least 1, got {k}")
    keep_pos = vals_N > 0
    rows_N, cols_N, vals_N = rows_N[keep_pos], cols_N[keep_pos], vals_N[keep_pos]
    order = np.lexsort((cols_N, -vals_N, rows_N))
    rows_N, cols_N, vals_N = rows_N[order], cols_N[order], vals_N[order]
    counts = np.bincount(rows_N, minlength=n_rows)
    rank = np.arange(rows_N.size) - np.repeat(np.cumsum(counts) - counts, counts)
    keep = rank < k
    rows_N, cols_N, vals_N = rows_N[keep], cols_N[keep], vals_N[keep]
    vals_N = row_normalise(rows_N, vals_N, n_rows)
    order = np.lexsort((cols_N, rows_N))
    return rows_N[order], cols_N[order], vals_N[order]


def compose(n_rows: int, n_cols: int, filled: list[tuple[str, tuple]], roles: tuple,
            exact: tuple | None, k: int):
    """Combine method triplets (see the module docstring) -> CSR matrix and row sources."""
    source_Vs = np.full(n_rows, SOURCE_UNMAPPED, dtype=np.int8)
    parts = []
    for name, (r, c, v) in filled:
        r, c, v = coalesce(r, c, v, n_cols)
        pos = v > 0
        r, c, v = r[pos], c[pos], v[pos]
        if r.size == 0:
            continue
        v = row_normalise(r, v, n_rows)
        new_rows = np.zeros(n_rows, dtype=bool)
        new_rows[r] = True
        new_rows &= source_Vs == SOURCE_UNMAPPED
        source_Vs[new_rows] = _SOURCE_OF[name]
        take = new_rows[r]
        parts.append((r[take], c[take], v[take]))
    overrides = [(roles, SOURCE_ROLE)]
    if exact is not None:
        overrides.append(((exact[0], exact[1], np.ones(exact[0].size)), SOURCE_EXACT))
    for (r, c, v), code in overrides:
        if r.size == 0:
            continue
        hit = np.zeros(n_rows, dtype=bool)
        hit[r] = True
        parts = [(pr[~hit[pr]], pc[~hit[pr]], pv[~hit[pr]]) for pr, pc, pv in parts]
        source_Vs[hit] = code
        parts.append((r.astype(np.int64), c.astype(np.int64), v.astype(np.float64)))
    if parts:
        r, c, v = (np.concatenate(x) for x in zip(*parts))
    else:
        r = c = np.zeros(0, np.int64)
        v = np.zeros(0, np.float64)
    r, c, v = top_k_renormalise(r, c, v, n_rows, k)
    counts = np.bincount(r, minlength=n_rows)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    mat = sp.csr_matrix((v.astype(np.float32), c.astype(np.int32), indptr), shape=(n_rows, n_cols))
    return mat, source_Vs


def _tok_meta(tok) -> dict:
    return {"name": str(tok.name), "fingerprint": str(tok.fingerprint),
            "vocab_size": int(tok.vocab_size), "family": str(getattr(tok, "family", "?"))}


def coverage_summary(source_Vs: np.ndarray, mat: sp.csr_matrix) -> dict:
    """Counts of rows per source, mapped fraction, non-zeros and mean entries per mapped row."""
    counts = {SOURCE_NAMES[c]: int(np.sum(source_Vs == c)) for c in sorted(SOURCE_NAMES)}
    mapped = int(np.sum(source_Vs != SOURCE_UNMAPPED))
    return {"rows": counts, "mapped_rows": mapped, "mapped_fraction": round(mapped / max(1, source_Vs.size), 6),
            "nnz": int(mat.nnz), "mean_entries_per_mapped_row": round(mat.nnz / max(1, mapped), 4)}


def build_projection(student, teacher, config: BuildConfig, progress: bool = False) -> Projection:
    """Build the student->teacher projection of ``config`` (see the module docstring)."""
    methods = parse_methods(config.methods)
    if "corpus" in methods and not config.corpus_files:
        raise ProjectionError("method 'corpus' needs corpus files (--corpus FILE ...)")
    n_rows, n_cols = int(student.vocab_size), int(teacher.vocab_size)
    for label, tok in (("student", student), ("teacher", teacher)):
        if tok.table.vocab_size != tok.vocab_size:
            raise ProjectionError(f"{label} {tok.name!r}: table covers {tok.table.vocab_size} ids, "
                                  f"vocab_size is {tok.vocab_size}")
    steps = [m for m in methods if m != "exact"] + ["roles"] + (["exact"] if "exact" in methods else [])
    filled, exact = [], None
    with tqdm(total=len(steps), desc="projection", unit="step", disable=not progress) as bar:
        for step in steps:
            bar.set_postfix_str(step)
            if step == "multitoken":
                filled.append((step, M.multitoken_triplets(
                    student, teacher, decay=config.multitoken_decay, reverse=config.reverse,
                    reverse_weight=config.reverse_weight, progress=progress)))
            elif step == "corpus":
                filled.append((step, corpus_triplets(
                    student, teacher, config.corpus_files, max_texts=config.corpus_max_texts,
                    min_count=config.corpus_min_count, batch_size=config.batch_size,
                    progress=progress)))
            elif step == "roles":
                roles = M.role_pairs(student, teacher)
            else:
                exact = M.exact_pairs(student, teacher)
            bar.update(1)
    mat, source_Vs = compose(n_rows, n_cols, filled, roles, exact, config.top_k)
    params = asdict(config)
    params["methods"] = list(methods)
    params["corpus_files"] = list(config.corpus_files)
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "direction": DIRECTION,
            "rows": "student", "columns": "teacher",
            "student": _tok_meta(student), "teacher": _tok_meta(teacher),
            "methods": list(methods), "top_k": int(config.top_k), "params": params,
            "xdistill_version": xdistill.__version__,
            "coverage": coverage_summary(source_Vs, mat)}
    return Projection(mat, source_Vs, meta)
