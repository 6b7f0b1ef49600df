"""``xdistill data prepare IN... -o DIR`` and ``xdistill data info DIR``.

``prepare`` converts jsonl / parquet / arrow / text / chat files into memory-mappable arrow IPC
shards plus ``index.json`` (see :mod:`xdistill.data.prepare`); rerunning it with unchanged inputs
does nothing. ``info`` prints a prepared directory's index summary; ``info --verify`` also reads
every document as training does (:mod:`xdistill.data.verify`) and names the first bad file/row.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from xdistill.commands import plain
from xdistill.errors import DataError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xdistill data", description=plain(__doc__).splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    prep = sub.add_parser("prepare", help="convert input files into arrow shards + index.json")
    prep.add_argument("inputs", nargs="+", help="input files or directories")
    prep.add_argument("-o", "--output", required=True, help="output directory")
    prep.add_argument("--text-column", default="text", help="text column / JSON key (default: text)")
    prep.add_argument("--messages-column", default="messages",
                      help="chat column / JSON key with [{role, content}] (default: messages)")
    prep.add_argument("--format", default="auto",
                      choices=["auto", "jsonl", "parquet", "arrow", "text", "text-lines"],
                      help="input format (auto: by file suffix; text = one document per file, "
                           "text-lines = one per line)")
    prep.add_argument("--invalid-utf8", default="error", choices=["error", "replace"],
                      help="invalid UTF-8: fail naming the file/line, or substitute U+FFFD")
    prep.add_argument("--shard-mb", type=float, default=256.0,
                      help="maximum document bytes per shard, in MiB (default: 256)")
    prep.add_argument("--max-doc-mb", type=float, default=0.5,
                      help="split text documents longer than this many MiB into pieces (at a "
                           "blank line, newline or space; 0 = never; default: 0.5)")
    prep.add_argument("--overwrite", action="store_true",
                      help="replace an output that is a file or a dataset prepared from other "
                           "inputs or options (without it, either is an error)")
    prep.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    info = sub.add_parser("info", help="summarise a prepared directory; --verify reads every "
                                      "document as training does")
    info.add_argument("directory", help="a prepared directory (with --verify: any data path "
                                        "training accepts)")
    info.add_argument("--verify", action="store_true",
                      help="fetch and decode every document the way training does and report the "
                           "first bad file and row (a damaged shard, invalid UTF-8, an unknown chat "
                           "role, a conversation with no role of --loss-roles)")
    info.add_argument("--text-column", default="text", help="with --verify: data.text_column")
    info.add_argument("--messages-column", default="messages",
                      help="with --verify: data.messages_column")
    info.add_argument("--invalid-utf8", default="error", choices=["error", "replace"],
                      help="with --verify: data.invalid_utf8")
    info.add_argument("--loss-roles", nargs="+", default=["assistant"],
                      help="with --verify: data.loss_roles (default: assistant)")
    info.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    return parser


def _summary(index: dict) -> str:
    return (f"{index['documents']} documents ({index.get('text_documents', 0)} text, "
            f"{index.get('chat_documents', 0)} chat), {index['bytes']} bytes in "
            f"{len(index['shards'])} shard(s); skipped {index['skipped_empty']} empty, "
            f"replaced invalid UTF-8 in {index.get('replaced_invalid_utf8', 0)}"
            + (f"; split {index['split_documents']} document(s) longer than "
               f"{index['max_doc_bytes']} bytes into {index['documents_from_splits']} pieces"
               if index.get("split_documents") else ""))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.action == "prepare":
        # deferred: torch, pyarrow via xdistill.data (keeps `xdistill data --help` fast)
        from xdistill.data.prepare import prepare

        for flag, value, least in (("--shard-mb", args.shard_mb, 0.0),
                                   ("--max-doc-mb", args.max_doc_mb, None)):
            if not math.isfinite(value) or value < 0 or (least is not None and value <= least):
                raise DataError(f"{flag} must be a finite number "
                                f"{'> 0' if least is not None else '>= 0 (0: never split)'}, "
                                f"got {value}")
        index, wrote = prepare(args.inputs, args.output, text_column=args.text_column,
                               messages_column=args.messages_column, fmt=args.format,
                               invalid_utf8=args.invalid_utf8,
                               shard_bytes=max(1, int(args.shard_mb * (1 << 20))),
                               max_doc_bytes=int(args.max_doc_mb * (1 << 20)),
                               progress=not args.quiet, overwrite=args.overwrite)
        state = "wrote" if wrote else "up to date"
        print(f"{args.output}: {state}: {_summary(index)}")
        return 0
    return _info(args)


def _info(args) -> int:
    path = Path(args.directory) / "index.json"
    index = None
    if not args.verify or path.is_file():
        try:
            index = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise DataError(f"cannot read {path}: {exc}") from None
        # deferred: torch, pyarrow via xdistill.data (keeps `xdistill data --help` fast)
        from xdistill.data.verify import check_index, check_shards

        check_index(path, index)              # another program's index.json is one line

        check_shards(args.directory, index)   # a truncated or missing shard is an error
        print(_summary(index))
    if args.verify:
        # deferred: torch, pyarrow via xdistill.data (keeps `xdistill data --help` fast)
        from xdistill.data.verify import verify_documents

        n = verify_documents(args.directory, text_column=args.text_column,
                             messages_column=args.messages_column, invalid_utf8=args.invalid_utf8,
                             loss_roles=args.loss_roles, progress=not args.quiet)
        print(f"{args.directory}: verified {n['documents']} documents ({n['text']} text, "
              f"{n['chat']} chat, {n['empty']} empty): every row reads as training reads it")
    return 0
