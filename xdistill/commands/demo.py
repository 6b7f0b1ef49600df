"""``xdistill demo [tokenizers|distill]``: demos.

The two demos ``make demo`` runs, one after the other. ``tokenizers`` (the default) compares real tokenizer pairs on a bundled paragraph; ``distill``
distils a cross-tokenizer teacher into a student (:mod:`xdistill.demo.distill`). The ``--help``
text is built from the code it describes (arms, budgets, default tokenizers; tested).
"""

from __future__ import annotations

import argparse
import sys

from xdistill.log import init_logging
from xdistill.quality.arms import ArmSettings


def _description() -> str:
    # deferred: torch, numpy via xdistill.demo (keeps `import xdistill.commands.demo` light)
    from xdistill.demo.distill import ARM_LABELS, DEMO_ARMS
    # deferred: numpy, yaml via xdistill.demo/quality (keeps `import xdistill.commands.demo` light)
    from xdistill.demo.tokenizer_pairs import DEFAULT_NAMES
    from xdistill.quality.prepare import PrepConfig

    arms = "\n".join(f"  - {ARM_LABELS[a]} ({a})" for a in DEMO_ARMS)
    return f"""The two demos `make demo` runs: `xdistill demo tokenizers`, then `xdistill demo distill`.

tokenizers (the default; seconds): compares real tokenizer pairs of different families
({", ".join(DEFAULT_NAMES)}; --names) on a bundled paragraph: vocabulary overlap by
bytes vs. by raw strings, token counts, aligned chunks, exact 1:1 pairs and coverage.

distill (minutes on 2 cores; a progress line every 10 s): a teacher whose tokenizer splits
digits is trained from scratch ({PrepConfig().big_steps} steps, CE only; cached under
$XDISTILL_ASSETS/quality for later runs) on arithmetic problems and Shakespeare, then
distilled into a student with another tokenizer, one seed, {ArmSettings().steps} steps per arm:
{arms}
It prints held-out accuracy (greedy exact match) and bits per byte per arm, and writes the runs,
the exported students and curves.png under --out. A training run that fails or stalls ends it
with one error naming the run's log (exit 2)."""


def main(argv: list[str] | None = None) -> int:
    # deferred: numpy, yaml via xdistill.demo/quality (keeps `import xdistill.commands.demo` light)
    from xdistill.demo.tokenizer_pairs import DEFAULT_NAMES
    from xdistill.quality.runner import Watch

    parser = argparse.ArgumentParser(prog="xdistill demo", description=_description(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", nargs="?", default="tokenizers", choices=["tokenizers", "distill"],
                        help="which demo to run")
    parser.add_argument("--steps", type=int, default=0,
                        help="student steps per arm (distill; 0 = the quality harness's budget)")
    parser.add_argument("--jobs", type=int, default=2, help="training runs at a time (distill)")
    parser.add_argument("--out", default="runs/demo_distill", help="output folder (distill)")
    parser.add_argument("--cache", default="",
                        help="distill: prepared-assets cache (default $XDISTILL_ASSETS/quality)")
    parser.add_argument("--stall-s", type=float, default=Watch.stall_s,
                        help="distill: stop a training run whose log and metrics have not grown "
                             "for this many seconds")
    parser.add_argument("--names", default=",".join(DEFAULT_NAMES),
                        help="tokenizers: comma-separated tokenizer asset names to compare "
                             "pairwise")
    args = parser.parse_args(argv)
    init_logging()
    if args.which == "distill":
        # deferred: torch via xdistill.demo (keeps `import xdistill.commands.demo` light)
        from xdistill.demo.distill import run as run_distill

        try:
            run_distill(out_dir=args.out, steps=args.steps or None, jobs=args.jobs,
                        cache=args.cache or None, watch=Watch(stall_s=args.stall_s))
        except KeyboardInterrupt:
            print("xdistill demo distill: interrupted (training runs stopped)", file=sys.stderr)
            return 130
        return 0
    # deferred: numpy via xdistill.demo (keeps `import xdistill.commands.demo` light)
    from xdistill.demo.tokenizer_pairs import PARAGRAPH, format_reports, run

    reports = run(tuple(args.names.split(",")))
    print("Bundled paragraph:\n" + PARAGRAPH)
    print(format_reports(reports))
    print("\n'by bytes' counts tokens whose contributed bytes are identical (Ġhello == ▁hello);\n"
          "'raw' compares vocabulary strings. 'exact' = 1:1 chunks with identical bytes.")
    return 0
