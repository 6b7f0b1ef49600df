"""Report of ``benchmarks/real/distill.py``: the generated block of RESULTS.md and curves.png.

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
    if "ce" not in summary:
        return []
    ce_m, ce_s = summary["ce"]["bpb"]
    lines = []
    for arm, s in summary.items():
        if arm == "ce":
            continue
        m, sd = s["bpb"]
        gain = ce_m - m
        scale = max(ce_s, sd)
        units = f"{gain / scale:+.1f} std" if scale == scale and scale > 0 else "no std"
        better = sum(s["per_seed"][k] < summary["ce"]["per_seed"].get(k, float("inf"))
                     for k in s["per_seed"])
        verdict = "beats CE by > 2 std" if scale == scale and gain > 2 * scale else "does not beat CE by > 2 std"
        lines.append(f"- `{arm}`: held-out bpb {gain:+.4f} vs CE ({units}; lower on {better}/"
                     f"{len(s['per_seed'])} seeds): {verdict}")
    return lines


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
    lines += ["", "Against CE only (gain in bits per byte, in units of the larger std):", ""]
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
    folder.mkdir(parents=True, exist_ok=True)
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
