"""How the two issue-24 teachers judge the answers a CE student samples (exploratory diagnostic).

    python benchmarks/quality/teacher_contrast.py --cache runs/q24_prep --runs runs/q24v9 \
        [--seeds 100,101,102,103,104] [--samples 8]     # writes credit24v9/teacher_contrast.json
    python benchmarks/quality/teacher_contrast.py --report   # the block GENERATED:contrast24

Not a pre-registered test: it reads what the ninth protocol left (its prepared task, its two
teachers, the CE students its k1 arms start from) and asks whether the cross-tokenizer teacher
scores the student's *answers* worse than the same-tokenizer one. Per seed, the CE student samples
``--samples`` answers to each of the 600 training prompts (T = 1, up to 4 tokens, as the k1 arms'
rollouts); a well-formed answer (digits then ``.``) is correct when the digits are ``a + b``. Each
teacher scores the answer's digits at the byte level: the log-probability of those bytes followed
by a non-digit (its own tokenization of prompt + digits, then the mass of every token whose bytes
do not start with a digit), which is what byte credit gives an answer unit. Reported per teacher:
mean log q of correct and of wrong answers, how often a wrong answer scores above a correct one
(1 - AUC), and the sequence-level k1 advantage log q - log p (p: the student's sampled log-prob of
its answer tokens), as raw per-seed figures and their means.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import torch

from toyq.run import record_and_report

HERE = Path(__file__).resolve().parent
RECORD = HERE / "credit24v9" / "teacher_contrast.json"
TEACHERS = {"cross": ("teacher_big", "tok_teacher"), "same": ("teacher_same_big", "tok_student")}
MAX_NEW = 4


def digit_start(tok) -> torch.Tensor:
    """[V] bool: the token's bytes start with an ASCII digit (byte-fallback ids included)."""
    out = []
    for i in range(tok.get_vocab_size()):
        s = tok.id_to_token(i)
        m = re.fullmatch(r"<0x([0-9A-F]{2})>", s)
        out.append(0x30 <= int(m.group(1), 16) <= 0x39 if m else s[:1].isdigit())
    return torch.tensor(out)


@torch.no_grad()
def answer_logq(model, tok, digit_V: torch.Tensor, prompt: str, digits: str) -> float | None:
    """log P(``digits`` then a non-digit | ``prompt``) under the canonical path; None when the
    prompt's tokens are not a prefix of the prompt + digits' tokens."""
    a = tok.encode(prompt, add_special_tokens=False).ids
    ab = tok.encode(prompt + digits, add_special_tokens=False).ids
    if ab[:len(a)] != a:
        return None
    logp_TV = torch.log_softmax(model(input_ids=torch.tensor([ab])).logits[0].double(), -1)
    path = sum(float(logp_TV[i - 1, ab[i]]) for i in range(len(a), len(ab)))
    return path + float(torch.logsumexp(logp_TV[-1][~digit_V[:logp_TV.shape[1]]], 0))


@torch.no_grad()
def sample_answers(model, tok, prompt: str, m: int, gen: torch.Generator) -> list[tuple[str, float]]:
    """``m`` samples of up to MAX_NEW tokens at T = 1: (decoded text, summed sampled log-prob)."""
    ids = tok.encode(prompt, add_special_tokens=False).ids
    x_BT = torch.tensor([ids] * m)
    lp_B = torch.zeros(m, dtype=torch.float64)
    for _ in range(MAX_NEW):
        logp_BV = torch.log_softmax(model(input_ids=x_BT).logits[:, -1].double(), -1)
        y_B1 = torch.multinomial(logp_BV.exp(), 1, generator=gen)
        lp_B += logp_BV.gather(1, y_B1)[:, 0]
        x_BT = torch.cat([x_BT, y_B1], 1)
    return [(tok.decode(row[len(ids):].tolist()), float(lp)) for row, lp in zip(x_BT, lp_B)]


