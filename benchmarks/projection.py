"""Projection build benchmark: time and peak RSS per (pair, method), plus exact-overlap counts.

Each (pair, method) runs in a fresh child process so peak RSS (``VmHWM``) figures don't mix;
the child reports tokenizer load time, build time, RSS after loading (the tokenizers' share) and
peak RSS. References measured in the same child: a pure-Python dict implementation of the exact
match (time ratio), and the memory a dense ``[Vs, Vt]`` bf16 matrix would need (NeMo-RL's
``to_dense()``). Exact overlap is counted by bytes (this package) and by raw vocabulary strings
(``Ġx`` vs ``▁x`` never match).

    .venv/bin/python benchmarks/projection.py [--quick] [--out benchmarks/results/projection.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PAIRS = [("qwen2", "llama3"), ("gpt2", "mistral")]
METHODS = ["exact", "multitoken", "multitoken,exact", "corpus,multitoken,exact"]
CORPUS = Path.home() / ".cache" / "xdistill" / "assets" / "corpus" / "shakespeare"
CORPUS_TEXTS = 2000


def _rss_now_mb() -> float:
    from xdistill.metrics import rss_mb
    now = rss_mb()
    return float("nan") if now is None else now


def _python_exact(student, teacher) -> int:
    """Reference: dict of teacher bytes, one Python lookup per student token."""
    t_tab, s_tab = teacher.table, student.table
    index = {}
    for t in range(t_tab.vocab_size):
        if t_tab.roles_V[t] == 0 and t_tab.lengths_V[t]:
            index.setdefault(t_tab.token_bytes(t), t)
    return sum(1 for s in range(s_tab.vocab_size)
               if s_tab.roles_V[s] == 0 and s_tab.lengths_V[s] and s_tab.token_bytes(s) in index)


def _raw_overlap(student, teacher) -> int:
    """Student text tokens whose raw vocabulary string is also a teacher text token's string."""
    def raw(tok):
        ids = [i for i in range(tok.vocab_size) if tok.table.roles_V[i] == 0 and tok.table.lengths_V[i]]
        return ids, tok.hf.convert_ids_to_tokens(ids)
    _, t_raw = raw(teacher)
    t_set = set(t_raw)
    _, s_raw = raw(student)
    return sum(1 for x in s_raw if x in t_set)


