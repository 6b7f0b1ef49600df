"""Logging helpers (stdlib ``logging``), rank-aware.

``get_logger(name)`` returns a logger under the ``xdistill`` namespace; ``init_logging()``
configures one console handler with a ``[xdistill rank N]`` prefix; ``log0`` logs on rank 0 only;
``warn_once`` emits a given warning text once per process.
"""

from __future__ import annotations

import logging
import os
import sys

_CONFIGURED = False
_WARNED: set[str] = set()


def rank() -> int:
    """Global rank from the torchrun environment (0 when not distributed)."""
    return int(os.environ.get("RANK", "0"))


def get_logger(name: str = "xdistill") -> logging.Logger:
    if not name.startswith("xdistill"):
        name = f"xdistill.{name}"
    return logging.getLogger(name)


class _CurrentStderr(logging.StreamHandler):
    """A console handler that writes to whatever ``sys.stderr`` is *now* (a caller or a test
    harness that swaps it after :func:`init_logging` keeps getting the lines, and never a write to
    a closed stream)."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def init_logging(level: int | str = logging.INFO, stream=None) -> logging.Logger:
    """Configure the ``xdistill`` logger once (idempotent)."""
    global _CONFIGURED
    logger = logging.getLogger("xdistill")
    if isinstance(level, str):
        level = logging.getLevelName(level.upper())
    logger.setLevel(level)
    if not _CONFIGURED:
        handler = logging.StreamHandler(stream) if stream is not None else _CurrentStderr()
        world = os.environ.get("WORLD_SIZE")
        prefix = f"[xdistill rank {rank()}]" if world and world != "1" else "[xdistill]"
        handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix} %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
        logger.propagate = False
        _CONFIGURED = True
    return logger


def log0(msg: str, *args, level: int = logging.INFO, logger: logging.Logger | None = None) -> None:
    """Log on global rank 0 only."""
    if rank() == 0:
        (logger or get_logger()).log(level, msg, *args)


def warn_once(msg: str, logger: logging.Logger | None = None) -> None:
    """Log a warning the first time this exact text is seen in this process."""
    if msg in _WARNED:
        return
    _WARNED.add(msg)
    (logger or get_logger()).warning(msg)
