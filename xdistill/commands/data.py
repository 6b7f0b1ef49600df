"""``xdistill data prepare IN... -o DIR`` and ``xdistill data info DIR``.

``prepare`` converts jsonl / parquet / arrow / text / chat files into memory-mappable arrow IPC
shards plus ``index.json`` (see :mod:`xdistill.data.prepare`); rerunning it with unchanged inputs
does nothing. ``info`` prints a prepared directory's index summary.
"""

from __future__ import annotations

import argparse
import json
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
    prep.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    info = sub.add_parser("info", help="summarise a prepared directory")
    info.add_argument("directory")
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
        from xdistill.data.prepare import prepare

        index, wrote = prepare(args.inputs, args.output, text_column=args.text_column,
                               messages_column=args.messages_column, fmt=args.format,
                               invalid_utf8=args.invalid_utf8,
                               shard_bytes=max(1, int(args.shard_mb * (1 << 20))),
                               max_doc_bytes=int(args.max_doc_mb * (1 << 20)),
                               progress=not args.quiet)
        state = "wrote" if wrote else "up to date"
        print(f"{args.output}: {state}: {_summary(index)}")
        return 0
    path = Path(args.directory) / "index.json"
    try:
        index = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from None
    from xdistill.data.prepare import check_shards

    check_shards(args.directory, index)   # a truncated or missing shard is an error, not "fine"
    print(_summary(index))
    return 0
