"""``xdistill demo [tokenizers]``: what ``make demo`` runs.

``tokenizers`` (the default for now): compares real tokenizer pairs of different families on a
bundled paragraph (vocabulary overlap by bytes vs. raw strings, alignment chunks and coverage).
"""

from __future__ import annotations

import argparse

from xdistill.log import init_logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="xdistill demo", description=__doc__)
    parser.add_argument("which", nargs="?", default="tokenizers", choices=["tokenizers"],
                        help="which demo to run")
    parser.add_argument("--names", default="gpt2,qwen2,llama3,mistral,bert",
                        help="comma-separated tokenizer asset names to compare pairwise")
    args = parser.parse_args(argv)
    init_logging()
    from xdistill.demo.tokenizer_pairs import PARAGRAPH, format_reports, run

    reports = run(tuple(args.names.split(",")))
    print("Bundled paragraph:\n" + PARAGRAPH)
    print(format_reports(reports))
    print("\n'by bytes' counts tokens whose contributed bytes are identical (Ġhello == ▁hello);\n"
          "'raw' compares vocabulary strings. 'exact' = 1:1 chunks with identical bytes.")
    return 0
