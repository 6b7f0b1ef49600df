"""``xdistill plot metrics.jsonl [more.jsonl ...] -o curves.png [--keys loss,eval/bpb]``.

One panel per metric key (numeric values only), one line per input file, x axis = step.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from xdistill.commands import plain
from xdistill.errors import XDistillError
from xdistill.metrics import read_metrics

DEFAULT_KEYS = ("loss", "eval/loss", "eval/bpb", "lr", "tok_per_s")


def numeric_series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for rec in records:
        value = rec.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            steps.append(int(rec["step"]))
            values.append(float(value))
    return steps, values


def choose_keys(runs: dict[str, list[dict]], requested: list[str] | None) -> list[str]:
    present = {k for recs in runs.values() for rec in recs for k, v in rec.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "time")}
    if requested:
        missing = [k for k in requested if k not in present]
        if missing:
            raise XDistillError(f"metric(s) {', '.join(missing)} not found; "
                                f"available: {', '.join(sorted(present))}")
        return requested
    keys = [k for k in DEFAULT_KEYS if k in present]
    return keys or sorted(present)[:6]


def plot_runs(runs: dict[str, list[dict]], keys: list[str], out: Path) -> None:
    try:
        # deferred: matplotlib (optional extra `plot`)
        import matplotlib

        matplotlib.use("Agg")
        # deferred: matplotlib (optional extra `plot`)
        # deferred: matplotlib.pyplot (side effect: only after matplotlib.use("Agg"))
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise XDistillError("xdistill plot needs matplotlib (pip install 'xdistill[plot]')"
                            ) from exc

    cols = min(3, len(keys))
    rows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.4 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        for label, records in runs.items():
            steps, values = numeric_series(records, key)
            if steps:
                ax.plot(steps, values, marker="." if len(steps) < 30 else None, label=label)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(runs) > 1:
            ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    fig.tight_layout()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
    except OSError as exc:     # a folder in the way is a file, no space, no permission
        raise XDistillError(f"-o {str(out)!r}: cannot write the plot: "
                            f"{exc.strerror or exc}") from None
    finally:
        plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="xdistill plot", description=plain(__doc__))
    parser.add_argument("metrics", nargs="+",
                        help="metrics.jsonl file(s) to plot (or run folders holding one)")
    parser.add_argument("-o", "--output", required=True, help="PNG file to write")
    parser.add_argument("--keys", help="comma-separated metric keys (default: those of "
                        f"{', '.join(DEFAULT_KEYS)} the runs have)")
    args = parser.parse_args(argv)
    runs = {}
    for path in args.metrics:
        label = Path(path).parent.name or Path(path).stem
        runs[label if label not in runs else path] = read_metrics(path)
    if not any(runs.values()):
        raise XDistillError("no metric records found in " + ", ".join(args.metrics))
    keys = choose_keys(runs, args.keys.split(",") if args.keys else None)
    out = output_path(args.output)
    plot_runs(runs, keys, out)
    print(f"wrote {out} ({len(keys)} panels: {', '.join(keys)})")
    return 0


_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp")


def output_path(name: str) -> Path:
    """The file the figure goes to: ``name``, with ``.png`` added when it has no suffix (as
    matplotlib does), refused when its suffix is no image format matplotlib writes."""
    out = Path(name)
    if not out.suffix:
        return out.with_name(out.name + ".png")
    if out.suffix[1:].lower() not in _FORMATS:
        raise XDistillError(f"-o {name}: {out.suffix!r} is not an image format; use one of "
                            f"{', '.join('.' + f for f in _FORMATS)}")
    return out
