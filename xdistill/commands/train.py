"""``xdistill train offpolicy|onpolicy --config X.yaml [--resume auto|PATH|none] [key=value ...]``.

Loads the config strictly (unknown keys and wrong types are errors naming the key), applies the
dotted overrides, validates everything that needs no compute (paths, batch-size divisibility,
tokenizer/projection pairs) and runs :func:`xdistill.train.offpolicy.run_offpolicy`. Under
``torchrun`` every rank runs this same command. ``xdistill train onpolicy --config Y.yaml`` runs
:func:`xdistill.train.onpolicy.run_onpolicy` the same way.
"""

from __future__ import annotations

import argparse
import os
import sys

from xdistill.commands import plain
from xdistill.config import blame_override, load_config
from xdistill.errors import ConfigError

# where ``python -m xdistill.tiny`` writes the tiny recipes' teachers and corpus
TINY_ASSETS = "runs/tiny_assets"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="xdistill train", description=plain(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=["offpolicy", "onpolicy"], help="trainer")
    parser.add_argument("--config", help="YAML run config")
    parser.add_argument("--resume", help="auto (latest complete checkpoint), a checkpoint folder, "
                        "or none; overrides checkpoint.resume")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.steps=10")
    args = parser.parse_intermixed_args(argv)
    overrides = list(args.overrides)
    if args.resume is not None:
        overrides.append(f"checkpoint.resume={'' if args.resume == 'none' else args.resume}")
    try:
        _run(args.kind, args.config, overrides)
    except ConfigError as exc:   # a range check after loading: name the override that set it
        exc = blame_override(exc, overrides, args.config)
        if TINY_ASSETS in str(exc) and "does not exist" in str(exc):
            exc = ConfigError(f"{exc}; the tiny recipes' teachers and corpus: build them once "
                              "with `python -m xdistill.tiny`")
        raise exc from None
    # deferred: torch via xdistill.distributed (keeps `xdistill train --help` fast)
    from xdistill import distributed as xdist

    xdist.destroy_distributed()
    return 0


def _run(kind: str, config: str | None, overrides: list[str]) -> None:
    if kind == "onpolicy":
        # deferred: torch, pyarrow via xdistill.train (keeps `xdistill train --help` fast)
        from xdistill.train.onpolicy_config import OnPolicyConfig

        cfg = load_config(OnPolicyConfig, config, overrides)
        _limit_numba_pool(cfg.train.num_threads)
        # deferred: torch, pyarrow via xdistill.train (keeps `xdistill train --help` fast)
        from xdistill.train.onpolicy import run_onpolicy

        run_onpolicy(cfg)
    else:
        # deferred: torch, pyarrow via xdistill.train (keeps `xdistill train --help` fast)
        from xdistill.train.config import OffPolicyConfig

        cfg = load_config(OffPolicyConfig, config, overrides)
        _limit_numba_pool(cfg.train.num_threads)
        # deferred: torch, pyarrow via xdistill.train (keeps `xdistill train --help` fast)
        from xdistill.train.offpolicy import run_offpolicy

        run_offpolicy(cfg)


def _limit_numba_pool(num_threads: int) -> None:
    """``train.num_threads`` sizes numba's pool before numba starts (``NUMBA_NUM_THREADS``, unless
    already set): a later ``numba.set_num_threads`` only masks pool threads, which keep spinning
    between parallel regions and slowed small CPU steps ~4x with two runs on two cores."""
    if num_threads and "numba" not in sys.modules:
        os.environ.setdefault("NUMBA_NUM_THREADS", str(max(1, min(num_threads, os.cpu_count() or 1))))
