"""Audit a projection: coverage by token category and source, example rows, row entropy, a plot.

Token categories of the *student* vocabulary (exclusive; the first that applies wins):

``special``   role token or a text token with no bytes;
``byte``      bytes that are not valid UTF-8 on their own (byte fallback ``<0xNN>``, half a character)
              or only control characters (``\\x00``);
``whitespace`` only whitespace (spaces, tabs, newlines, indentation runs);
``numeral``   digits, optionally with surrounding whitespace (``" 123"``);
``punct``     only punctuation and math/currency/modifier symbols (``.``, ``",``, ``),``, ``€``),
              optionally with whitespace, and none of the code-only characters
              ``{}<>=_\\#$@`|~^``;
``code``      contains a programming character (``{}[]()<>;=_\\#$@`|~^*``) or is indentation followed
              by text;
``non-ascii`` other valid UTF-8 with a non-ASCII character (CJK, accents, emoji);
``word``      everything else (ASCII words and word pieces).

Row sources (how the row was filled) are stored in the artifact: exact, multitoken, corpus, role,
unmapped. Row entropy is ``H(s) = -sum_t W[s,t] log2 W[s,t]`` in bits (0 for a one-hot row, at most
``log2(top_k)``).

Legend: ``Vs``/``Vt`` vocabularies.
"""

from __future__ import annotations

import unicodedata

import numpy as np

from xdistill.projection.artifact import (
    SOURCE_CORPUS, SOURCE_EXACT, SOURCE_MULTITOKEN, SOURCE_NAMES, SOURCE_ROLE, SOURCE_UNMAPPED, Projection)
from xdistill.tokenization.table import ROLE_NAMES, ROLE_TEXT, TokenByteTable

CATEGORIES = ("special", "byte", "whitespace", "numeral", "punct", "code", "non-ascii", "word")
_CODE_CHARS = set("{}[]()<>;=_\\#$@`|~^*")
_CODE_ONLY = set("{}<>=_\\#$@`|~^")  # punctuation-only tokens with one of these count as code
# what "whitespace" strips: Python's whitespace minus the C0 information separators FS/GS/RS/US
# (U+001C-U+001F: control characters, not White_Space, so they stay "byte" tokens like ESC)
_WHITESPACE = "".join(ch for ch in map(chr, range(0x3001)) if ch.isspace() and not "\x1c" <= ch <= "\x1f")


def categorize(data: bytes, role: int) -> str:
    """Category of one token's bytes (see the module docstring)."""
    if role != ROLE_TEXT or not data:
        return "special"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "byte"
    core = text.strip(_WHITESPACE)
    if not core:
        return "whitespace"
    if all(unicodedata.category(ch)[0] == "C" for ch in core):
        return "byte"  # control/format characters: the byte tokens of byte-BPE and <0xNN>
    if core.isdigit():
        return "numeral"
    if all(_punct_like(ch) for ch in core) and not (set(core) & _CODE_ONLY):
        return "punct"
    if set(core) & _CODE_CHARS or (text[:2] in ("  ", "\t\t") or text.startswith("\t")):
        return "code"
    if any(ord(ch) > 127 for ch in core):
        return "non-ascii"
    return "word"


def _punct_like(ch: str) -> bool:
    """Punctuation, or a math / currency / modifier symbol; other symbols (So: emoji, ``©``)
    are not punctuation (``non-ascii``)."""
    cat = unicodedata.category(ch)
    return cat[0] == "P" or cat in ("Sm", "Sc", "Sk")


def categories_V(table: TokenByteTable) -> np.ndarray:
    """Category index (into :data:`CATEGORIES`) of every token (int8 ``[V]``)."""
    index = {name: i for i, name in enumerate(CATEGORIES)}
    roles = table.roles_V
    return np.fromiter((index[categorize(table.token_bytes(i), int(roles[i]))]
                        for i in range(table.vocab_size)), dtype=np.int8, count=table.vocab_size)


def row_entropy_bits(proj: Projection) -> np.ndarray:
    """Entropy in bits of every row (NaN for empty rows), float64 ``[Vs]``."""
    m = proj.proj_VsVt
    w = m.data.astype(np.float64)
    terms = np.where(w > 0, -w * np.log2(np.where(w > 0, w, 1.0)), 0.0)
    rows = np.repeat(np.arange(m.shape[0]), np.diff(m.indptr))
    ent = np.bincount(rows, weights=terms, minlength=m.shape[0])
    ent[np.diff(m.indptr) == 0] = np.nan
    return ent


def coverage_table(proj: Projection, cat_Vs: np.ndarray) -> dict[str, dict[str, int]]:
    """``{category: {source: count, ..., "total": n}}`` over the student vocabulary."""
    out = {}
    for ci, cname in enumerate(CATEGORIES):
        mask = cat_Vs == ci
        row = {SOURCE_NAMES[s]: int(np.sum(proj.row_source_Vs[mask] == s)) for s in sorted(SOURCE_NAMES)}
        row["total"] = int(mask.sum())
        out[cname] = row
    return out


