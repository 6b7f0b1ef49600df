"""``xdistill demo [tokenizers|distill]``: demos.

``tokenizers`` (default; ``make demo`` runs it first): compares real tokenizer pairs of different
families on a bundled paragraph (vocabulary overlap by bytes vs. raw strings, alignment chunks and
coverage). ``distill``: the shortened quality harness (:mod:`xdistill.quality`): a digit-splitting
teacher distilled into a student with another tokenizer, CE-only vs P-KL (+ continuation) vs ALM
on held-out accuracy and bits per byte, with a progress line every 10 s. A training run that fails
or stalls ends it with one error naming the run's log (exit 2).
"""

from __future__ import annotations

import argparse
import sys

from xdistill.log import init_logging


def main(argv: list[str] | None = None) -> int:
    from xdistill.quality.runner import Watch

    parser = argparse.ArgumentParser(prog="xdistill demo", description=__doc__)
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
    parser.add_argument("--names", default="gpt2,qwen2,llama3,mistral,bert",
                        help="comma-separated tokenizer asset names to compare pairwise")
    args = parser.parse_args(argv)
    init_logging()
    if args.which == "distill":
        from xdistill.demo.distill import run as run_distill

        try:
            run_distill(out_dir=args.out, steps=args.steps or None, jobs=args.jobs,
                        cache=args.cache or None, watch=Watch(stall_s=args.stall_s))
        except KeyboardInterrupt:
            print("xdistill demo distill: interrupted (training runs stopped)", file=sys.stderr)
            return 130
        return 0
    from xdistill.demo.tokenizer_pairs import PARAGRAPH, format_reports, run

    reports = run(tuple(args.names.split(",")))
    print("Bundled paragraph:\n" + PARAGRAPH)
    print(format_reports(reports))
    print("\n'by bytes' counts tokens whose contributed bytes are identical (Ġhello == ▁hello);\n"
          "'raw' compares vocabulary strings. 'exact' = 1:1 chunks with identical bytes.")
    return 0
