"""``xdistill config show KIND [--config FILE] [key=value ...]``: a config with every field documented.

KIND names a run type (``offpolicy``, ``onpolicy``); the output is the fully resolved config (file +
overrides + defaults) as YAML with each field's documentation as a comment above it.
"""

from __future__ import annotations

import argparse
import importlib

from xdistill.commands import plain
from xdistill.config import describe, load_config
from xdistill.errors import ConfigError

# run kind -> "module:ConfigClass"
KINDS = {
    "offpolicy": "xdistill.train.config:OffPolicyConfig",
    "onpolicy": "xdistill.train.onpolicy_config:OnPolicyConfig",
}


def config_class(kind: str) -> type:
    if kind not in KINDS:
        raise ConfigError(f"unknown config kind {kind!r}; choose from {', '.join(KINDS)}")
    module_name, cls_name = KINDS[kind].split(":")
    try:
        return getattr(importlib.import_module(module_name), cls_name)
    except (ModuleNotFoundError, AttributeError):
        raise ConfigError(f"config kind {kind!r} is not available in this version") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="xdistill config", description=plain(__doc__))
    sub = parser.add_subparsers(dest="action", required=True)
    show = sub.add_parser("show", help="print a resolved config with its documentation")
    show.add_argument("kind", help=f"run kind: {', '.join(KINDS)}")
    show.add_argument("--config", help="YAML config file")
    show.add_argument("overrides", nargs="*", help="dotted overrides, e.g. loss.temperature=2.0")
    args, extra = parser.parse_known_args(argv)
    # ``show KIND --config F a=1``: argparse leaves overrides after an option unparsed
    bad = [x for x in extra if x.startswith("-") or "=" not in x]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)}")
    if args.action == "show":
        args.overrides = list(args.overrides) + extra
    cfg = load_config(config_class(args.kind), args.config, args.overrides)
    print(describe(cfg))
    return 0
