"""Report of ``benchmarks/real/distill.py``: results.json, the generated block of RESULTS.md and
curves.png.

    python benchmarks/real/distill_report.py benchmarks/real/<folder>/results.json   # regenerate

The block between ``<!-- GENERATED -->`` and ``<!-- /GENERATED -->`` is rewritten; the hand-written
discussion around it is kept.
"""

from __future__ import annotations

import functools
import importlib.util
import statistics
import sys
from pathlib import Path

BEGIN, END = "<!-- GENERATED -->", "<!-- /GENERATED -->"
# Welch / paired t / Holm: the quality harness's helpers (self-contained), loaded by file path: this
# script's folder and benchmarks/quality are separate script folders, and nothing edits sys.path
STATS_PY = Path(__file__).resolve().parents[1] / "quality" / "toyq" / "stats.py"
ARMS_PY = Path(__file__).resolve().parent / "onpolicy_arms.py"   # the on-policy arms, loaded alike
ARM_TEXT = {"ce": "CE only on the slice", "pkl": "P-KL to the adapted Gemma (multitoken "
            "projection, top-4) + CE, weight 1 each", "alm": "ALM to the adapted Gemma, no CE "
            "(tokenkit's weighting)", "multi": "P-KL to the adapted Gemma + forward KL to stock "
            "SmolLM2 (same tokenizer) + CE, weight 1 each",
            "ce_ls": "CE + label smoothing (eps tuned on validation)",
            "pkl_stock": "P-KL to the *stock* Gemma (not adapted) + CE",
            "self_kl": "CE + forward KL to the stock student only (a soft target, nothing new)",
            "op_k1": "on-policy k1 to the adapted Gemma (the student's samples of slice prompts; "
            "as many student tokens as an off-policy arm)",
            "op_k1_byte_mean_clip": "on-policy k1 with byte-level credit, the mean advantage "
            "baseline and the advantage clamped to 2 nats, otherwise as `op_k1`"}
SAMPLE_KEYS = ("teacher_bpb_on_samples", "repetition")
# texts scored once at the end of a run (reported, not tested), with their column titles
FINAL_COLUMNS = (("other_play", "other-play bpb"), ("ood", "out-of-domain bpb"))
TEACHER_FIGURE = "bpb gemma3-270m adapted (teacher)"


@functools.cache
def _module(name: str, path: Path):
    """The script module at ``path`` as ``name`` (loaded once)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _stats():
    """``benchmarks/quality/toyq/stats.py`` as a module."""
    return _module("toyq_stats", STATS_PY)


def _onpolicy_arms() -> tuple[str, ...]:
    """The on-policy arms of ``onpolicy_arms.py``, the protocol's single list of them."""
    return _module("real_onpolicy_arms", ARMS_PY).ONPOLICY_ARMS


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
        for key, _ in FINAL_COLUMNS:
            if all(key in r.get("final", {}) for r in runs.values()):
                out[arm][key] = _ms([r["final"][key] for r in runs.values()])
        if all("samples" in r for r in runs.values()):
            for key in SAMPLE_KEYS:
                out[arm][key] = _ms([r["samples"][key] for r in runs.values()])
                out[arm][f"per_seed_{key}"] = {s: r["samples"][key] for s, r in runs.items()}
    return out


def gain_lines(summary: dict) -> list[str]:
    """Every arm against CE only on held-out bits per byte (lower is better): Welch and paired t
    over seeds, both Holm-adjusted over all the arm-vs-CE comparisons of this table."""
    compare, format_comparisons = _stats().compare, _stats().format_comparisons
    if "ce" not in summary:
        return []
    arms = [arm for arm in summary if arm != "ce" and arm not in _onpolicy_arms()]  # family C
    if not arms:
        return []
    per_seed = {arm: s["per_seed"] for arm, s in summary.items()}
    rows = compare(per_seed, [(arm, "ce") for arm in arms], higher_is_better=False)
    return format_comparisons(rows, "bits/byte").rstrip("\n").split("\n")


# the protocol's family B (PROTOCOL.md): is a gain the teacher's? (arm, against)
CONTROL_PAIRS = (("pkl", "ce_ls"), ("pkl", "pkl_stock"), ("pkl", "self_kl"), ("multi", "pkl"))


def gap_lines(summary: dict, figures: dict) -> list[str]:
    """The share of the CE-only -> teacher gap (held-out bits per byte) that each teacher arm
    closes: (CE - arm) / (CE - teacher), from the seed means; undefined unless the teacher leads."""
    if "ce" not in summary or TEACHER_FIGURE not in figures:
        return []
    ce, teacher = summary["ce"]["bpb"][0], figures[TEACHER_FIGURE]
    head = (f"Gap closed (PROTOCOL.md goal >= 50%): CE only {ce:.4f}, teacher {teacher:.4f} "
            f"held-out bits per byte")
    if ce - teacher <= 0:
        return ["", head + ": the teacher does not lead CE only, so no gap is defined."]
    arms = [a for a in ("pkl", "pkl_stock", "multi", "alm", *_onpolicy_arms()) if a in summary]
    return ["", head + f" (gap {ce - teacher:.4f}):", ""] + [
        f"- `{a}`: {(ce - summary[a]['bpb'][0]) / (ce - teacher):.0%}" for a in arms]


