"""``xdistill projection build|inspect``: offline sparse token-projection matrices.

build:   xdistill projection build --student S --teacher T --method multitoken,exact --top-k 4 \\
             [--corpus DIR|FILE ...] [--multitoken-decay 0.1] [--reverse] -o out.npz
inspect: xdistill projection inspect out.npz --student S --teacher T [--plot out.png]

S and T are tokenizer specs (asset name such as gpt2/qwen2/llama3/mistral/bert, an HF folder, a
.tiktoken/.model/.gguf file). ``build`` writes ``out.npz`` (CSR, rows = student tokens) and the
``out.json`` sidecar (fingerprints, methods, parameters, coverage).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

from xdistill.commands import plain
from xdistill.errors import ProjectionError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xdistill projection", description=plain(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    b = sub.add_parser("build", help="build a projection matrix (.npz + .json sidecar)")
    b.add_argument("--student", required=True, help="student tokenizer spec (rows)")
    b.add_argument("--teacher", required=True, help="teacher tokenizer spec (columns)")
    b.add_argument("--method", default="multitoken,exact",
                   help="comma-separated methods in precedence order: exact, multitoken, corpus; "
                        "exact always pins identical tokens to a one-hot row (default: %(default)s)")
    b.add_argument("--top-k", type=int, default=4, help="weights kept per row (default: %(default)s)")
    b.add_argument("--corpus", nargs="+", default=[], metavar="PATH",
                   help="corpus for the corpus method: `xdistill data prepare` output folders or "
                        "files (.arrow/.parquet/.jsonl with 'text', or text)")
    b.add_argument("--corpus-max-texts", type=int, default=0, help="read at most this many texts (0 = all)")
    b.add_argument("--corpus-min-count", type=int, default=1, help="drop pairs seen fewer times")
    b.add_argument("--multitoken-decay", type=float, default=0.1,
                   help="piece i weighs decay**i, normalised (NeMo-RL: 0.1) (default: %(default)s)")
    b.add_argument("--reverse", action="store_true",
                   help="also add teacher tokens that the student re-tokenizes into a single token")
    b.add_argument("--reverse-weight", type=float, default=1.0, help="weight of each reverse entry")
    b.add_argument("-o", "--output", required=True, help="output .npz (sidecar: same name, .json)")
    b.add_argument("--overwrite", action="store_true",
                   help="replace existing files at -o and its .json even when they are not a "
                        "projection (a previous projection is always replaced)")
    b.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    i = sub.add_parser("inspect", help="coverage, example rows and entropy of a projection")
    i.add_argument("path", help="projection .npz")
    i.add_argument("--student", required=True, help="student tokenizer spec")
    i.add_argument("--teacher", required=True, help="teacher tokenizer spec")
    i.add_argument("--examples", type=int, default=3, help="example rows per category")
    i.add_argument("--plot", help="write a PNG figure here")
    return parser


def _output_folder(output: str) -> None:
    """Create the folder of ``-o`` (a missing one is made) or fail naming it, before any work."""
    folder = Path(output).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ProjectionError(f"output {output!r}: cannot create its folder {str(folder)!r} "
                              f"({exc.strerror or exc})") from None
    if not os.access(folder, os.W_OK):
        raise ProjectionError(f"output {output!r}: its folder {str(folder)!r} is not writable")


def _check_numbers(args) -> None:
    """Out-of-range build options as one ProjectionError (a NaN decay or a negative weight
    silently unmapped rows; --top-k 0 failed only after the build)."""
    checks = [("--multitoken-decay", args.multitoken_decay, ">= 0", lambda v: v >= 0),
              ("--reverse-weight", args.reverse_weight, ">= 0", lambda v: v >= 0),
              ("--top-k", args.top_k, ">= 1", lambda v: v >= 1),
              ("--corpus-max-texts", args.corpus_max_texts, ">= 0 (0 = all)", lambda v: v >= 0)]
    for flag, value, want, ok in checks:
        if value is not None and not (math.isfinite(value) and ok(value)):
            raise ProjectionError(f"{flag} must be {want}, got {value}")


def _build(args) -> int:
    # deferred: scipy, numpy via xdistill.projection (keeps `xdistill projection --help` fast)
    from xdistill.projection import BuildConfig, build_projection, parse_methods, save_projection
    from xdistill.projection.artifact import check_output
    from xdistill.projection.corpus import resolve_corpus_files
    from xdistill.tokenization import load_tokenizer

    if not args.output.endswith(".npz"):
        raise ProjectionError(f"output {args.output!r} must end in .npz")
    _check_numbers(args)                         # before the build, not after it
    _output_folder(args.output)                  # before the build, not after it
    check_output(args.output, args.overwrite)    # a user's out.json is not replaced silently
    t0 = time.perf_counter()
    methods = parse_methods(args.method)
    if "corpus" in methods and not args.corpus:
        raise ProjectionError("method 'corpus' needs a corpus (--corpus DIR|FILE ...)")
    resolve_corpus_files(args.corpus)            # fail fast: before the tokenizers load
    student, teacher = load_tokenizer(args.student), load_tokenizer(args.teacher)
    config = BuildConfig(methods=methods, top_k=args.top_k,
                         multitoken_decay=args.multitoken_decay, reverse=args.reverse,
                         reverse_weight=args.reverse_weight, corpus_files=tuple(args.corpus),
                         corpus_max_texts=args.corpus_max_texts, corpus_min_count=args.corpus_min_count)
    proj = build_projection(student, teacher, config, progress=not args.quiet and sys.stderr.isatty())
    npz, side = save_projection(proj, args.output)
    cov = proj.meta["coverage"]
    rows = ", ".join(f"{k} {v}" for k, v in cov["rows"].items())
    print(f"wrote {npz} and {side}: {proj.shape[0]}x{proj.shape[1]}, nnz {cov['nnz']}, "
          f"mapped {100 * cov['mapped_fraction']:.2f}% ({rows}) in {time.perf_counter() - t0:.1f} s")
    return 0


def _inspect(args) -> int:
    # deferred: scipy, numpy via xdistill.projection (keeps `xdistill projection --help` fast)
    from xdistill.projection import load_projection
    from xdistill.projection.audit import format_report
    from xdistill.tokenization import load_tokenizer

    student, teacher = load_tokenizer(args.student), load_tokenizer(args.teacher)
    proj = load_projection(args.path, student, teacher)
    if args.examples < 0:
        raise ProjectionError(f"--examples must be >= 0, got {args.examples}")
    print(format_report(proj, student.table, teacher.table, n_examples=args.examples))
    if args.plot:
        # deferred: scipy via xdistill.projection (keeps `xdistill projection --help` fast)
        from xdistill.projection.plot import write_plot

        print(f"\nwrote {write_plot(proj, student.table, Path(args.plot))}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return _build(args) if args.action == "build" else _inspect(args)
