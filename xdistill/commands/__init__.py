"""Thin CLI entry modules: one per ``xdistill`` subcommand, each with ``main(argv) -> int``."""

import re as _re

_ROLE = _re.compile(r":(?:func|class|mod|meth|attr|data|exc):`~?([^`]+)`")


def plain(doc: str) -> str:
    """A module docstring as ``--help`` text: reST markup (````x````, ``:func:`a.b```) removed."""
    return _ROLE.sub(r"\1", doc or "").replace("``", "")