def control_lines(summary: dict) -> list[str]:
    """Family B: the teacher arms against the controls, Holm-adjusted over the pairs present."""
    compare, format_comparisons = _stats().compare, _stats().format_comparisons
    pairs = [(a, b) for a, b in CONTROL_PAIRS if a in summary and b in summary]
    if not pairs:
        return []
    per_seed = {arm: s["per_seed"] for arm, s in summary.items()}
    rows = compare(per_seed, pairs, higher_is_better=False, shared_seeds=True)
    return ["", "Is it the teacher? (PROTOCOL.md family B; gain = lower held-out bits per byte "
            "than the second arm, Holm over these comparisons):", "",
            *format_comparisons(rows, "bits/byte").rstrip("\n").split("\n")]


def onpolicy_lines(summary: dict, vs_pkl_on_samples: bool = False) -> list[str]:
    """Family C (PROTOCOL.md, amendment 1): on-policy against off-policy P-KL at equal student
    tokens on test bits per byte, and every teacher arm against CE only on the teacher's bits per
    byte on the student's samples (amendment 4, ``vs_pkl_on_samples``: and each on-policy arm
    against P-KL there); Holm over the comparisons of each measure."""
    compare, format_comparisons = _stats().compare, _stats().format_comparisons
    ops = [arm for arm in _onpolicy_arms() if arm in summary]
    if not ops or "pkl" not in summary:
        return []
    per_seed = {arm: s["per_seed"] for arm, s in summary.items()}
    rows = compare(per_seed, [(arm, "pkl") for arm in ops], higher_is_better=False,
                   shared_seeds=True)
    lines = ["", "On-policy (amendment 1, family C): against P-KL at equal student tokens, test "
             "bits per byte:", "", *format_comparisons(rows, "bits/byte").rstrip("\n").split("\n")]
    key = "per_seed_teacher_bpb_on_samples"
    if "ce" in summary and all(key in summary[a] for a in [*ops, "pkl", "ce"]):
        per_seed = {arm: summary[arm][key] for arm in [*ops, "pkl", "ce"]}
        pairs = [(arm, "ce") for arm in [*ops, "pkl"]]
        pairs += [(arm, "pkl") for arm in ops] if vs_pkl_on_samples else []
        rows = compare(per_seed, pairs, higher_is_better=False, shared_seeds=True)
        against = "CE only and P-KL" if vs_pkl_on_samples else "CE only"
        lines += ["", "The teacher's bits per byte on the student's samples of test prompts "
                  f"(the on-policy objective), against {against}:", "",
                  *format_comparisons(rows, "teacher bits/byte").rstrip("\n").split("\n")]
    return lines


def data_lines(meta: dict) -> list[str]:
    """The data paragraph: the protocol's own (``meta["data_text"]``) or the first recipe's."""
    if "data_text" in meta:
        return [meta["data_text"], ""]
    a = meta["args"]
    return [f"Data: domain {meta['data']['domain_kb']:.0f} KB (five plays), student slice "
            f"{meta['data']['slice_kb']:.0f} KB, held-out *The Tempest* "
            f"({meta['data']['heldout_kb']:.0f} KB; bits per byte on its first {a['eval_batches']} "
            f"x 4 x 128 tokens, agreement on its first {a['agree_passages']} passages). Student: "
            f"{a['steps']} steps of {a['batch']} x {a['seq_len']} tokens, lr {a['lr']}, cosine; "
            f"teacher adaptation: {a['teacher_steps']} steps of {a['batch']} x "
            f"{a['teacher_seq_len']} Gemma tokens, lr {a['teacher_lr']}.", ""]


def block(results: dict, meta: dict) -> str:
    summary = summarise(results)
    lines = [BEGIN, "", f"Command: `{meta['command']}`  ", f"Hardware: {meta['hardware']}; wall "
             f"time {meta['wall_s'] / 60:.0f} min (teacher adaptation included unless cached).", "",
             *data_lines(meta), "Starting figures (held-out):", ""]
    lines += [f"- {k}: {v:.4f}" for k, v in meta["start"]["figures"].items()]
    finals = [(k, title) for k, title in FINAL_COLUMNS if all(k in s for s in summary.values())]
    smp = all(SAMPLE_KEYS[0] in s for s in summary.values())
    lines += ["", "| arm | what | held-out bpb (mean ± std) | teacher agreement | "
              + "".join(f"{title} | " for _, title in finals)
              + ("teacher bpb on samples | 4-gram repetition | " if smp else "") + "seeds | s/run |",
              "|---|---|---|---|" + "---|" * len(finals) + ("---|---|" if smp else "")
              + "---|---|"]
    for arm, s in summary.items():
        (bm, bs), (am, as_) = s["bpb"], s["agree"]
        extra = "".join(f"{s[k][0]:.4f} ± {s[k][1]:.4f} | " for k, _ in finals)
        if smp:
            extra += " | ".join(f"{s[k][0]:.4f} ± {s[k][1]:.4f}" for k in SAMPLE_KEYS) + " | "
        lines.append(f"| `{arm}` | {ARM_TEXT.get(arm, arm)} | {bm:.4f} ± {bs:.4f} | {am:.4f} ± "
                     f"{as_:.4f} | {extra}{s['seeds']} | {s['seconds']:.0f} |")
    lines += ["", "Against CE only (gain = lower held-out bits per byte; Welch and paired t over "
              "seeds, each Holm-adjusted over the comparisons below; raw per-seed values in "
              "`results.json` beside this file):", ""]
    lines += (gain_lines(summary) + gap_lines(summary, meta["start"]["figures"])
              + control_lines(summary)
              + onpolicy_lines(summary, meta.get("vs_pkl_on_samples", False))
              + ["", "![curves](curves.png)", "", END])
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
