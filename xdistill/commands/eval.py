"""``xdistill eval``: score models before (or without) training.

    xdistill eval --config run.yaml [key=value ...]
        the off-policy run's held-out evaluation (eval.paths) at step 0: the student's loss and
        bits per byte, each teacher's loss term and coverage -- what training starts from
    xdistill eval --model M --data DIR [--tokenizer T] [--bos | --no-bos] [--seq-len N]
                  [--batch N] [--batches N]
        bits per byte of any causal LM (folder, .gguf file or asset name such as gemma3-270m) on
        prepared data; compare a teacher with a student before distilling (a teacher must know
        more than the student). Windows start with the BOS when the model adds one by default
        (Gemma does, SmolLM2 does not); --bos / --no-bos override that.

Prints one JSON object (and a readable line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys

from xdistill.commands import plain
from xdistill.errors import ConfigError
from xdistill.metrics import json_safe


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xdistill eval", description=plain(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="an off-policy run config: evaluate it at step 0")
    p.add_argument("--model", help="a causal LM: folder, .gguf file or asset name")
    p.add_argument("--data", nargs="+", help="prepared data (xdistill data prepare) to score on")
    p.add_argument("--tokenizer", default="", help="tokenizer spec (default: the model's)")
    p.add_argument("--bos", action=argparse.BooleanOptionalAction, default=None,
                   help="start every window with the BOS token (default: as the model does)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("overrides", nargs="*", help="dotted overrides of --config")
    return p


def score_model(args) -> dict:
    # deferred: torch, numpy (keeps `xdistill eval --help` fast)
    from xdistill.student.model import load_causal_lm
    from xdistill.tokenization import load_tokenizer
    from xdistill.train.evaluate import model_bits_per_byte
    # deferred: tqdm (with the scoring imports)
    from tqdm import tqdm

    if not args.data:
        raise ConfigError("--model needs --data (prepared held-out data)")
    if args.batches < 1:
        raise ConfigError(f"--batches must be >= 1, got {args.batches}")
    tok = load_tokenizer(args.tokenizer or args.model)
    model = load_causal_lm(args.model)
    rows = model.get_input_embeddings().num_embeddings
    if tok.vocab_size > rows:
        raise ConfigError(f"--tokenizer {tok.name!r} has a vocabulary of {tok.vocab_size} ids "
                          f"but --model {args.model!r} embeds only {rows}: give the model's own "
                          "tokenizer")
    with tqdm(total=args.batches, desc="eval", unit="batch", file=sys.stderr) as bar:
        out = model_bits_per_byte(model, tok, args.data, seq_len=args.seq_len,
                                  batch_size=args.batch, batches=args.batches, add_bos=args.bos,
                                  progress=lambda done: bar.update(done - bar.n))
    return {"model": args.model, "tokenizer": tok.name, "add_bos": out.pop("add_bos"), **out}


def score_run(args) -> dict:
    # deferred: yaml, torch, pyarrow (keeps `xdistill eval --help` fast)
    from xdistill.config import load_config
    from xdistill.train.config import OffPolicyConfig
    from xdistill.train.offpolicy import evaluate_offpolicy

    cfg = load_config(OffPolicyConfig, args.config, list(args.overrides))
    if not cfg.eval.paths:
        raise ConfigError(f"{args.config}: eval.paths is empty: nothing to evaluate on")
    return evaluate_offpolicy(cfg)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_intermixed_args(argv)
    if bool(args.config) == bool(args.model):
        raise ConfigError("give either --config (a run's evaluation) or --model (bits per byte "
                          "of one model)")
    if args.model and args.overrides:
        raise ConfigError(f"dotted overrides {args.overrides} only apply with --config")
    out = score_run(args) if args.config else score_model(args)
    print(json.dumps(json_safe(out), sort_keys=True, allow_nan=False))  # strict JSON: NaN -> null
    if "bpb" in out:
        print(f"bits/byte {out['bpb']:.4f} over {out['bytes']} bytes", file=sys.stderr)
    elif "eval/bpb" in out:
        print(f"student bits/byte {out['eval/bpb']:.4f}", file=sys.stderr)
    return 0
