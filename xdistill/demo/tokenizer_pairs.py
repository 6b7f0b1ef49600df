"""Compare real tokenizer pairs: vocabulary overlap by bytes and by raw strings, and alignment.

Each pair tokenizes a bundled paragraph: token counts, aligned chunks, exact 1:1 pairs, coverage.

Raw-string overlap compares the tokenizers' own vocabulary strings (``Ġhello`` vs ``▁hello`` never
match); byte overlap compares the bytes each token contributes to the text (both are `` hello``).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import numpy as np

from xdistill.align import align_pair
from xdistill.tokenization import ROLE_TEXT, Tokenizer, load_tokenizer

PARAGRAPH = (Path(__file__).parent / "paragraph.txt").read_text(encoding="utf-8")
DEFAULT_NAMES = ("gpt2", "qwen2", "llama3", "mistral", "bert")


@dataclass(frozen=True)
class PairReport:
    a: str
    b: str
    raw_overlap: int
    byte_overlap: int
    tokens_a: int
    tokens_b: int
    chunks: int
    exact_pairs: int
    coverage_a: float
    coverage_b: float


def text_byte_set(tok: Tokenizer) -> set[bytes]:
    table = tok.table
    return {table.token_bytes(i) for i in np.flatnonzero(table.roles_V == ROLE_TEXT)
            if table.offsets_V1[i + 1] > table.offsets_V1[i]}


def compare_pair(a: Tokenizer, b: Tokenizer, text: str = PARAGRAPH) -> PairReport:
    raw = len(set(a.hf.get_vocab()) & set(b.hf.get_vocab()))
    byte = len(text_byte_set(a) & text_byte_set(b))
    ea, eb = a.encode(text), b.encode(text)
    res = align_pair(ea.ids, eb.ids, a.table, b.table,
                     s_phantom=ea.phantom_bytes_T(), t_phantom=eb.phantom_bytes_T())
    return PairReport(a.name, b.name, raw, byte, len(ea.ids), len(eb.ids),
                      int(res.n_chunks_B[0]), int(res.chunk_exact_BC[0].sum()),
                      float(res.s_coverage_B[0]), float(res.t_coverage_B[0]))


def format_reports(reports: list[PairReport]) -> str:
    head = (f"{'pair':<18} {'overlap raw':>11} {'by bytes':>9} {'tokens':>9} {'chunks':>6} "
            f"{'exact':>5} {'coverage':>11}")
    lines = [head, "-" * len(head)]
    for r in reports:
        lines.append(f"{r.a + ' x ' + r.b:<18} {r.raw_overlap:>11,} {r.byte_overlap:>9,} "
                     f"{f'{r.tokens_a}/{r.tokens_b}':>9} {r.chunks:>6} {r.exact_pairs:>5} "
                     f"{f'{r.coverage_a:.2f}/{r.coverage_b:.2f}':>11}")
    return "\n".join(lines)


def run(names: tuple[str, ...] = DEFAULT_NAMES) -> list[PairReport]:
    toks = {name: load_tokenizer(name) for name in names}
    return [compare_pair(toks[a], toks[b]) for a, b in combinations(names, 2)]
