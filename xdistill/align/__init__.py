"""Chunk alignment of two tokenizations of the same text (numpy + numba only).

``align_batch`` / ``align_pair`` return an :class:`AlignmentResult`; see :mod:`xdistill.align.api`
for the definitions (exact O(n+m) path, banded edit-distance DP path, role tokens, chunk variants).
"""

from xdistill.align.api import AlignmentResult, align_batch, align_pair, set_align_threads

__all__ = ["AlignmentResult", "align_batch", "align_pair", "set_align_threads"]
