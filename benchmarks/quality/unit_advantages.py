"""What each advantage baseline does to the answer units k1 trains on (exploratory diagnostic).

    python benchmarks/quality/unit_advantages.py --runs runs/q24v9 [--seeds 100,101,102]
        [--batches 10] [--student start|final]   # writes credit24v9/unit_advantages[_final].json
    python benchmarks/quality/unit_advantages.py --report [--student final]   # GENERATED:units24[_final]
    python benchmarks/quality/unit_advantages.py --protocol v13 [--student final]   # the eight
        # teachers of the thirteenth protocol: credit24v13/unit_advantages[_final].json, units24v13

Not a pre-registered test. For the ninth protocol's three k1 arms (A: same-tokenizer teacher, B:
its twin through the cross-tokenizer pipeline, C: the cross-tokenizer teacher; each run's own
``config.yaml``), the CE student a seed's arms start from draws ``--batches`` rollout batches (the
same rollouts for the three arms: same student, prompts and seeds), and the trainer scores them as
in training (``rollout_batch`` + ``loss_and_backward``, no optimizer step). The per-unit log-ratios
``r = log q - log p`` are read where the loss reads them (:func:`xdistill.losses.onpolicy_sampled.
unit_logprobs`, wrapped for the run). A sample's first unit holds its answer (the response starts
with the digits). Per arm and baseline (``none``, ``mean``, ``clipped_mean``, each followed by the
arm's 2-nat clamp, as :func:`xdistill.losses.onpolicy.sampled_unit_losses` computes them, one
micro-batch = one batch): the mean baseline, the mean advantage of correct and of wrong answer
units, the fraction of wrong answers with a positive advantage (reinforced), and the mean
advantage of the other units (the format: ``.`` and the stop). ``--student final`` scores each
arm's *trained* student instead (its export after the 2,000 steps, its own rollouts): what the
estimator does at the end of training.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from toyq.run import record_and_report

HERE = Path(__file__).resolve().parent
RECORD = HERE / "credit24v9" / "unit_advantages.json"
ARMS = {"A": "op_k1_same_mean_clip", "B": "op_k1_twin_byte_mean_clip", "C": "op_k1_byte_mean_clip"}
_T = ("", "_t2", "_t3", "_t4")
# the protocols whose runs this reads: their arms (label -> arm folder), records folder, block tag,
# default runs folder and seeds, and whose students "start" means
PROTOCOLS = {
    "v9": {"arms": ARMS, "records": "credit24v9", "tag": "units24", "runs": "runs/q24v9",
           "seeds": "100,101,102",
           "start": "the ninth protocol's CE students (the arms' common start)"},
    "v13": {"arms": {**{f"S{i + 1}": f"op_k1_same_mean_clip{t}" for i, t in enumerate(_T)},
                     **{f"X{i + 1}": f"op_k1_byte_mean_clip{t}" for i, t in enumerate(_T)}},
            "records": "credit24v13", "tag": "units24v13", "runs": "runs/q24v13",
            "seeds": "140,141,142",
            "start": "the thirteenth protocol's CE students (the arms' common start)"},
}
# the sixteenth protocol: the thirteenth's arms, teachers trained on one problem per document
PROTOCOLS["v16"] = {**PROTOCOLS["v13"], "records": "credit24v16", "tag": "units24v16",
                    "runs": "runs/q24v16", "seeds": "170,171,172",
                    "start": "the sixteenth protocol's CE students (the arms' common start)"}
BASELINES = ("none", "mean", "clipped_mean")


def record_path(student: str, protocol: str = "v9") -> Path:
    base = HERE / PROTOCOLS[protocol]["records"] / RECORD.name
    return base if student == "start" else base.with_name(f"{base.stem}_final.json")


def score_batches(config_path: Path, batches: int, student: str = "") -> list[dict]:
    """Per rollout batch: response texts, gold sums and per-sample unit (s, t) log-probs
    (``student``: another student folder than the config's)."""
    import xdistill.losses.onpolicy_sampled as lo   # where sampled_loss looks it up
    from xdistill.config import load_config
    from xdistill.train.metrics import Timers
    from xdistill.train.onpolicy import build_onpolicy_run, rollout_batch
    from xdistill.train.onpolicy_config import OnPolicyConfig
    from xdistill.train.onpolicy_step import loss_and_backward

    with tempfile.TemporaryDirectory(prefix="xdistill-units-") as tmp:
        cfg = load_config(OnPolicyConfig, config_path,
                          [f"train.out_dir={tmp}", "checkpoint.every=0", "checkpoint.export_hf=false",
                           *([f"student.path={student}"] if student else [])])
        captured, original = [], lo.unit_logprobs

        def unit_logprobs(*args, **kw):
            b_N, s_N, t_N, counts = original(*args, **kw)
            captured.append((b_N.tolist(), s_N.detach().tolist(), t_N.detach().tolist()))
            return b_N, s_N, t_N, counts
        lo.unit_logprobs = unit_logprobs
        run = build_onpolicy_run(cfg)
        run.mode.pool.start()
        try:
            run.mode.iters = [iter(run.mode.loaders[0])]
            out = []
            for step in range(1, batches + 1):
                _, ro, scored = rollout_batch(run, step, Timers())
                captured.clear()
                loss_and_backward(run, scored, Timers())
                (b_N, s_N, t_N), = captured   # one teacher, one micro-batch
                tok = run.mode.engine.tok
                units: dict[int, list] = {}
                for b, s, t in zip(b_N, s_N, t_N):
                    units.setdefault(b, []).append([s, t])
                out.append({"texts": [tok.decode(ro.response_ids_BTr[b][:int(n)].tolist())
                                      for b, n in enumerate(ro.response_len_B)],
                            "golds": [sum(map(int, re.findall(r"\d+", str(p)))) for p in ro.prompts],
                            "units": [units.get(b, []) for b in range(ro.batch_size)],
                            "finish": list(ro.finish_reasons)})
            return out
        finally:
            lo.unit_logprobs = original
            run.mode.pool.close()


def _clamp(x: float, c: float | None) -> float:
    return x if c is None else max(-c, min(c, x))


def _baseline(r: list[float], baseline: str, clamp: float | None) -> tuple[float, float | None]:
    """(baseline value, pre-clamp of the log-ratios) of ``baseline`` over log-ratios ``r``."""
    if baseline == "none" or not r:
        return 0.0, None
    if baseline == "mean":
        return statistics.fmean(r), None
    if baseline == "clipped_mean":
        return statistics.fmean(_clamp(x, clamp) for x in r), clamp
    raise ValueError(f"unknown baseline {baseline!r}")


def advantages(batch: dict, baseline: str, clamp: float | None) -> list[list[float]]:
    """Per sample, its units' k1 advantages under ``baseline`` then ``clamp`` (the loss's order:
    :func:`xdistill.policy.center_advantages`, then the clamp)."""
    r = [[t - s for s, t in units] for units in batch["units"]]
    base, pre = _baseline([x for row in r for x in row], baseline, clamp)
    return [[_clamp(_clamp(x, pre) - base, clamp) for x in row] for row in r]


def summarise(batches: list[dict], baseline: str, clamp: float | None) -> dict:
    """Answer-unit advantages of correct / wrong well-formed answers, the share of wrong answers
    reinforced, the other units' mean advantage and the mean baseline (over batches)."""
    ok, wrong, other, base = [], [], [], []
    for batch in batches:
        flat = [t - s for units in batch["units"] for s, t in units]
        base.append(_baseline(flat, baseline, clamp)[0])
        for text, gold, adv in zip(batch["texts"], batch["golds"], advantages(batch, baseline, clamp)):
            head, dot, _ = text.partition(".")
            if not adv or not (dot and head.strip().isdigit()):
                continue
            (ok if int(head) == gold else wrong).append(adv[0])
            other += adv[1:]
    return {"baseline": statistics.fmean(base), "answers_correct": len(ok),
            "answers_wrong": len(wrong), "adv_correct": statistics.fmean(ok),
            "adv_wrong": statistics.fmean(wrong),
            "wrong_reinforced": sum(a > 0 for a in wrong) / len(wrong),
            "adv_other": statistics.fmean(other) if other else float("nan"),
            "units_per_sample": sum(len(u) for b in batches for u in b["units"])
            / sum(len(b["units"]) for b in batches)}


def measure(args) -> dict:
    from xdistill.config import load_config
    from xdistill.train.onpolicy_config import OnPolicyConfig

    proto = PROTOCOLS[args.protocol]
    seeds, rows = [int(s) for s in (args.seeds or proto["seeds"]).split(",")], []
    for seed in seeds:
        for arm, folder in proto["arms"].items():
            path = (Path(args.runs or proto["runs"]) / "confirm" / "runs" / folder / f"seed{seed}"
                    / "config.yaml")
            clamp = load_config(OnPolicyConfig, path).loss.loss_max
            print(f"[unit_advantages] seed {seed}, arm {arm}: {args.batches} batches", flush=True)
            final = str(path.parent / "export") if args.student == "final" else ""
            batches = score_batches(path, args.batches, final)
            rows += [dict(seed=seed, arm=arm, variant=v, **summarise(batches, v, clamp))
                     for v in BASELINES]
    return {"batches": args.batches, "student": args.student, "rows": rows,
            "protocol": args.protocol, "arms": proto["arms"],
            "command": " ".join(["python", "benchmarks/quality/unit_advantages.py", *sys.argv[1:]])}


def _cell(vals, fmt: str = "{:.2f}") -> str:
    """Mean over seeds (range)."""
    lo, hi = fmt.format(min(vals)), fmt.format(max(vals))
    return f"{fmt.format(statistics.fmean(vals))} ({lo} .. {hi})"


def _table_row(rows: list[dict], arm: str, variant: str) -> str:
    sel = [r for r in rows if r["arm"] == arm and r["variant"] == variant]
    cells = [f"{statistics.fmean(r['units_per_sample'] for r in sel):.2f}"]
    cells += [_cell([r[k] for r in sel]) for k in ("baseline", "adv_correct", "adv_wrong")]
    cells += [_cell([r["wrong_reinforced"] for r in sel], "{:.3f}"),
              _cell([r["adv_other"] for r in sel])]
    return f"| {arm} | `{variant}` | " + " | ".join(cells) + " |"


def _group_lines(rows: list[dict], arms: dict) -> list[str]:
    """Same- against cross-tokenizer teachers (labels ``S*`` / ``X*``), the ``mean`` baseline:
    each measure's mean over the group's teachers and seeds."""
    keys = ("units_per_sample", "baseline", "adv_correct", "adv_wrong", "wrong_reinforced",
            "adv_other")
    groups = {g: [r for r in rows if r["variant"] == "mean" and r["arm"].startswith(g)]
              for g in ("S", "X")}
    if not all(groups.values()):
        return []
    mean = {g: {k: statistics.fmean(r[k] for r in sel) for k in keys} for g, sel in groups.items()}
    lines = ["", "Same- (S) against cross-tokenizer (X) teachers, `mean` baseline, means over "
             "teachers and seeds:", "",
             "| measure | same-tokenizer teachers | cross-tokenizer teachers | X - S |",
             "|---|---|---|---|"]
    for k in keys:
        lines.append(f"| {k} | {mean['S'][k]:.3f} | {mean['X'][k]:.3f} | "
                     f"{mean['X'][k] - mean['S'][k]:+.3f} |")
    labels = ", ".join(f"{a} = `{f}`" for a, f in arms.items())
    return lines + ["", f"Arms: {labels}."]


def render(record: dict) -> str:
    rows, seeds = record["rows"], sorted({r["seed"] for r in record["rows"]})
    proto = record.get("protocol", "v9")
    arms = record.get("arms", ARMS)
    final = record.get("student", "start") == "final"
    who = ("each arm's trained student (its export after 2,000 steps, its own rollouts)" if final
           else PROTOCOLS[proto]["start"])
    when = " at the end of training" if final else ""
    lines = [f"## What each baseline does to the answer units{when} "
             "(generated; exploratory, not a pre-registered test)", "",
             f"Seeds {', '.join(map(str, seeds))}: {who}, "
             f"{record['batches']} rollout batches each, scored by each arm's teacher as in "
             "training (no update); advantages after the baseline and the 2-nat clamp. Means over "
             "seeds (range).", "",
             "| arm | baseline | units / sample | baseline value | correct answers' advantage | "
             "wrong answers' advantage | wrong answers reinforced | other units' advantage |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [_table_row(rows, arm, v) for arm in arms for v in BASELINES]
    once = [r for r in rows if r["variant"] == "none"]   # one row per (seed, arm)
    counts = ", ".join(f"{arm} {sum(r['answers_correct'] for r in once if r['arm'] == arm)}/"
                       f"{sum(r['answers_wrong'] for r in once if r['arm'] == arm)}" for arm in arms)
    where = record_path(record.get("student", "start"), proto)
    lines += ["", f"Well-formed answers, correct/wrong: {counts}. Raw per-seed figures: "
              f"`{where.parent.name}/{where.name}`; command: `" + record["command"] + "`."]
    if proto != "v9":
        lines += _group_lines(rows, arms)
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--protocol", choices=tuple(PROTOCOLS), default="v9",
                   help="whose arms: the ninth's three (A, B, C) or the thirteenth's eight "
                        "(S1-S4 same-tokenizer, X1-X4 cross-tokenizer teachers)")
    p.add_argument("--runs", default="", help="the protocol's --out (default runs/q24v9 / q24v13)")
    p.add_argument("--seeds", default="", help="default: the protocol's first three seeds")
    p.add_argument("--batches", type=int, default=10, help="rollout batches per seed")
    p.add_argument("--student", choices=("start", "final"), default="start",
                   help="the CE start (default) or each arm's trained student")
    p.add_argument("--report", action="store_true", help="only regenerate the block")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    tag = PROTOCOLS[args.protocol]["tag"] + ("" if args.student == "start" else "_final")
    print(record_and_report(record_path(args.student, args.protocol), None if args.report else
                            lambda: measure(args), render, HERE / "RESULTS.md", tag))
    return 0


if __name__ == "__main__":
    sys.exit(main())
