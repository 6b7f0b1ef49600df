"""Tiny models, tokenizers and corpora built on the spot for the CPU recipes, tests and benchmarks.

    python tools/make_tiny_models.py [--out runs/tiny_assets] [--train-steps 40]
    (= python -m xdistill.tiny ...)

writes (paths used by ``configs/offpolicy_tiny_cpu.yaml``):

* ``corpus/train``, ``corpus/eval``: prepared arrow shards (``xdistill data prepare`` format) of
  Shakespeare passages from the asset cache (``$XDISTILL_ASSETS/corpus/shakespeare``); the eval
  split holds different passages;
* ``teacher_qwen2``: a tiny Llama-architecture causal LM over the Qwen2 tokenizer (cross-tokenizer
  teacher for a GPT-2 student), tokenizer saved alongside;
* ``teacher_gpt2``: the same over the GPT-2 tokenizer (same-tokenizer teacher).

Vocabulary-heavy models stay tiny (hidden 32, 2 layers): the output layer dominates. With
``--train-steps N`` each teacher is first trained N steps of plain next-token CE on the corpus so
its distribution carries some signal (random teachers are enough for smoke tests).

The helpers (:func:`train_bpe`, :func:`save_tiny_lm`, :func:`make_corpus`, :func:`passages`) are
used by the tests and benchmarks too.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path

from xdistill.assets.paths import asset_dir
from xdistill.commands import plain

TINY_LM = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True)


def shakespeare_dir() -> Path:
    return asset_dir() / "corpus" / "shakespeare"


def passages(max_chars: int = 600, limit: int | None = None,
             plays: list[str] | None = None) -> list[str]:
    """Shakespeare split at blank lines and regrouped into passages of up to ``max_chars``
    (``plays``: only these plays, by file stem, e.g. ``["tempest"]``; default all)."""
    paths = [p for p in sorted(shakespeare_dir().glob("*.txt")) if plays is None or p.stem in plays]
    paras = (para for path in paths for para in path.read_text(encoding="utf-8").split("\n\n"))
    return list(islice(group_paragraphs(paras, max_chars), limit))


def group_paragraphs(paras: Iterable[str], max_chars: int) -> Iterator[str]:
    """Paragraphs (stripped, empty ones dropped) joined by blank lines into passages of up to
    ``max_chars`` (a longer paragraph is a passage of its own)."""
    cur = ""
    for para in paras:
        para = para.strip()
        if not para:
            continue
        if cur and len(cur) + len(para) > max_chars:
            yield cur
            cur = ""
        cur = f"{cur}\n\n{para}" if cur else para
    if cur:
        yield cur


def make_corpus(out: Path, n_train: int = 400, n_eval: int = 40, max_chars: int = 600) -> tuple[Path, Path]:
    """Prepared ``train`` and ``eval`` splits under ``out`` (disjoint passages)."""
    # deferred: torch, pyarrow via xdistill.data (the corpus helpers need neither)
    from xdistill.data.prepare import prepare

    docs = passages(max_chars, limit=n_train + n_eval)
    if len(docs) < n_train + n_eval:
        raise SystemExit(f"only {len(docs)} passages in {shakespeare_dir()}, {n_train + n_eval} "
                         "needed: fetch the Shakespeare corpus asset with "
                         "`python tools/fetch_assets.py` (or `make assets`)")
    paths = []
    for split, part in (("train", docs[:n_train]), ("eval", docs[n_train:n_train + n_eval])):
        raw = out / f"{split}.jsonl"
        raw.parent.mkdir(parents=True, exist_ok=True)
        raw.write_text("".join(json.dumps({"text": d}) + "\n" for d in part), encoding="utf-8")
        prepare([raw], out / split, progress=False, overwrite=True)
        paths.append(out / split)
    return paths[0], paths[1]


def train_bpe(out: Path, vocab_size: int, texts: list[str]) -> Path:
    """A byte-level BPE trained on ``texts``, saved as a Hugging Face tokenizer folder."""
    # deferred: tokenizers, transformers (only building a tiny tokenizer needs them)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|eos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eos|>").save_pretrained(str(out))
    return out


def save_tiny_lm(out: Path, tokenizer_spec: str, *, seed: int = 0, **overrides) -> Path:
    """A random-init tiny Llama over ``tokenizer_spec``'s vocabulary, tokenizer saved with it."""
    # deferred: torch via xdistill.student (the corpus helpers need none)
    from xdistill.student.model import build_causal_lm
    # deferred: numpy via xdistill.tokenization (the corpus helpers need none)
    from xdistill.tokenization import load_tokenizer

    tok = load_tokenizer(tokenizer_spec)
    model = build_causal_lm("llama", dict(TINY_LM, vocab_size=tok.vocab_size, **overrides), seed=seed)
    model.save_pretrained(str(out))
    tok.hf.save_pretrained(str(out))
    return out


def pretrain(folder: Path, texts: list[str], steps: int, seq_len: int = 64, lr: float = 3e-3) -> None:
    """Briefly train a saved model with next-token CE on ``texts`` (in place)."""
    # deferred: torch, transformers (the corpus helpers need neither)
    import torch
    from transformers import AutoModelForCausalLM

    # deferred: numpy via xdistill.tokenization (the corpus helpers need none)
    from xdistill.tokenization import load_tokenizer

    tok = load_tokenizer(str(folder))
    ids = torch.from_numpy(tok.encode("\n\n".join(texts)).ids)
    n = (ids.numel() // seq_len) * seq_len
    rows = ids[:n].view(-1, seq_len)
    model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(0)
    for step in range(steps):
        batch = rows[torch.randint(0, rows.shape[0], (8,), generator=gen)]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 10 == 0 or step == steps - 1:
            print(f"  {folder.name} step {step} loss {loss.item():.3f}")
    model.save_pretrained(str(folder))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=plain(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/tiny_assets", help="output folder")
    parser.add_argument("--train-steps", type=int, default=40, help="CE steps per teacher")
    args = parser.parse_args(argv)
    out = Path(args.out)
    bad = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if bad is not None:
        parser.error(f"--out {out}: {bad} is a file, not a folder")
    train, _ = make_corpus(out / "corpus")
    print(f"corpus: {out / 'corpus'}")
    texts = passages(limit=200)
    for name, spec, seed in (("teacher_qwen2", "qwen2", 1), ("teacher_gpt2", "gpt2", 2)):
        folder = save_tiny_lm(out / name, spec, seed=seed)
        if args.train_steps:
            pretrain(folder, texts, args.train_steps)
        print(f"teacher: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