def show_bytes(data: bytes) -> str:
    """Printable, escaped form of a token's bytes: ``' hello'``, ``'\\n'``, ``'\\xe4'``."""
    text = data.decode("utf-8", "backslashreplace")
    text = "".join(ch if ch.isprintable() or ch == " " else
                   {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(ch, f"\\x{ord(ch):02x}") if ord(ch) < 256
                   else f"\\u{ord(ch):04x}" for ch in text)
    return "'" + text + "'"


def format_row(proj: Projection, s: int, s_table: TokenByteTable, t_table: TokenByteTable) -> str:
    """``' 123' [multitoken] -> ' '(220) 0.909, '1'(16) 0.091``-style line."""
    src = SOURCE_NAMES[int(proj.row_source_Vs[s])]
    items = sorted(proj.row(s).items(), key=lambda kv: (-kv[1], kv[0]))
    rhs = ", ".join(f"{_label(t_table, t)}({t}) {w:.3f}" for t, w in items) or "-"
    return f"{s:>7} {_label(s_table, s):<24} [{src}] -> {rhs}"


def _label(table: TokenByteTable, i: int) -> str:
    """Escaped bytes of a text token, ``<role>`` for a role token."""
    role = int(table.roles_V[i])
    return show_bytes(table.token_bytes(i)) if role == ROLE_TEXT else f"<{ROLE_NAMES[role]}>"


def example_rows(cat_Vs: np.ndarray, category: int, source_Vs: np.ndarray, n: int = 3) -> np.ndarray:
    """Up to ``n`` ids of a category: one per row source first (corpus, multitoken, exact, role,
    unmapped; the middle id of each), then ids spread evenly over the category (deterministic)."""
    ids = np.flatnonzero(cat_Vs == category)
    picks: list[int] = []
    for src in (SOURCE_CORPUS, SOURCE_MULTITOKEN, SOURCE_EXACT, SOURCE_ROLE, SOURCE_UNMAPPED):
        of_src = ids[source_Vs[ids] == src]
        if of_src.size:
            picks.append(int(of_src[of_src.size // 2]))
    for i in ids[np.linspace(0, ids.size - 1, min(n, ids.size)).round().astype(np.int64)] if ids.size else []:
        if int(i) not in picks:
            picks.append(int(i))
    return np.array(sorted(picks[:n]), dtype=np.int64)


def entropy_histogram(ent_Vs: np.ndarray, top_k: int, width: int = 40) -> list[str]:
    """Text histogram of row entropies (mapped rows only), bins of 0.25 bit up to log2(top_k)."""
    ent = ent_Vs[~np.isnan(ent_Vs)]
    hi = max(0.25, float(np.log2(max(top_k, 2))))
    edges = np.concatenate([[0.0, 1e-9], np.arange(0.25, hi + 0.25, 0.25)])
    counts, _ = np.histogram(np.clip(ent, 0.0, hi), bins=edges)
    peak = max(1, int(counts.max(initial=0)))
    lines = []
    for i, c in enumerate(counts):
        label = "0 (one-hot)" if i == 0 else f"{edges[i]:.2f}-{edges[i + 1]:.2f}"
        lines.append(f"  {label:>12} {int(c):>8} {'#' * int(round(width * c / peak))}")
    return lines


def format_report(proj: Projection, s_table: TokenByteTable, t_table: TokenByteTable,
                  n_examples: int = 3) -> str:
    """The text report of ``xdistill projection inspect``."""
    meta = proj.meta
    cat_Vs = categories_V(s_table)
    cov = coverage_table(proj, cat_Vs)
    sources = [SOURCE_NAMES[s] for s in sorted(SOURCE_NAMES)]
    lines = [f"projection {meta.get('student', {}).get('name')} -> {meta.get('teacher', {}).get('name')}"
             f"  shape {proj.shape}  nnz {proj.proj_VsVt.nnz}  methods {','.join(meta.get('methods', []))}"
             f"  top-k {meta.get('top_k')}  direction {meta.get('direction')}", "",
             "coverage by student-token category (rows by source):",
             f"  {'category':<11}" + "".join(f"{s:>11}" for s in sources) + f"{'total':>9}{'mapped%':>9}"]
    for cname, row in cov.items():
        mapped = row["total"] - row["unmapped"]
        pct = 100.0 * mapped / row["total"] if row["total"] else 0.0
        lines.append(f"  {cname:<11}" + "".join(f"{row[s]:>11}" for s in sources)
                     + f"{row['total']:>9}{pct:>8.1f}%")
    total = proj.row_source_Vs.size
    mapped = int(np.sum(proj.row_source_Vs != SOURCE_UNMAPPED))
    lines += [f"  {'all':<11}" + "".join(f"{int(np.sum(proj.row_source_Vs == s)):>11}" for s in sorted(SOURCE_NAMES))
              + f"{total:>9}{100.0 * mapped / max(1, total):>8.1f}%", "", "example rows:"]
    for ci, cname in enumerate(CATEGORIES):
        ids = example_rows(cat_Vs, ci, proj.row_source_Vs, n_examples)
        if ids.size:
            lines.append(f"  {cname}:")
            lines += ["    " + format_row(proj, int(s), s_table, t_table) for s in ids]
    lines += ["", "row entropy (bits, mapped rows):"]
    lines += entropy_histogram(row_entropy_bits(proj), int(meta.get("top_k") or 4))
    return "\n".join(lines)
