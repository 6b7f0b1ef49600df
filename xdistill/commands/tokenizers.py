"""``xdistill tokenizers inspect NAME`` and ``xdistill tokenizers compare A B "text"``.

``inspect`` prints a tokenizer's family, vocabulary size, lossy flag, fingerprint, byte-length
statistics of its token-bytes table and its role table (special tokens by role).

``compare`` tokenizes one text with two tokenizers and prints them side by side, grouped into
spans that end on a byte offset where both tokenizations have a token boundary; each row shows the
byte span and the tokens of each side with the bytes they contribute.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from xdistill.commands import plain
from xdistill.tokenization import ROLE_NAMES, ROLE_TEXT, Encoding, Tokenizer, load_tokenizer


def show_bytes(data: bytes) -> str:
    """Printable form of token bytes: UTF-8 where valid, ``\\xNN`` escapes elsewhere."""
    text = data.decode("utf-8", errors="backslashreplace")
    return "".join(ch if ch.isprintable() or ch == "\\" else repr(ch)[1:-1] for ch in text)


def byte_stats(tok: Tokenizer) -> dict:
    """Length statistics of the token-bytes table over text tokens."""
    len_V = tok.table.lengths_V
    text_V = tok.table.roles_V == ROLE_TEXT
    lens = len_V[text_V]
    return {
        "text_tokens": int(text_V.sum()), "role_tokens": int((~text_V).sum()),
        "mean_bytes": round(float(lens.mean()), 3) if lens.size else 0.0,
        "median_bytes": float(np.median(lens)) if lens.size else 0.0,
        "max_bytes": int(lens.max()) if lens.size else 0,
        "single_byte_tokens": int((lens == 1).sum()), "empty_text_tokens": int((lens == 0).sum()),
        "distinct_byte_strings": len({tok.table.token_bytes(int(i)) for i in np.flatnonzero(text_V)}),
    }


def describe(tok: Tokenizer) -> dict:
    roles = {role: [[tid, s] for tid, s in items] for role, items in tok.role_table().items()}
    return {"name": tok.name, "source": tok.source, "family": tok.family,
            "vocab_size": tok.vocab_size, "lossy": tok.lossy, "nfc": tok.nfc,
            "fingerprint": tok.fingerprint, "bos_id": tok.bos_id, "eos_id": tok.eos_id,
            "pad_id": tok.pad_id, "unk_id": tok.unk_id, "bytes": byte_stats(tok), "roles": roles}


def print_inspect(info: dict, max_roles: int) -> None:
    print(f"name:        {info['name']}  ({info['source']})")
    print(f"family:      {info['family']}")
    print(f"vocab_size:  {info['vocab_size']}")
    print(f"lossy:       {info['lossy']}" + ("  (applies NFC: exact on NFC text)" if info["nfc"] else ""))
    print(f"fingerprint: {info['fingerprint']}")
    print(f"ids:         bos={info['bos_id']} eos={info['eos_id']} pad={info['pad_id']} unk={info['unk_id']}")
    b = info["bytes"]
    print(f"bytes:       {b['text_tokens']} text tokens, mean {b['mean_bytes']} B, median "
          f"{b['median_bytes']:g} B, max {b['max_bytes']} B, {b['single_byte_tokens']} single-byte, "
          f"{b['distinct_byte_strings']} distinct byte strings; {b['role_tokens']} role tokens")
    print("roles:")
    for role, items in info["roles"].items():
        shown = ", ".join(f"{tid} {s}" for tid, s in items[:max_roles])
        more = f", ... (+{len(items) - max_roles})" if len(items) > max_roles else ""
        print(f"  {role:<8} {len(items):>4}: {shown}{more}")


def common_spans(a: Encoding, b: Encoding) -> list[tuple[int, int, list[int], list[int]]]:
    """Group both encodings into spans ending where both have a token boundary.

    Returns ``(start, end, a_token_indices, b_token_indices)`` rows in text order.
    """
    rows = []
    i = j = 0
    start = 0
    while i < len(a) or j < len(b):
        ai, bj = [], []
        while True:
            end_a = int(a.ends[ai[-1]]) if ai else start
            end_b = int(b.ends[bj[-1]]) if bj else start
            if ai and bj and end_a == end_b:
                break
            if i < len(a) and (end_a <= end_b or j >= len(b)):
                ai.append(i)
                i += 1
            elif j < len(b):
                bj.append(j)
                j += 1
            else:
                break
        end = max(int(a.ends[ai[-1]]) if ai else start, int(b.ends[bj[-1]]) if bj else start)
        rows.append((start, end, ai, bj))
        start = end
    return rows


def _cell(tok: Tokenizer, enc: Encoding, idx: list[int]) -> str:
    parts = []
    for k in idx:
        tid = int(enc.ids[k])
        role = int(tok.table.roles_V[tid])
        shown = f"<{ROLE_NAMES[role]}>" if role != ROLE_TEXT else show_bytes(tok.table.token_bytes(tid))
        parts.append(f"{tid}:'{shown}'")
    return " ".join(parts)


def print_compare(ta: Tokenizer, tb: Tokenizer, text: str, add_special: bool) -> None:
    ea = ta.encode(text, add_special_tokens=add_special)
    eb = tb.encode(text, add_special_tokens=add_special)
    print(f"text: {len(text.encode('utf-8'))} bytes")
    for label, tok, enc in (("A", ta, ea), ("B", tb, eb)):
        extra = f", phantom prefix {enc.phantom_prefix} B" if enc.phantom_prefix else ""
        print(f"{label} = {tok.name} ({tok.family}, V={tok.vocab_size}{', lossy' if tok.lossy else ''}): "
              f"{len(enc)} tokens{extra}")
    rows = common_spans(ea, eb)
    width = max([len(_cell(ta, ea, r[2])) for r in rows] + [1])
    width = min(width, 60)
    print(f"{'bytes':<13} {'A':<{width}} | B")
    same = 0
    for start, end, ai, bj in rows:
        same += len(ai) == 1 and len(bj) == 1 and ta.table.token_bytes(int(ea.ids[ai[0]])) \
            == tb.table.token_bytes(int(eb.ids[bj[0]]))
        print(f"[{start:>4},{end:>4})  {_cell(ta, ea, ai):<{width}} | {_cell(tb, eb, bj)}")
    print(f"{len(rows)} spans, {same} identical 1:1 token pairs")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xdistill tokenizers", description=plain(__doc__).split("\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    ins = sub.add_parser("inspect", help="family, sizes, role table and fingerprint of a tokenizer")
    ins.add_argument("name", help="asset name, folder, tokenizer.json, .tiktoken, .model or .gguf")
    ins.add_argument("--json", action="store_true", help="print everything as one JSON object")
    ins.add_argument("--max-roles", type=int, default=8, help="role tokens shown per role")
    cmp_ = sub.add_parser("compare", help="two tokenizations of a text side by side, with byte spans")
    cmp_.add_argument("a", help="first tokenizer (same forms as inspect's NAME)")
    cmp_.add_argument("b", help="second tokenizer")
    cmp_.add_argument("text", help="the text both tokenize")
    cmp_.add_argument("--add-special-tokens", action="store_true",
                      help="let each tokenizer add its BOS/EOS template tokens")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.action == "inspect" and args.max_roles < 0:
        parser.error(f"--max-roles must be >= 0, got {args.max_roles}")
    if args.action == "inspect":
        info = describe(load_tokenizer(args.name))
        if args.json:
            print(json.dumps(info, ensure_ascii=False))
        else:
            print_inspect(info, args.max_roles)
        return 0
    print_compare(load_tokenizer(args.a), load_tokenizer(args.b), args.text, args.add_special_tokens)
    return 0
