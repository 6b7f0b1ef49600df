"""Byte-level credit benchmark: the cost of scoring on-policy units by their bytes.

A GPT-2 student and a Qwen2 teacher (real tokenizers, 50k and 152k vocabularies) read 8
responses of ~60 words of Shakespeare; logits are random (``N(0, 3^2)``, float32) at the real
vocabulary sizes. Timed, median of ``--repeats``:

* ``terms``: :func:`xdistill.rollout.bytecredit.build_byte_terms` (host side, once per batch);
* ``credit``: :func:`xdistill.losses.bytecredit.evaluate_byte_credit` (both sides' bounds from
  the full logits, float64), against the reference in the same process: one log-softmax pass
  that reads both sides' sampled-token log-probs (what token credit costs).

    .venv/bin/python benchmarks/bytecredit.py [--rows 8] [--words 60] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from xdistill.assets import asset_dir, ensure_assets  # noqa: E402
from xdistill.data import TeacherTokenization  # noqa: E402
from xdistill.losses import ChunkAlignment  # noqa: E402
from xdistill.losses.bytecredit import credit_alignment, evaluate_byte_credit  # noqa: E402
from xdistill.losses.onpolicy import input_token_logprobs  # noqa: E402
from xdistill.rollout import RolloutScorer, rollouts_from_segments  # noqa: E402
from xdistill.rollout.bytecredit import build_byte_terms  # noqa: E402
from xdistill.tokenization import load_tokenizer  # noqa: E402


def make_case(rows: int, words: int, seed: int = 0) -> dict:
    """Scored rollouts of Shakespeare text, their stop-merged alignment and random logits."""
    s_tok, t_tok = load_tokenizer("gpt2"), load_tokenizer("qwen2")
    text = (asset_dir() / "corpus" / "shakespeare" / "hamlet.txt").read_text(encoding="utf-8")
    w = text.split()
    segs = [[(" " + " ".join(w[i * words:(i + 1) * words]), True)] for i in range(rows)]
    ro = rollouts_from_segments(s_tok, ["Q: say something."] * rows, segs)
    scored = RolloutScorer(s_tok, [TeacherTokenization("t", t_tok)])(ro)
    b, view = scored.batch, scored.batch.teacher("t")
    align = ChunkAlignment.from_view(view)
    merged = credit_alignment("k1", "teacher", align, scored.stop_BTs, b.loss_mask_BTs,
                              view.loss_mask_BTt)
    g = torch.Generator().manual_seed(seed)
    zs = torch.randn(*b.input_ids_BTs.shape, s_tok.vocab_size, generator=g) * 3
    zt = torch.randn(*view.input_ids_BTt.shape, t_tok.vocab_size, generator=g) * 3
    return dict(s_tok=s_tok, t_tok=t_tok, b=b, view=view, align=align, merged=merged,
                stop=scored.stop_BTs, zs=zs, zt=zt)


def terms(c):
    b, view = c["b"], c["view"]
    return build_byte_terms(c["s_tok"].table, c["t_tok"].table, b.input_ids_BTs,
                            view.input_ids_BTt, c["merged"], b.loss_mask_BTs, view.loss_mask_BTt,
                            c["stop"])


def credit(c, byte_terms):
    b, view = c["b"], c["view"]
    return evaluate_byte_credit("k1", "teacher", byte_terms, c["align"], c["stop"], c["zs"],
                                b.input_ids_BTs, b.loss_mask_BTs, c["zt"], view.input_ids_BTt,
                                view.loss_mask_BTt)


def reference(c):
    input_token_logprobs(c["zt"], c["view"].input_ids_BTt)
    input_token_logprobs(c["zs"], c["b"].input_ids_BTs, c["b"].loss_mask_BTs)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--words", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    ensure_assets()
    print(f"# byte credit, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}", flush=True)
    c = make_case(args.rows, args.words)
    byte_terms = terms(c)
    print(f"{args.rows} rows, {byte_terms.teacher.num_units} units, terms: teacher "
          f"{byte_terms.teacher.unit_K.numel()}, student {byte_terms.student.unit_K.numel()}",
          flush=True)
    credit(c, byte_terms)
    reference(c)                                   # warm-up
    t_terms, t_credit, t_ref = [], [], []
    t0 = time.perf_counter()
    for i in range(args.repeats):
        t_terms.append(timed(lambda: terms(c)))
        t_ref.append(timed(lambda: reference(c)))
        t_credit.append(timed(lambda: credit(c, byte_terms)))
        done = time.perf_counter() - t0
        print(f"  repeat {i + 1}/{args.repeats}: credit {t_credit[-1]:.3f} s, reference "
              f"{t_ref[-1]:.3f} s ({(i + 1) / done:.2f} repeats/s, ETA "
              f"{(args.repeats - i - 1) * done / (i + 1):.0f} s)", flush=True)
    med = statistics.median
    print(f"terms (host)       {med(t_terms):.3f} s")
    print(f"credit (bounds)    {med(t_credit):.3f} s")
    print(f"reference (logp)   {med(t_ref):.3f} s")
    print(f"credit / reference {med(c_ / r_ for c_, r_ in zip(t_credit, t_ref)):.2f}x")


if __name__ == "__main__":
    main()