def child(student_name: str, teacher_name: str, method: str) -> dict:
    from xdistill.projection import BuildConfig, build_projection, save_projection
    from xdistill.metrics import peak_rss_mb
    from xdistill.projection.methods import exact_pairs
    from xdistill.tokenization import load_tokenizer

    t0 = time.perf_counter()
    student, teacher = load_tokenizer(student_name), load_tokenizer(teacher_name)
    load_s = time.perf_counter() - t0
    rss_loaded = _rss_now_mb()
    files = tuple(str(p) for p in sorted(CORPUS.glob("*.txt"))) if "corpus" in method else ()
    config = BuildConfig(methods=tuple(method.split(",")), top_k=4, corpus_files=files,
                         corpus_max_texts=CORPUS_TEXTS)
    t0 = time.perf_counter()
    proj = build_projection(student, teacher, config)
    build_s = time.perf_counter() - t0
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_{student_name}_{teacher_name}.npz"
    save_projection(proj, out)
    result = {"student": student_name, "teacher": teacher_name, "method": method,
              "Vs": student.vocab_size, "Vt": teacher.vocab_size, "load_s": load_s,
              "build_s": build_s, "rss_after_load_mb": rss_loaded,
              "peak_rss_mb": peak_rss_mb(),
              "nnz": proj.proj_VsVt.nnz, "npz_bytes": out.stat().st_size,
              "coverage": proj.meta["coverage"]["rows"]}
    if method == "exact":
        t0 = time.perf_counter()
        n_vec = exact_pairs(student, teacher)[0].size
        result["exact_vectorised_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        result["exact_python_count"] = _python_exact(student, teacher)
        result["exact_python_s"] = time.perf_counter() - t0
        result["exact_by_bytes"] = n_vec
        result["exact_by_raw_strings"] = _raw_overlap(student, teacher)
    return result


def run_child(s: str, t: str, method: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", s, t, method], capture_output=True,
                          text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"child {s} {t} {method} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(results: list[dict]) -> str:
    cpu = platform.processor() or platform.machine()
    lines = ["# Projection build benchmark", "",
             f"Hardware: {os.cpu_count()}-core CPU ({cpu}), no GPU, Python {platform.python_version()}; "
             "the machine was shared with other jobs, so times are upper bounds. Each row is a fresh "
             "child process; peak RSS = `VmHWM` of that child (includes the two loaded tokenizers, "
             "`rss after load`). Top-4 everywhere. Corpus: first "
             f"{CORPUS_TEXTS} paragraphs of the Shakespeare asset.", "",
             "| student × teacher | method | build s | tokenizer load s | peak RSS MB | RSS after load MB "
             "| nnz | .npz KB | dense bf16 [Vs,Vt] GB | rows exact / multitoken / corpus / role / unmapped |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        c = r["coverage"]
        dense_gb = r["Vs"] * r["Vt"] * 2 / 1e9
        lines.append(f"| {r['student']} ({r['Vs']:,}) × {r['teacher']} ({r['Vt']:,}) | {r['method']} "
                     f"| {r['build_s']:.1f} | {r['load_s']:.1f} | {r['peak_rss_mb']:.0f} "
                     f"| {r['rss_after_load_mb']:.0f} | {r['nnz']:,} | {r['npz_bytes'] / 1024:.0f} "
                     f"| {dense_gb:.1f} | {c['exact']:,} / {c['multitoken']:,} / {c['corpus']:,} / "
                     f"{c['role']:,} / {c['unmapped']:,} |")
    lines += ["", "Exact overlap (student text tokens with a teacher token of identical bytes vs. "
              "identical raw vocabulary string), and the vectorised exact match vs. a pure-Python "
              "dict reference in the same process:", "",
              "| student × teacher | by bytes | by raw strings | bytes / raw | vectorised s | Python dict s | speed-up |",
              "|---|---|---|---|---|---|---|"]
    for r in results:
        if r["method"] != "exact":
            continue
        assert r["exact_python_count"] == r["exact_by_bytes"], r
        lines.append(f"| {r['student']} × {r['teacher']} | {r['exact_by_bytes']:,} | "
                     f"{r['exact_by_raw_strings']:,} | {r['exact_by_bytes'] / max(1, r['exact_by_raw_strings']):.2f}x "
                     f"| {r['exact_vectorised_s']:.3f} | {r['exact_python_s']:.3f} | "
                     f"{r['exact_python_s'] / r['exact_vectorised_s']:.1f}x |")
    target = [r for r in results if (r["student"], r["teacher"], r["method"]) == ("qwen2", "llama3", "multitoken,exact")]
    if target:
        r = target[0]
        total = r["build_s"] + r["load_s"]
        lines += ["", f"Target (Qwen2 × Llama-3, multitoken+exact+top-4, < 60 s, < 3 GB): build "
                  f"{r['build_s']:.1f} s (+{r['load_s']:.1f} s loading both tokenizers = {total:.1f} s), "
                  f"peak RSS {r['peak_rss_mb'] / 1024:.2f} GB -> "
                  f"{'met' if total < 60 and r['peak_rss_mb'] < 3072 else 'NOT met'}; a dense bf16 "
                  f"matrix would need {r['Vs'] * r['Vt'] * 2 / 1e9:.1f} GB "
                  f"({r['Vs'] * r['Vt'] * 2 / 1e6 / r['peak_rss_mb']:.0f}x this peak RSS)."]
    lines += ["", "Notes: about 70% of the multitoken time is the tokenizer wrapper computing byte offsets "
              "for each re-tokenized token (`Tokenizer.encode_batch`), which the projection does not "
              "need; an ids-only batch encode would cut it roughly 3x. Qwen2 and Llama-3 share most of "
              "their English vocabulary (both extend tiktoken's cl100k), so on Shakespeare every chunk-start "
              "pair of those two is an exact pair and the corpus adds no rows there; for GPT-2 × Mistral it "
              "fills the rows of tokens seen in the corpus (`' downright' -> ' down'`)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=3, metavar=("STUDENT", "TEACHER", "METHOD"))
    ap.add_argument("--quick", action="store_true", help="only multitoken,exact on both pairs")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "projection.md"))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    methods = ["exact", "multitoken,exact"] if args.quick else METHODS
    results = []
    for s, t in PAIRS:
        for method in methods:
            r = run_child(s, t, method)
            print(f"{s} x {t} {method}: build {r['build_s']:.1f} s, peak RSS {r['peak_rss_mb']:.0f} MB",
                  flush=True)
            results.append(r)
    text = report(results)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
