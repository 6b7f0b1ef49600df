"""The covering probability from its definition (brute force over token sequences), shared by
the byte-credit tests of tests/losses and tests/rollout (importable from both: tests/ is on the
path through tests/conftest.py)."""

from __future__ import annotations


def p_cover(lm, x: bytes, prefix: tuple) -> float:
    """P(the text continues with ``x``) after ``prefix``: every token sequence whose tokens lie
    inside ``x`` but the last, which may stick out. ``lm.p(prefix)``: the next-token
    distribution; ``lm.vocab.pieces``: each id's bytes (ids 0 and 1 are BOS and END)."""
    if not x:
        return 1.0
    q, total = lm.p(prefix), 0.0
    for t in range(2, lm.vocab.V):
        bt = lm.vocab.pieces[t]
        if bt.startswith(x):
            total += q[t]
        elif x.startswith(bt):
            total += q[t] * p_cover(lm, x[len(bt):], prefix + (t,))
    return total
