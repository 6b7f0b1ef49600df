"""Print the one-line-per-file tree of the package for the README (each file's first docstring
sentence).

    python tools/readme_tree.py            # print the tree
    python tools/readme_tree.py --check    # exit 1 if README.md's tree differs (tests call this)
    python tools/readme_tree.py --write    # rewrite README.md's tree in place
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = {
    "tools/": "offline helpers: fetch_assets.py (test assets from PyPI archives), gpu_check.py (the GPU check), ...",
    "configs/": "run configs (YAML), loaded strictly; `xdistill config show offpolicy`",
    "examples/": "runnable scripts: the tiny off-policy and on-policy recipes, the GPU off-policy recipe",
    "tests/": "mirrors the package; plain `pytest` is CPU-only (gpu/multigpu/slow markers)",
    "benchmarks/": "speed figures vs same-process references (RESULTS.md, results/); quality/ (toy harness, toyq/), real/ (real pair)",
}
BEGIN, END = "<!-- tree:begin -->", "<!-- tree:end -->"


def summary(path: Path) -> str:
    try:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    except SyntaxError:
        doc = ""
    return first_sentence(doc)


def first_sentence(doc: str) -> str:
    """The docstring's first sentence, its lines joined (a sentence may wrap), without the
    closing full stop. A sentence ends at a full stop followed by a capital ("vs. by",
    "e.g. the", "IN... -o" do not end one)."""
    para = " ".join(line.strip() for line in doc.strip().split("\n\n")[0].splitlines())
    words = para.split(" ")
    for i, word in enumerate(words[:-1]):
        if word.endswith(".") and words[i + 1][:1].isupper():
            words = words[:i + 1]
            break
    return " ".join(words).rstrip(".")


def tree() -> str:
    lines = ["```"]
    pkg = ROOT / "xdistill"
    files = sorted(p for p in pkg.rglob("*.py") if "__pycache__" not in p.parts)
    width = max(len(str(p.relative_to(ROOT))) for p in files) + 2
    for path in files:
        rel = str(path.relative_to(ROOT))
        lines.append(f"{rel:<{width}}# {summary(path)}")
    for name, text in TOP_LEVEL.items():
        if (ROOT / name).exists():
            lines.append(f"{name:<{width}}# {text}")
    lines.append("```")
    return "\n".join(lines)


def block() -> str:
    return f"{BEGIN}\n{tree()}\n{END}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="exit 1 if README.md's tree differs (tests call this)")
    mode.add_argument("--write", action="store_true", help="rewrite README.md's tree in place")
    args = parser.parse_args(argv)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    if args.check:
        if block() not in readme:
            print("README.md tree is out of date: run `python tools/readme_tree.py --write`")
            return 1
        return 0
    if args.write:
        start, end = readme.index(BEGIN), readme.index(END) + len(END)
        (ROOT / "README.md").write_text(readme[:start] + block() + readme[end:], encoding="utf-8")
        return 0
    print(block())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
