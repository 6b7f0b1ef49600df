"""The ``--plot`` figure of ``xdistill projection inspect`` (matplotlib, imported lazily).

Four panels: coverage of each student-token category stacked by row source (share of the
category, with token counts), the row-entropy histogram, the distribution of each row's largest
weight, and the number of entries per mapped row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from xdistill.errors import ProjectionError
from xdistill.projection.artifact import SOURCE_NAMES, SOURCE_UNMAPPED, Projection
from xdistill.projection.audit import CATEGORIES, categories_V, coverage_table, row_entropy_bits
from xdistill.tokenization.table import TokenByteTable

_COLORS = {"exact": "#2b8a3e", "multitoken": "#1c7ed6", "corpus": "#f59f00", "role": "#ae3ec9",
           "unmapped": "#ced4da"}


def _coverage_panel(ax, cov: dict) -> None:
    cats = [c for c in CATEGORIES if cov[c]["total"]]
    left = np.zeros(len(cats))
    y = np.arange(len(cats))
    for src in ("exact", "multitoken", "corpus", "role", "unmapped"):
        share = np.array([cov[c][src] / cov[c]["total"] for c in cats])
        ax.barh(y, share, left=left, color=_COLORS[src], label=src, edgecolor="white", linewidth=0.5)
        left += share
    for yi, c in zip(y, cats):
        mapped = 1.0 - cov[c]["unmapped"] / cov[c]["total"]
        ax.text(1.01, yi, f"{100 * mapped:.1f}%", va="center", fontsize=8)
    ax.set_yticks(y, [f"{c}  (n={cov[c]['total']:,})" for c in cats])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of student tokens in the category")
    ax.set_title("coverage by token category and row source (right: % mapped)")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, -0.32), ncol=5, fontsize=8, frameon=False)


def write_plot(proj: Projection, s_table: TokenByteTable, path: str | Path) -> Path:
    """Write the four-panel PNG (see the module docstring) to ``path``."""
    try:
        # deferred: matplotlib (optional extra `plot`)
        import matplotlib

        matplotlib.use("Agg")
        # deferred: matplotlib (optional extra `plot`)
        # deferred: matplotlib.pyplot (side effect: only after matplotlib.use("Agg"))
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - matplotlib is an optional extra
        raise ProjectionError("--plot needs matplotlib (pip install 'xdistill[plot]')") from exc
    m = proj.proj_VsVt
    mapped = proj.row_source_Vs != SOURCE_UNMAPPED
    n_Vs = np.diff(m.indptr)
    top_k = int(proj.meta.get("top_k") or max(1, n_Vs.max(initial=1)))
    ent = row_entropy_bits(proj)
    max_w = np.zeros(m.shape[0])
    nz = n_Vs > 0
    max_w[nz] = np.maximum.reduceat(m.data.astype(np.float64), m.indptr[:-1][nz])
    meta = proj.meta
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    _coverage_panel(axes[0, 0], coverage_table(proj, categories_V(s_table)))
    ax = axes[0, 1]
    ax.hist(ent[mapped & nz], bins=np.linspace(0, np.log2(max(top_k, 2)), 33), color="#1c7ed6")
    ax.set_yscale("log")
    ax.set_xlabel("row entropy (bits); 0 = one-hot")
    ax.set_ylabel("student tokens (log)")
    ax.set_title("how spread each row is")
    ax = axes[1, 0]
    ax.hist(max_w[mapped & nz], bins=np.linspace(0, 1, 41), color="#2b8a3e")
    ax.set_yscale("log")
    ax.set_xlabel("largest weight in the row")
    ax.set_ylabel("student tokens (log)")
    ax.set_title("confidence of the top teacher token")
    ax = axes[1, 1]
    counts = np.bincount(n_Vs[mapped], minlength=top_k + 1)[1:]
    ax.bar(np.arange(1, counts.size + 1), counts, color="#f59f00")
    for x, c in enumerate(counts, 1):
        ax.text(x, c, f"{int(c):,}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(np.arange(1, counts.size + 1))
    ax.set_xlabel("teacher tokens per row (after top-k)")
    ax.set_ylabel("student tokens")
    ax.set_title("entries per mapped row")
    by_src = ", ".join(f"{SOURCE_NAMES[s]} {int(np.sum(proj.row_source_Vs == s)):,}" for s in sorted(SOURCE_NAMES))
    fig.suptitle(f"{meta.get('student', {}).get('name')} ({m.shape[0]:,}) -> "
                 f"{meta.get('teacher', {}).get('name')} ({m.shape[1]:,})   methods "
                 f"{','.join(meta.get('methods', []))}, top-{top_k}\nrows: {by_src}", fontsize=11)
    fig.tight_layout()
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise ProjectionError(f"cannot write the plot {path}: {exc}") from exc
    finally:
        plt.close(fig)
    return path