def labeled_pairs(corpus: Path) -> set[tuple[int, int]]:
    """The (a, b) pairs whose worked answers are in the student's corpus."""
    text = "\n".join(json.loads(x)["text"] for x in corpus.read_text().splitlines() if x)
    return {(int(a), int(b)) for a, b in re.findall(r"Q: (\d+)\+(\d+)=\? A:", text)}


def auc(pos: list[float], neg: list[float]) -> float:
    """P(a correct answer's score > a wrong one's), ties counted half (rank form, O(n log n))."""
    both = sorted([(v, 1) for v in pos] + [(v, 0) for v in neg])
    rank_sum, i = 0.0, 0
    while i < len(both):
        j = i
        while j < len(both) and both[j][0] == both[i][0]:
            j += 1
        mid = (i + j + 1) / 2   # mean 1-based rank of the tie group
        rank_sum += mid * sum(1 for _, is_pos in both[i:j] if is_pos)
        i = j
    n_pos, n_neg = len(pos), len(neg)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def summarise(rows: list[dict]) -> dict:
    """Per teacher: answers counted, mean log q and k1 advantage of correct / wrong ones, 1 - AUC,
    the fraction of wrong answers with a positive advantage."""
    ok = [r for r in rows if r["ok"]]
    wrong = [r for r in rows if not r["ok"]]
    out = {"correct": len(ok), "wrong": len(wrong)}
    for name in TEACHERS:
        q_ok, q_wr = [r[name] for r in ok], [r[name] for r in wrong]
        adv_ok = [r[name] - r["logp"] for r in ok]
        adv_wr = [r[name] - r["logp"] for r in wrong]
        out[name] = {"logq_correct": statistics.fmean(q_ok), "logq_wrong": statistics.fmean(q_wr),
                     "wrong_above_correct": 1.0 - auc(q_ok, q_wr),
                     "adv_correct": statistics.fmean(adv_ok), "adv_wrong": statistics.fmean(adv_wr),
                     "wrong_adv_positive": sum(a > 0 for a in adv_wr) / len(adv_wr)}
    return out


def run_seed(seed: int, args, teachers: dict, tok_s, prompts: list, labeled: set, tick) -> dict:
    """One CE student's samples, scored by both teachers, summarised per prompt group."""
    from toyq.evaluate import load_model

    student = load_model(str(Path(args.runs) / "confirm" / "runs" / "ce" / f"seed{seed}" / "export"))
    student.eval()
    gen = torch.Generator().manual_seed(seed)
    rows, malformed, skipped = {"labeled": [], "unlabeled": []}, 0, 0
    for i, prompt in enumerate(prompts):
        a, b = map(int, re.findall(r"\d+", prompt))
        group = "labeled" if (a, b) in labeled else "unlabeled"
        for text, logp in sample_answers(student, tok_s, prompt, args.samples, gen):
            head, dot, _ = text.partition(".")
            if not (dot and head.strip().isdigit()):
                malformed += 1
                continue
            scores = {n: answer_logq(m, t, d, prompt, head) for n, (m, t, d) in teachers.items()}
            if any(v is None for v in scores.values()):
                skipped += 1
                continue
            rows[group].append(dict(scores, ok=head.strip() == str(a + b), logp=logp))
        tick(seed, i + 1, len(prompts))
    return {"seed": seed, "malformed": malformed, "skipped": skipped,
            **{g: summarise(r) for g, r in rows.items()}}


