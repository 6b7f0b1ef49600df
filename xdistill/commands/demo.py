"""``xdistill demo [tokenizers|distill]``: demos.

The two demos ``make demo`` runs, one after the other. ``tokenizers`` (the default) compares real
tokenizer pairs on a bundled paragraph; ``distill`` distils Gemma-3-270M into SmolLM2-135M
(:mod:`xdistill.demo.distill`). The ``--help`` text is built from the code it describes (arms,
budgets, default tokenizers; tested).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from xdistill.demo.settings import ARMS, HELD_OUT, DemoSettings
from xdistill.log import init_logging


def _description() -> str:
    # deferred: numpy via demo.tokenizer_pairs (keeps `import xdistill.commands.demo` light)
    from xdistill.demo.tokenizer_pairs import DEFAULT_NAMES
    s = DemoSettings()
    arms = "\n".join(f"  - {label} ({arm})" for arm, label in ARMS.items())
    return f"""The two demos `make demo` runs: `xdistill demo tokenizers`, then `xdistill demo distill`.

tokenizers (the default; seconds): compares real tokenizer pairs of different families
({", ".join(DEFAULT_NAMES)}; --names) on a bundled paragraph: vocabulary overlap by
bytes vs. by raw strings, token counts, aligned chunks, exact 1:1 pairs and coverage.

distill (minutes on 2 cores; a progress line with rate and ETA at least every 10 s): the real
pair, Gemma-3-270M (teacher, 262k-token vocabulary) and SmolLM2-135M (student, 49k tokens), on
Shakespeare with {HELD_OUT} held out. The teacher is adapted to the other plays by CE,
{s.teacher_steps} steps (--teacher-steps; cached under $XDISTILL_ASSETS/demo, or --cache, keyed by
its settings: later runs reuse it); then two arms train the student from the same stock weights,
same seed, same {s.slice_kb} KB slice in the same order, {s.steps} steps each (--steps):
{arms}
It prints held-out bits per byte ({s.eval_batches} batches, --eval-batches) before and after each
arm and one greedy continuation of a held-out prompt per model, and writes summary.json under
--out. A stage that fails ends it with one error naming the stage (exit 2)."""


def main(argv: list[str] | None = None) -> int:
    # deferred: numpy via demo.tokenizer_pairs (keeps `import xdistill.commands.demo` light)
    from xdistill.demo.tokenizer_pairs import DEFAULT_NAMES
    d = DemoSettings()
    parser = argparse.ArgumentParser(prog="xdistill demo", description=_description(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", nargs="?", default="tokenizers", choices=["tokenizers", "distill"],
                        help="which demo to run")
    parser.add_argument("--out", default="runs/demo_distill", help="output folder (distill)")
    parser.add_argument("--teacher-steps", type=int, default=d.teacher_steps,
                        help="distill: CE steps adapting the teacher (a new count adapts anew)")
    parser.add_argument("--steps", type=int, default=d.steps, help="distill: student steps per arm")
    parser.add_argument("--eval-batches", type=int, default=d.eval_batches,
                        help="distill: held-out batches of 4 x 128 tokens per evaluation")
    parser.add_argument("--cache", default="",
                        help="distill: cache of the adapted teacher, projection and prepared "
                             "texts (default $XDISTILL_ASSETS/demo)")
    parser.add_argument("--names", default=",".join(DEFAULT_NAMES),
                        help="tokenizers: comma-separated tokenizer asset names to compare "
                             "pairwise")
    args = parser.parse_args(argv)
    _refuse_other_demos_options(parser, args)
    init_logging()
    if args.which == "distill":
        return _distill(parser, args)
    # deferred: numpy via xdistill.demo (keeps `import xdistill.commands.demo` light)
    from xdistill.demo.tokenizer_pairs import PARAGRAPH, format_reports, run

    names = tuple(n.strip() for n in args.names.split(",") if n.strip())
    if len(names) < 2:
        parser.error(f"--names needs at least two comma-separated tokenizer names to compare, "
                     f"got {args.names!r}")
    reports = run(names)
    print("Bundled paragraph:\n" + PARAGRAPH)
    print(format_reports(reports))
    print("\n'by bytes' counts tokens whose contributed bytes are identical (Ġhello == ▁hello);\n"
          "'raw' compares vocabulary strings. 'exact' = 1:1 chunks with identical bytes.")
    return 0


# each demo's own options: one given to the other demo would be silently ignored
_OWN_OPTIONS = {"distill": ("out", "teacher_steps", "steps", "eval_batches", "cache"),
                "tokenizers": ("names",)}


def _refuse_other_demos_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    other = "tokenizers" if args.which == "distill" else "distill"
    for name in _OWN_OPTIONS[other]:
        if getattr(args, name) != parser.get_default(name):
            parser.error(f"--{name.replace('_', '-')} applies to `xdistill demo {other}`, not to "
                         f"`xdistill demo {args.which}`")


def _distill(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    for name in ("teacher_steps", "steps", "eval_batches"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    print("[demo] loading torch and transformers", flush=True)
    # deferred: torch, transformers via xdistill.demo.distill (keeps `xdistill --help` fast)
    from xdistill.demo.distill import run
    from xdistill.demo.progress import DemoFailed

    settings = replace(DemoSettings(), teacher_steps=args.teacher_steps, steps=args.steps,
                       eval_batches=args.eval_batches)
    try:
        run(args.out, settings, cache=args.cache or None)
    except DemoFailed as exc:
        print(f"xdistill: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("xdistill demo distill: interrupted", file=sys.stderr)
        return 130
    return 0
