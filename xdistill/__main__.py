"""``python -m xdistill``: the ``xdistill`` console script without the installed entry point."""

from xdistill.cli import entry

entry()