def measure(args) -> dict:
    from tokenizers import Tokenizer

    from toyq.evaluate import load_model

    prep = next(p for p in Path(args.cache).iterdir() if (p / "assets.json").exists())
    assets = json.loads((prep / "assets.json").read_text())
    toks = {n: Tokenizer.from_file(str(Path(assets[t]) / "tokenizer.json"))
            for n, (_, t) in TEACHERS.items()}
    teachers = {n: (load_model(assets[m]["model"]).eval(), toks[n], digit_start(toks[n]))
                for n, (m, _) in TEACHERS.items()}
    prompts = [json.loads(x)["prompt"] for x in
               (prep / "corpus" / "prompts_train.jsonl").read_text().splitlines() if x]
    labeled = labeled_pairs(prep / "corpus" / "student.jsonl")
    seeds = [int(s) for s in args.seeds.split(",")]
    t0, last = time.perf_counter(), [time.perf_counter()]

    def tick(seed, done, total):
        if time.perf_counter() - last[0] >= 10:
            last[0] = time.perf_counter()
            frac = (seeds.index(seed) + done / total) / len(seeds)
            el = last[0] - t0
            print(f"[teacher_contrast] seed {seed}: {done}/{total} prompts | "
                  f"{done / max(el, 1e-9) * 60:.0f} prompts/min | ETA {el / frac - el:.0f} s",
                  flush=True)
    per_seed = [run_seed(s, args, teachers, toks["same"], prompts, labeled, tick) for s in seeds]
    return {"prep": prep.name, "samples_per_prompt": args.samples, "max_new_tokens": MAX_NEW,
            "command": " ".join(["python", "benchmarks/quality/teacher_contrast.py", *sys.argv[1:]]),
            "seeds": per_seed}


def render(record: dict) -> str:
    """The generated block: per group and teacher, means over seeds (per-seed values in the
    record), and the paired per-seed difference cross - same of each measure."""
    seeds = record["seeds"]
    lines = ["## How the two teachers judge the CE student's answers (generated; exploratory, "
             "not a pre-registered test)", "",
             f"CE students of seeds {', '.join(str(s['seed']) for s in seeds)} (the ninth "
             f"protocol's k1 starting points), {record['samples_per_prompt']} samples per training "
             f"prompt at T = 1; log q = the teacher's log-probability of the answer's digits "
             "followed by a non-digit; advantage = log q - the student's sampled log p (sequence "
             "level, no baseline, no clamp). Means over seeds; `cross - same` is the mean paired "
             "per-seed difference (range over seeds).", ""]
    cols = (("logq_correct", "log q, correct"), ("logq_wrong", "log q, wrong"),
            ("wrong_above_correct", "wrong above correct (1 - AUC)"),
            ("adv_correct", "advantage, correct"), ("adv_wrong", "advantage, wrong"),
            ("wrong_adv_positive", "wrong with advantage > 0"))
    for group in ("unlabeled", "labeled"):
        n_ok = sum(s[group]["correct"] for s in seeds)
        n_wr = sum(s[group]["wrong"] for s in seeds)
        lines += [f"**{group} prompts** ({n_ok} correct, {n_wr} wrong well-formed answers):", "",
                  "| measure | cross-tokenizer teacher | same-tokenizer teacher | cross - same |",
                  "|---|---|---|---|"]
        for key, title in cols:
            c = [s[group]["cross"][key] for s in seeds]
            m = [s[group]["same"][key] for s in seeds]
            d = [x - y for x, y in zip(c, m)]
            lines.append(f"| {title} | {statistics.fmean(c):.3f} | {statistics.fmean(m):.3f} | "
                         f"{statistics.fmean(d):+.3f} ({min(d):+.3f} .. {max(d):+.3f}) |")
        lines.append("")
    bad = sum(s["malformed"] for s in seeds)
    lines.append(f"Malformed samples (not scored): {bad}; skipped (prompt tokens not a prefix): "
                 f"{sum(s['skipped'] for s in seeds)}. Raw per-seed figures: "
                 "`credit24v9/teacher_contrast.json`; command: `" + record["command"] + "`.")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cache", default="runs/q24_prep", help="the ninth protocol's --cache")
    p.add_argument("--runs", default="runs/q24v9", help="the ninth protocol's --out")
    p.add_argument("--seeds", default="100,101,102,103,104")
    p.add_argument("--samples", type=int, default=8, help="samples per prompt")
    p.add_argument("--report", action="store_true", help="only regenerate the block")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(record_and_report(RECORD, None if args.report else lambda: measure(args), render,
                            HERE / "RESULTS.md", "contrast24"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
