"""``xdistill align show``: print the chunk alignment of two tokenizations of a text.

Example::

    xdistill align show --student gpt2 --teacher mistral --text "Hello, world!"
    xdistill align show --student llama3 --teacher bert --file notes.txt --chunks space

For each chunk: its id, the student and teacher token spans, whether it is an exact pair (``=``:
one token each side with identical bytes), the chunk's bytes and, when it is not 1:1, the pieces
on each side. Then the unaligned regions of each side and the coverage. Bytes are shown escaped:
valid UTF-8 as text with ``\\n``/``\\t``/control characters escaped, other bytes as ``\\xNN``;
role tokens as ``<role:token>``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from xdistill.errors import XDistillError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xdistill align",
                                     description="Show the chunk alignment of two tokenizations.")
    sub = parser.add_subparsers(dest="action", required=True)
    show = sub.add_parser("show", help="print chunks, exact pairs, unaligned regions, coverage")
    show.add_argument("--student", required=True, help="student tokenizer (asset name or path)")
    show.add_argument("--teacher", required=True, help="teacher tokenizer (asset name or path)")
    src = show.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="the text to tokenize")
    src.add_argument("--file", help="a UTF-8 text file to tokenize")
    show.add_argument("--chunks", choices=["minimal", "space"], default="minimal")
    show.add_argument("--method", choices=["auto", "exact", "dp"], default="auto")
    show.add_argument("--add-special-tokens", action="store_true",
                      help="let each tokenizer add its BOS/EOS (default: none)")
    show.add_argument("--max-chunks", type=int, default=200,
                      help="print at most this many chunks (default 200; 0 = all)")
    return parser


def escape(data: bytes) -> str:
    """Readable, unambiguous bytes: UTF-8 text with ``\\``, ``\\n``, ``\\t``, ... escapes,
    bytes that are not valid UTF-8 (e.g. half a character) as ``\\xNN``."""
    out = []
    for ch in data.decode("utf-8", errors="surrogateescape"):
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:          # an undecodable byte
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch == "\\":
            out.append("\\\\")
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def _piece(tok, tid: int, phantom: int = 0) -> str:
    role = int(tok.table.roles_V[tid])
    if role:
        # deferred: xdistill.tokenization (~30 ms; keeps `xdistill align --help` fast)
        from xdistill.tokenization.table import ROLE_NAMES

        return f"<{ROLE_NAMES[role]}:{tok.hf.convert_ids_to_tokens(tid)}>"
    return escape(tok.table.token_bytes(tid)[phantom:])


def _pieces(tok, ids, a: int, b: int, phantom_T) -> list[str]:
    """Tokens ``a..b`` as text, each without its phantom bytes (``Encoding.phantom_bytes_T``)."""
    return [_piece(tok, int(ids[i]), int(phantom_T[i])) for i in range(a, b)]


def _runs(chunk_T: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs ``[a, b)`` of unaligned (-1) tokens."""
    out, start = [], None
    for i, c in enumerate(chunk_T.tolist() + [0]):
        if c < 0 and start is None:
            start = i
        elif c >= 0 and start is not None:
            out.append((start, i))
            start = None
    return out


def render(s_tok, t_tok, s_enc, t_enc, res, max_chunks: int = 200) -> str:
    """The alignment of one row as text (see the module docstring)."""
    s_ids, t_ids = s_enc.ids, t_enc.ids
    sp, tp = s_enc.phantom_prefix, t_enc.phantom_prefix
    s_ph, t_ph = s_enc.phantom_bytes_T(), t_enc.phantom_bytes_T()
    nc = int(res.n_chunks_B[0])
    lines = [f"student: {s_tok.name} ({s_tok.family}, {len(s_ids)} tokens, phantom {sp})   "
             f"teacher: {t_tok.name} ({t_tok.family}, {len(t_ids)} tokens, phantom {tp})",
             f"path: {'dp' if res.used_dp_B[0] else 'exact'}   chunks: {nc}   exact pairs: "
             f"{int(res.chunk_exact_BC[0].sum())}", ""]
    shown = nc if max_chunks <= 0 else min(nc, max_chunks)
    for k, (s0, s1, t0, t1, exact) in enumerate(res.chunks(0)[:shown]):
        s_p, t_p = _pieces(s_tok, s_ids, s0, s1, s_ph), _pieces(t_tok, t_ids, t0, t1, t_ph)
        head = f"{k:5d} {'=' if exact else ' '} s[{s0}:{s1}] t[{t0}:{t1}]"
        if s1 - s0 == 1 and t1 - t0 == 1 and s_p == t_p:
            lines.append(f"{head}  {s_p[0]!s}")
        else:
            lines.append(f"{head}  {''.join(s_p) if not s_p[0].startswith('<') else s_p[0]}"
                         f"    student {' | '.join(s_p)}    teacher {' | '.join(t_p)}")
    if shown < nc:
        lines.append(f"  ... {nc - shown} more chunks (--max-chunks 0 shows all)")
    for side, tok, ids, ph, chunk in (("student", s_tok, s_ids, s_ph, res.s_chunk_BTs[0]),
                                      ("teacher", t_tok, t_ids, t_ph, res.t_chunk_BTt[0])):
        runs = _runs(chunk[:len(ids)])
        lines += ["", f"unaligned {side} regions: {len(runs)}"]
        lines += [f"  [{a}:{b}]  {' | '.join(_pieces(tok, ids, a, b, ph))}" for a, b in runs]
    lines += ["", f"coverage: student {res.s_coverage_B[0]:.1%} "
                  f"({int((res.s_chunk_BTs[0][:len(s_ids)] >= 0).sum())}/{len(s_ids)}), "
                  f"teacher {res.t_coverage_B[0]:.1%} "
                  f"({int((res.t_chunk_BTt[0][:len(t_ids)] >= 0).sum())}/{len(t_ids)})"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # deferred: xdistill.align, xdistill.tokenization (~35 ms; keeps `xdistill align --help` fast)
    from xdistill.align import align_pair
    from xdistill.tokenization import load_tokenizer

    if args.file is not None:
        path = Path(args.file)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise XDistillError(f"--file {path}: cannot read it as UTF-8 text ({exc})") from exc
    else:
        text = args.text
    s_tok, t_tok = load_tokenizer(args.student), load_tokenizer(args.teacher)
    s_enc = s_tok.encode(text, add_special_tokens=args.add_special_tokens)
    t_enc = t_tok.encode(text, add_special_tokens=args.add_special_tokens)
    res = align_pair(s_enc.ids, t_enc.ids, s_tok.table, t_tok.table,
                     s_phantom=s_enc.phantom_bytes_T(), t_phantom=t_enc.phantom_bytes_T(),
                     chunks=args.chunks, method=args.method)
    print(render(s_tok, t_tok, s_enc, t_enc, res, args.max_chunks))
    return 0
