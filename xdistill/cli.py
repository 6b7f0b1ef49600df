"""The ``xdistill`` console script: dispatches ``xdistill <command> ...`` to its module.

Each command lives in ``xdistill.commands.<name>`` and exposes ``main(argv) -> int``. Commands are
imported lazily so ``xdistill --help`` is fast. User errors (:class:`XDistillError`) print one line
``xdistill: error: ...`` and exit with code 2; under ``torchrun`` with several ranks the line names
the rank that printed it (``xdistill: error: [rank 1/2] ...``: every rank that fails prints its
own). The console script is :func:`entry` (:func:`main`,
then exit); tests call :func:`main`.
"""

from __future__ import annotations

import importlib
import os
import sys

from xdistill import __version__
from xdistill.errors import XDistillError

# command name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "tokenizers": ("xdistill.commands.tokenizers", "inspect and compare tokenizers (bytes, roles, fingerprints)"),
    "align": ("xdistill.commands.align", "show the chunk alignment of two tokenizations of a text"),
    "projection": ("xdistill.commands.projection", "build and inspect sparse token-projection matrices"),
    "data": ("xdistill.commands.data", "prepare arrow shards from jsonl/parquet/text/chat files; info [--verify]"),
    "train": ("xdistill.commands.train", "train a student: `train offpolicy` or `train onpolicy`"),
    "eval": ("xdistill.commands.eval", "score models before training: a run's evaluation, or any model's bits per byte"),
    "plot": ("xdistill.commands.plot", "plot metrics.jsonl curves to a PNG"),
    "config": ("xdistill.commands.config", "show a config with every field documented"),
    "demo": ("xdistill.commands.demo", "the demo that `make demo` runs"),
}


def _usage() -> str:
    lines = ["usage: xdistill <command> [args...]", "", "commands:"]
    width = max(len(name) for name in COMMANDS)
    for name, (_, help_text) in COMMANDS.items():
        lines.append(f"  {name:<{width}}  {help_text}")
    lines += ["", "Run `xdistill <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        print(f"xdistill {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        _error_line(f"unknown command {name!r}; choose from {', '.join(COMMANDS)}")
        return 2
    try:
        module = importlib.import_module(COMMANDS[name][0])
    except ModuleNotFoundError as exc:
        if exc.name == COMMANDS[name][0]:
            _error_line(f"command {name!r} is not available in this version")
            return 2
        raise
    try:
        code = int(module.main(rest) or 0)
        sys.stdout.flush()    # a closed pipe shows here, not as "Exception ignored" at exit
        return code
    except XDistillError as exc:
        _error_line(f"{_rank_label()}{exc}")
        return int(getattr(exc, "exit_code", 2))
    except BrokenPipeError:
        # the reader went away (`xdistill ... | head`): no traceback, and none at exit when
        # Python flushes stdout again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _error_line(text: str) -> None:
    """``xdistill: error: TEXT`` in one write: the ranks of a torchrun launch share one stderr
    pipe, and print()'s two writes (text, then newline) on an unbuffered stderr let two ranks'
    lines run into one."""
    sys.stderr.write(f"xdistill: error: {text}\n")
    sys.stderr.flush()


def _rank_label() -> str:
    """``[rank R/W] `` in a process that torchrun started with W > 1 ranks, else empty."""
    try:
        world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    except ValueError:
        return ""
    return f"[rank {rank}/{world}] " if world > 1 else ""


def entry() -> None:
    """The console script (``xdistill``, ``python -m xdistill``): :func:`main`, then exit with its
    code. A process that ran a process group (a ``torchrun`` rank) leaves through
    :func:`xdistill.distributed.leave_process`, without the interpreter's teardown (why: there)."""
    code = main()
    dist_module = sys.modules.get("xdistill.distributed")   # loaded only if a command needed it
    if dist_module is not None and dist_module.started_a_process_group():
        dist_module.leave_process(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
