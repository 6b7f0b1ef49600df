"""``xdistill demo distill``: Gemma-3-270M distilled into SmolLM2-135M on Shakespeare, on CPU.

The real pair (262k-token SentencePiece-style Gemma teacher, 49k-token byte-level BPE student):

1. **Texts**: *The Tempest* is held out; the other five plays are the domain; the student trains
   on a ~40 KB slice of it (every n-th passage).
2. **Teacher**: Gemma-3-270M adapted to the domain by CE through the trainer (a short
   adaptation), cached under ``$XDISTILL_ASSETS/demo/teacher-<key>`` (the key digests its
   settings: later runs with the same settings reuse it).
3. **Projection**: SmolLM2 -> Gemma, multitoken + exact, top-4 (built once, cached there too).
4. **Arms**, each from stock SmolLM2-135M with the same seed, data and order: CE only, and P-KL to
   the adapted teacher + CE.
5. **Report**: held-out bits per byte of the student before and after each arm (and of the
   teacher before and after its adaptation), and one greedy continuation of a fixed held-out
   prompt per model.

Everything runs in this process through the product's trainer, with a progress line (rate, ETA)
at least every 10 s; a failing stage ends the demo with one error naming it.
"""

from __future__ import annotations

import gc
import json
import os
import textwrap
import time
from dataclasses import asdict
from pathlib import Path

from xdistill.assets.paths import asset_dir
from xdistill.demo import real_pair as rp
from xdistill.demo.progress import Progress, format_duration, say
from xdistill.demo.settings import ARMS, EVAL_BATCH, EVAL_SEQ_LEN, HELD_OUT_TITLE, DemoSettings

# seconds per piece on the project's 2-core VM shared with another training run (README, "make
# demo"): what the start line's estimate uses; an idle machine is faster
MEASURED_S = {"teacher_step": 12.0, "ce_step": 2.3, "pkl_step": 5.4, "fixed": 30.0,
              "eval_batch": 10.0}


def estimate_s(s: DemoSettings, teacher_cached: bool) -> float:
    """The wall time of a run with settings ``s`` at the costs of ``MEASURED_S``."""
    m = MEASURED_S
    teacher = 0.0 if teacher_cached else s.teacher_steps * m["teacher_step"]
    return (teacher + s.steps * (m["ce_step"] + m["pkl_step"]) + m["fixed"]
            + m["eval_batch"] * s.eval_batches)


def run(out_dir: str = "runs/demo_distill", settings: DemoSettings = DemoSettings(), *,
        cache: str | None = None, log=say) -> dict:
    """The whole demo (module doc); prints the summary and returns it (also written to
    ``<out_dir>/summary.json``). A failing stage raises
    :class:`~xdistill.demo.progress.DemoFailed`."""
    t0, cpu0, s, load0 = time.perf_counter(), time.process_time(), settings, os.getloadavg()[0]
    out, root = Path(out_dir), Path(cache) if cache else asset_dir() / "demo"
    progress = Progress(log, error_log=out / "error.log")
    rp.quiet_loading()
    with progress.stage("texts", what=f"held out: {HELD_OUT_TITLE}; domain: the other five "
                                      f"plays; cache: {root}"):
        rp.check_assets()
        out.mkdir(parents=True, exist_ok=True)
        data = rp.prepare_texts(root, s.slice_kb)
    cached = (root / f"teacher-{rp.teacher_key(s, data)}" / "done.json").exists()
    log(f"[demo] {os.cpu_count()} cores, load average {load0:.1f}; adapted teacher "
        f"{'cached' if cached else 'not cached yet'}; about "
        f"{format_duration(estimate_s(s, cached))} (as measured on 2 shared cores)")
    teacher = rp.adapted_teacher(s, data, root, progress)
    gc.collect()
    paths = {**data, "teacher": teacher["path"], "projection": rp.projection_file(root, progress)}
    result = {"settings": asdict(s), "data": {k: v for k, v in data.items() if k.endswith("_kb")},
              "teacher": teacher, "before": rp.stock_student(s, data, progress), "arms": {},
              "prompt": data["prompt"]}
    for arm in ARMS:
        result["arms"][arm] = rp.run_arm(arm, s, paths, out, progress)
        gc.collect()
    result["seconds"] = {"total": time.perf_counter() - t0, "cpu": time.process_time() - cpu0,
                         **progress.times}
    result["load_average"] = {"start": load0, "end": os.getloadavg()[0]}
    (out / "summary.json").write_text(json.dumps(result, indent=1))
    log(format_summary(result))
    return result


def format_summary(result: dict) -> str:
    """The demo's closing report (what ``make demo`` ends with)."""
    s, t, before = result["settings"], result["teacher"], result["before"]
    rows = ["", "== xdistill demo distill: Gemma-3-270M -> SmolLM2-135M (different tokenizers) ==",
            "", f"teacher: Gemma-3-270M adapted by CE, {s['teacher_steps']} steps "
                f"({'cached' if t['cached'] else 'adapted in this run'}): held-out bits/byte "
                f"{t['stock']:.4f} -> {t['adapted']:.4f}",
            f"student: SmolLM2-135M, {s['steps']} steps per arm of {s['batch']} x "
            f"{s['seq_len']} tokens on a {result['data']['slice_kb']:.0f} KB slice, seed "
            f"{s['seed']}", "",
            f"held-out bits per byte ({HELD_OUT_TITLE}, {s['eval_batches']} x {EVAL_BATCH} x "
            f"{EVAL_SEQ_LEN} tokens; lower is better):", "",
            f"  {'arm':<6}{'before':>9}{'after':>9}{'change':>9}   what"]
    for arm, res in result["arms"].items():
        rows.append(f"  {arm:<6}{before['bpb']:>9.4f}{res['bpb']:>9.4f}"
                     f"{res['bpb'] - before['bpb']:>+9.4f}   {ARMS[arm]}")
    if {"ce", "pkl"} <= set(result["arms"]):
        gap = result["arms"]["ce"]["bpb"] - result["arms"]["pkl"]["bpb"]
        lower = "P-KL lower" if gap > 0 else "CE-only lower or equal"
        rows += ["", f"  P-KL vs CE-only: {gap:+.4f} bits/byte ({lower}); one seed, a short "
                     "run: a hint, not evidence",
                 "  (benchmarks/real/RESULTS.md: several seeds, longer runs)."]
    rows += ["", f"greedy continuations ({s['sample_tokens']} tokens) of a held-out prompt:", "",
             f"  prompt ({HELD_OUT_TITLE}):", _quoted(result["prompt"]), "",
             "  stock student:", _quoted(before["sample"])]
    for arm, res in result["arms"].items():
        rows += [f"  after {arm}:", _quoted(res["sample"])]
    times, load = result["seconds"], result["load_average"]
    stages = ", ".join(f"{k} {format_duration(v)}" for k, v in times.items()
                       if k not in ("total", "cpu"))
    rows += ["", textwrap.fill(f"time: {format_duration(times['total'])} wall, "
                               f"{format_duration(times['cpu'])} CPU (load average "
                               f"{load['start']:.1f} at the start, {load['end']:.1f} at the end): "
                               f"{stages}", 100, subsequent_indent="  ")]
    return "\n".join(rows)


def _quoted(text: str) -> str:
    """``text`` as an indented block, one ``|`` line per line (blank lines kept)."""
    return "\n".join(f"    | {line}".rstrip() for line in text.rstrip("\n").split("\n"))
