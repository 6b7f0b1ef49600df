"""Report of ``benchmarks/real/distill.py``: results.json, the generated block of RESULTS.md and
curves.png.

    python benchmarks/real/distill_report.py benchmarks/real/<folder>/results.json   # regenerate

The block between ``<!-- GENERATED -->`` and ``<!-- /GENERATED -->`` is rewritten; the hand-written
discussion around it is kept.
"""

from __future__ import annotations

import statistics
from pathlib import Path

BEGIN, END = "<!-- GENERATED -->", "<!-- /GENERATED -->"
ARM_TEXT = {"ce": "CE only on the slice", "pkl": "P-KL to the adapted Gemma (multitoken "
            "projection, top-4) + CE, weight 1 each", "alm": "ALM to the adapted Gemma, no CE "
            "(tokenkit's weighting)", "multi": "P-KL to the adapted Gemma + forward KL to stock "
            "SmolLM2 (same tokenizer) + CE, weight 1 each"}


def _ms(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else float("nan"))


def summarise(results: dict) -> dict:
    out = {}
    for arm, runs in results.items():
        finals = [r["curve"][-1] for r in runs.values()]
        out[arm] = {"bpb": _ms([f["bpb"] for f in finals]), "agree": _ms([f["agree"] for f in finals]),
                    "seconds": statistics.fmean(r["seconds"] for r in runs.values()),
                    "seeds": len(finals),
                    "per_seed": {s: r["curve"][-1]["bpb"] for s, r in runs.items()}}
    return out


def gain_lines(summary: dict) -> list[str]:
    """Every arm against CE only on held-out bits per byte (lower is better): Welch and paired t
    over seeds, both Holm-adjusted over all the arm-vs-CE comparisons of this table."""
    from xdistill.quality.stats import compare, format_comparisons

    if "ce" not in summary:
        return []
    arms = [arm for arm in summary if arm != "ce"]
    if not arms:
        return []
    per_seed = {arm: s["per_seed"] for arm, s in summary.items()}
    rows = compare(per_seed, [(arm, "ce") for arm in arms], higher_is_better=False)
    return format_comparisons(rows, "bits/byte").rstrip("\n").split("\n")


def block(results: dict, meta: dict) -> str:
    summary = summarise(results)
    a = meta["args"]
    lines = [BEGIN, "", f"Command: `{meta['command']}`  ", f"Hardware: {meta['hardware']}; wall "
             f"time {meta['wall_s'] / 60:.0f} min (teacher adaptation included unless cached).", "",
             f"Data: domain {meta['data']['domain_kb']:.0f} KB (five plays), student slice "
             f"{meta['data']['slice_kb']:.0f} KB, held-out *The Tempest* ({meta['data']['heldout_kb']:.0f} KB; "
             f"bits per byte on its first {a['eval_batches']} x 4 x 128 tokens, agreement on its "
             f"first {a['agree_passages']} passages). Student: {a['steps']} steps of {a['batch']} x "
             f"{a['seq_len']} tokens, lr {a['lr']}, cosine; teacher adaptation: {a['teacher_steps']} "
             f"steps of {a['batch']} x {a['teacher_seq_len']} Gemma tokens, lr {a['teacher_lr']}.", "",
             "Starting figures (held-out):", ""]
    lines += [f"- {k}: {v:.4f}" for k, v in meta["start"]["figures"].items()]
    lines += ["", "| arm | what | held-out bpb (mean ± std) | teacher agreement | seeds | s/run |",
              "|---|---|---|---|---|---|"]
    for arm, s in summary.items():
        (bm, bs), (am, as_) = s["bpb"], s["agree"]
        lines.append(f"| `{arm}` | {ARM_TEXT.get(arm, arm)} | {bm:.4f} ± {bs:.4f} | {am:.4f} ± "
                     f"{as_:.4f} | {s['seeds']} | {s['seconds']:.0f} |")
    lines += ["", "Against CE only (gain = lower held-out bits per byte; Welch and paired t over "
              "seeds, each Holm-adjusted over the comparisons below; raw per-seed values in "
              "`results.json` beside this file):", ""]
    lines += gain_lines(summary) + ["", "![curves](curves.png)", "", END]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for arm, runs in results.items():
        curves = [r["curve"] for r in runs.values()]
        steps = [p["step"] for p in curves[0]]
        for ax, key in ((axes[0], "bpb"), (axes[1], "agree")):
            rows = [[c[i][key] for c in curves] for i in range(len(steps))]
            mean = [statistics.fmean(r) for r in rows]
            std = [statistics.stdev(r) if len(r) > 1 else 0.0 for r in rows]
            ax.plot(steps, mean, label=arm)
            ax.fill_between(steps, [m - s for m, s in zip(mean, std)],
                            [m + s for m, s in zip(mean, std)], alpha=0.2)
    axes[0].set_title("held-out bits per byte (lower is better)")
    axes[1].set_title("agreement with the teacher's greedy next token")
    for ax in axes:
        ax.set_xlabel("student step")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(results: dict, meta: dict, folder: Path) -> Path:
    """``results.json`` (the raw per-seed runs), ``curves.png`` and the generated block of
    ``RESULTS.md`` in ``folder``; the block is built from what ``results.json`` holds."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    raw = folder / "results.json"
    raw.write_text(json.dumps({"meta": meta, "runs": results}, indent=1), encoding="utf-8")
    results = json.loads(raw.read_text(encoding="utf-8"))["runs"]
    plot(results, folder / "curves.png")
    path = folder / "RESULTS.md"
    text = path.read_text(encoding="utf-8") if path.exists() else (
        "# Real models: Gemma-3-270M distilled into SmolLM2-135M\n\n" + BEGIN + "\n" + END + "\n")
    if BEGIN not in text:
        text += "\n" + BEGIN + "\n" + END + "\n"
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1] if END in rest else ""
    path.write_text(head + block(results, meta) + tail, encoding="utf-8")
    return path


def main(argv=None) -> int:
    """Regenerate a report folder's block and curves from its committed ``results.json``."""
    import argparse
    import json

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("results", help="a results.json written by benchmarks/real/distill.py")
    args = ap.parse_args(argv)
    path = Path(args.results)
    data = json.loads(path.read_text(encoding="utf-8"))
    print(write_report(data["runs"], data["meta"], path.parent))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
