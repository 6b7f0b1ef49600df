"""An independent on-policy loop (plain PyTorch, no xdistill trainer) to tell a trainer bug from
the method: does k1 with a same-tokenizer teacher raise the harness student's accuracy?

    python benchmarks/quality/k1_reference.py --prep runs/q24_prep/<key> \
        --student runs/q24/lr_1e-05/runs/ce/seed0/export --mode k1 --lr 1e-4 --steps 300

Each step takes 43 training prompts of one token length (the harness's on-policy batch), samples
4 tokens per prompt from the student at temperature 1, scores them with the same-tokenizer
teacher (``teacher_same_big``) and takes one AdamW step (betas 0.9/0.95, weight decay 0.01, clip
1, constant lr) on one of:

* ``k1``        ``-mean_t sg(r_t) log p(y_t)``, ``r_t = log q(y_t) - log p(y_t)`` (Thinking
                Machines' per-token reverse-KL advantage, discount 0);
* ``k1mean``    the same with ``r`` centred on its batch mean;
* ``exact``     the exact reverse KL ``sum_v p log(p / q)`` at every sampled position;
* ``answer``    the exact reverse KL at the answer position only (the prompt's next token).

Before and every 100 steps: greedy accuracy on the validation split (the harness's scorer) and
the exact reverse KL at the answer position over the validation prompts. Prints a line at least
every 10 s.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from toyq.evaluate import greedy_accuracy, load_model
from toyq.task import prompt
from xdistill.tokenization import load_tokenizer

BATCH, NEW_TOKENS = 43, 4


def by_length(tok, texts) -> dict[int, torch.Tensor]:
    groups: dict[int, list] = {}
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        groups.setdefault(len(ids), []).append(ids)
    return {k: torch.tensor(v) for k, v in groups.items()}


@torch.no_grad()
def answer_kl(student, teacher, groups) -> float:
    """Mean exact KL(p || q) of the next token after each prompt (the answer position)."""
    total, n = 0.0, 0
    for ids in groups.values():
        lp = torch.log_softmax(student(input_ids=ids).logits[:, -1].float(), -1)
        lq = torch.log_softmax(teacher(input_ids=ids).logits[:, -1].float(), -1)
        total += float((lp.exp() * (lp - lq)).sum())
        n += len(ids)
    return total / n


@torch.no_grad()
def sample(student, ids: torch.Tensor) -> torch.Tensor:
    for _ in range(NEW_TOKENS):
        logits = student(input_ids=ids).logits[:, -1].float()
        ids = torch.cat([ids, torch.multinomial(torch.softmax(logits, -1), 1)], 1)
    return ids


def loss_of(mode: str, student, teacher, ids: torch.Tensor, start: int) -> torch.Tensor:
    with torch.no_grad():
        lq = torch.log_softmax(teacher(input_ids=ids).logits.float(), -1)[:, start - 1:-1]
    lp = torch.log_softmax(student(input_ids=ids).logits.float(), -1)[:, start - 1:-1]
    if mode in ("exact", "answer"):
        kl = (lp.exp() * (lp - lq)).sum(-1)
        return kl[:, 0].mean() if mode == "answer" else kl.mean()
    y = ids[:, start:, None]
    s_lp, t_lp = lp.gather(-1, y)[..., 0], lq.gather(-1, y)[..., 0]
    r = (t_lp - s_lp).detach()
    if mode == "k1mean":
        r = r - r.mean()
    return -(r * s_lp).mean()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prep", type=Path, required=True, help="the harness's prepared folder")
    ap.add_argument("--student", required=True, help="the warm student's export folder")
    ap.add_argument("--mode", choices=("k1", "k1mean", "exact", "answer"), default="k1")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    assets = json.loads((args.prep / "assets.json").read_text())
    tok = load_tokenizer(assets["tok_student"])
    student = load_model(args.student)
    teacher = load_model(assets["teacher_same_big"]["model"]).eval()
    valid_pairs = assets["corpus"]["valid"]
    valid = by_length(tok, [prompt(a, b) for a, b in valid_pairs])
    lines = (args.prep / "corpus" / "prompts.jsonl").read_text().splitlines()
    train = by_length(tok, [json.loads(x)["prompt"] for x in lines])
    lengths = [k for k, v in train.items() for _ in range(len(v))]
    opt = torch.optim.AdamW(student.parameters(), lr=args.lr, weight_decay=0.01,
                            betas=(0.9, 0.95))
    t0 = last = time.perf_counter()

    def report(step: int) -> None:
        acc = greedy_accuracy(student, tok, valid_pairs)["accuracy"]
        print(f"[k1_reference] {args.mode} lr {args.lr:g} step {step}: validation accuracy "
              f"{acc:.3f}, answer KL(p||q) {answer_kl(student, teacher, valid):.3f}", flush=True)

    report(0)
    for step in range(1, args.steps + 1):
        length = rng.choice(lengths)
        pool = train[length]
        ids = pool[torch.randint(len(pool), (BATCH,))]
        student.eval()
        ids = sample(student, ids)
        student.train()
        loss = loss_of(args.mode, student, teacher, ids, length)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        now = time.perf_counter()
        if step % 100 == 0 or step == args.steps:
            report(step)
            last = now
        elif now - last > 10:
            el = now - t0
            print(f"[k1_reference] step {step}/{args.steps} ({step / el:.1f} steps/s, ETA "
                  f"{(args.steps - step) * el / step:.0f} s)", flush=True)
            last = now
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
