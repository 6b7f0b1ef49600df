"""Where the stop goes under each teacher (exploratory diagnostic, not a pre-registered test).

    python benchmarks/quality/stop_units.py [--protocol v13] [--runs runs/q24v13]
        [--seeds 140,141,142] [--batches 10]
                    # writes credit24v13/stop_units.json, the block GENERATED:stops24v13
    python benchmarks/quality/stop_units.py --report      # the block from the record only

For the eight k1 arms of the thirteenth protocol or of the sixteenth (``--protocol v16``: the
same arms, teachers trained on one problem per document; record ``credit24v16/stop_units.json``,
block ``stops24v16``): S1-S4 same-tokenizer, X1-X4 cross-tokenizer teachers
(``unit_advantages.PROTOCOLS``):

1. **Trajectories**: the rollouts' stop fraction (share of responses that end with the student's
   stop token within ``cont_new_tokens``) at a few steps of each arm's training, read from its
   ``metrics.jsonl`` (mean over seeds).
2. **At the start**: each seed's CE student (the arms' common start) draws ``--batches`` rollout
   batches (the same rollouts for every arm), scored by each arm's teacher as in training
   (:func:`unit_advantages.score_batches`, no update). Over well-formed answers, split by how the
   response ended (``stop`` / ``length``): the raw log-ratio ``r = log q - log p`` of the answer
   unit and summed over the sample's other units (the period, the stop or what follows; the sum
   does not depend on how either tokenization cuts them), and the mean k1 advantage of the other
   units under the arm's estimator (``mean`` baseline over the batch, then its clamp).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

import unit_advantages as ua
from toyq.run import record_and_report

HERE = Path(__file__).resolve().parent
RECORD = HERE / "credit24v13" / "stop_units.json"
STEPS = (10, 20, 30, 50, 100, 500, 2000)
ARMS = ua.PROTOCOLS["v13"]["arms"]
PROTOCOLS = ("v13", "v16")


def record_path(protocol: str) -> Path:
    return HERE / ua.PROTOCOLS[protocol]["records"] / RECORD.name


def trajectory(metrics: Path) -> dict:
    """Stop fraction at each logged step of ``STEPS`` (the nearest logged step at or after it)."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "stop_fraction" in r]
    out = {}
    for step in STEPS:
        hit = next((r for r in rows if r["step"] >= step), None)
        if hit is not None:
            out[str(step)] = hit["stop_fraction"]
    return out


def by_finish(batches: list[dict], clamp: float | None) -> dict:
    """Per finish reason: samples, mean answer-unit r, mean summed r of the other units, mean
    advantage of the other units (``mean`` baseline, ``clamp``)."""
    groups: dict[str, dict[str, list]] = {}
    for batch in batches:
        adv = ua.advantages(batch, "mean", clamp)
        for text, units, a, fin in zip(batch["texts"], batch["units"], adv, batch["finish"]):
            head, dot, _ = text.partition(".")
            if len(units) < 2 or not (dot and head.strip().isdigit()):
                continue
            g = groups.setdefault(fin, {"answer_r": [], "rest_r": [], "rest_adv": []})
            g["answer_r"].append(units[0][1] - units[0][0])
            g["rest_r"].append(sum(t - s for s, t in units[1:]))
            g["rest_adv"] += a[1:]
    return {fin: {"n": len(g["answer_r"]), **{k: statistics.fmean(v) for k, v in g.items()}}
            for fin, g in groups.items()}


def measure(args) -> dict:
    from xdistill.config import load_config
    from xdistill.train.onpolicy_config import OnPolicyConfig

    proto = ua.PROTOCOLS[args.protocol]
    seeds, rows = [int(s) for s in (args.seeds or proto["seeds"]).split(",")], []
    for seed in seeds:
        for arm, folder in proto["arms"].items():
            run = Path(args.runs or proto["runs"]) / "confirm" / "runs" / folder / f"seed{seed}"
            clamp = load_config(OnPolicyConfig, run / "config.yaml").loss.loss_max
            print(f"[stop_units] seed {seed}, arm {arm}: {args.batches} batches", flush=True)
            batches = ua.score_batches(run / "config.yaml", args.batches)
            rows.append({"seed": seed, "arm": arm, "trajectory": trajectory(run / "metrics.jsonl"),
                         "start": by_finish(batches, clamp)})
    return {"batches": args.batches, "rows": rows, "arms": proto["arms"],
            "protocol": args.protocol,
            "command": " ".join(["python", "benchmarks/quality/stop_units.py", *args.argv])}


def _mean(rows: list[dict], get) -> str:
    vals = [v for v in (get(r) for r in rows) if v is not None]
    return f"{statistics.fmean(vals):.2f}" if vals else "-"


def render(record: dict) -> str:
    rows, seeds = record["rows"], sorted({r["seed"] for r in record["rows"]})
    lines = ["## Where the stop goes (generated; exploratory, not a pre-registered test)", "",
             f"Seeds {', '.join(map(str, seeds))}. Stop fraction of the training rollouts at "
             "each step (mean over seeds):", "",
             "| arm | " + " | ".join(f"step {s}" for s in STEPS) + " |",
             "|---|" + "---|" * len(STEPS)]
    for arm in record["arms"]:
        sel = [r for r in rows if r["arm"] == arm]
        lines.append(f"| {arm} | " + " | ".join(
            _mean(sel, lambda r, s=s: r["trajectory"].get(str(s))) for s in STEPS) + " |")
    lines += ["", f"At the start (each seed's CE student, {record['batches']} rollout batches, "
              "the same rollouts for every arm, scored as in training): well-formed answers by "
              "how the response ended; r = log q - log p; the other units' advantage under the "
              "`mean` baseline and the 2-nat clamp (means over seeds).", "",
              "| arm | ended | samples | answer unit r | other units, summed r | other units' "
              "advantage |", "|---|---|---|---|---|---|"]
    for arm in record["arms"]:
        sel = [r for r in rows if r["arm"] == arm]
        for fin in ("stop", "length"):
            n = sum(r["start"].get(fin, {}).get("n", 0) for r in sel)
            cells = [_mean(sel, lambda r, k=k: r["start"].get(fin, {}).get(k))
                     for k in ("answer_r", "rest_r", "rest_adv")]
            lines.append(f"| {arm} | {fin} | {n} | " + " | ".join(cells) + " |")
    labels = ", ".join(f"{a} = `{f}`" for a, f in record["arms"].items())
    where = ua.PROTOCOLS[record.get("protocol", "v13")]["records"]
    lines += ["", f"Arms: {labels}. Raw per-seed figures: `{where}/{RECORD.name}`; command: "
              f"`{record['command']}`."]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--protocol", choices=PROTOCOLS, default="v13",
                   help="whose runs: the thirteenth protocol's or the sixteenth's")
    p.add_argument("--runs", default="", help="the protocol's --out (default runs/q24v13 / q24v16)")
    p.add_argument("--seeds", default="", help="default: the protocol's seeds")
    p.add_argument("--batches", type=int, default=10, help="rollout batches per seed")
    p.add_argument("--report", action="store_true", help="only regenerate the block")
    args = p.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)   # the record's command
    torch.set_num_threads(1)
    print(record_and_report(record_path(args.protocol), None if args.report else
                            lambda: measure(args), render, HERE / "RESULTS.md",
                            f"stops24{args.protocol}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
