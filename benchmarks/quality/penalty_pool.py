"""The cross-tokenizer penalty of one estimator pooled over the protocols that ran it with its
same-tokenizer control on fresh seeds (issue 24), from their committed raw results only.

    python benchmarks/quality/penalty_pool.py            # writes the block GENERATED:penalty24

Pooling is *not* a pre-registered test: each protocol's own penalty is its decision; this block
shows how far the penalty moves between sets of fresh seeds. Per seed, gain = arm - continued CE
on that seed; the penalty is ``1 - mean cross gain / mean same gain`` over all pooled seeds, with
a bootstrap interval (seeds resampled within each protocol) and a paired t-test of the per-seed
difference between the two gains.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from toyq.confirm import accuracy_by_arm
from toyq.run import update_results_md
from toyq.stats import paired, penalty, penalty_interval

HERE = Path(__file__).resolve().parent
CROSS, SAME, BASE = "op_k1_byte_mean_clip", "op_k1_same_mean_clip", "cont_ce"
# the protocols that ran CROSS with SAME on fresh seeds
SOURCES = ("credit24v7", "credit24v8", "credit24v9", "credit24v10", "credit24v11")


def gains(confirm: Path) -> list[tuple[int, float, float]]:
    """(seed, same gain, cross gain) of every seed that finished all three arms."""
    acc = accuracy_by_arm(json.loads(confirm.read_text())["runs"])
    seeds = sorted(set(acc[BASE]) & set(acc[SAME]) & set(acc[CROSS]))
    return [(s, acc[SAME][s] - acc[BASE][s], acc[CROSS][s] - acc[BASE][s]) for s in seeds]


def render(per: dict[str, list]) -> str:
    lines = ["## Cross-tokenizer penalty pooled over protocols (generated; not a pre-registered "
             "test)", "", f"`{CROSS}` against its control `{SAME}`, gains over `{BASE}` per seed.",
             "", "| protocol | seeds | same gain | cross gain | penalty |", "|---|---|---|---|---|"]
    for name, rows in per.items():
        same, cross = (statistics.fmean(r[i] for r in rows) for i in (1, 2))
        lines.append(f"| {name} | {rows[0][0]}-{rows[-1][0]} ({len(rows)}) | {same:+.3f} | "
                     f"{cross:+.3f} | {penalty(cross, same):.2f} |")
    pen, lo, hi = penalty_interval([[(s, c) for _, s, c in rows] for rows in per.values()])
    allrows = [r for rows in per.values() for r in rows]
    t = paired({i: r[1] for i, r in enumerate(allrows)}, {i: r[2] for i, r in enumerate(allrows)})
    diff = statistics.fmean(r[1] - r[2] for r in allrows)
    lines += ["", f"Pooled over {len(allrows)} seeds: penalty **{pen:.3f}**, 95% bootstrap "
              f"interval [{lo:.2f}, {hi:.2f}] (seeds resampled within each protocol, 20,000 "
              f"draws); same gain - cross gain {diff:+.3f} per seed, paired t {t.t:+.2f}, "
              f"p {t.p:.3f}."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=HERE / "RESULTS.md")
    args = ap.parse_args(argv)
    per = {name: gains(HERE / name / "confirm.json") for name in SOURCES}
    text = render(per)
    update_results_md(text, args.results, "penalty24")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
