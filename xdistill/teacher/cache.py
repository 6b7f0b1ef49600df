"""Teacher outputs kept across epochs: a window scored once is not scored again.

Legend: B batch, Tt teacher tokens, L a row's length up to its last non-padding token.

A multi-epoch off-policy run with ``data.shuffle: false`` packs the same windows every epoch, so
each teacher sees the same rows again; with ``teachers[i].worker.cache_mb > 0`` the worker keeps
every output row it computed (its tensors up to the row's last attended position, on CPU) keyed
by a hash of the row's token ids and attention mask, and copies a cached row into the output
instead of running the model. Positions after ``L`` (right padding of a batch whose rows are
longer) repeat the row's last position: a finite, normalised distribution that the loss masks.

The cache fills first come, first kept, until ``cache_mb`` is used, and never evicts: on the
cyclic access pattern of epochs an LRU cache smaller than one epoch would miss every time, while
a fixed subset hits in proportion to its size. Values are those of the first computation (the
same up to the float rounding of a differently shaped batched matmul).

Memory per teacher token: ``output: topk`` about ``12 K + 8`` bytes, ``projected`` ``4 Vs + 4``,
``logits`` ``4 Vt + 4`` (1 MB at Vt = 262,144: caching full logits only pays for short corpora).
"""

from __future__ import annotations

import hashlib

import torch

from xdistill.log import get_logger

log = get_logger("teacher")


def row_keys(ids_BTt: torch.Tensor, mask_BTt: torch.Tensor) -> list[tuple[bytes, int] | None]:
    """(hash, L) of every row: its ids and mask up to the last attended position; None for a
    row that attends to nothing."""
    mask = mask_BTt.detach().to("cpu", torch.bool)
    ids = ids_BTt.detach().to("cpu", torch.int64).numpy()
    pos_BTt = torch.arange(1, mask.shape[1] + 1).expand_as(mask)
    L_B = torch.where(mask, pos_BTt, 0).amax(dim=1).tolist()
    mask_np = mask.numpy()
    keys: list[tuple[bytes, int] | None] = []
    for b, L in enumerate(L_B):
        if L == 0:
            keys.append(None)
            continue
        h = hashlib.blake2b(ids[b, :L].tobytes(), digest_size=16)
        h.update(mask_np[b, :L].tobytes())
        keys.append((h.digest(), L))
    return keys


class OutputCache:
    """Output rows by :func:`row_keys` within a byte budget (see module doc)."""

    def __init__(self, budget_mb: float, name: str = "teacher"):
        self.budget = int(budget_mb * 2**20)
        self.name = name
        self.bytes = self.hits = self.misses = 0
        self._rows: dict[bytes, dict[str, torch.Tensor]] = {}
        self._full_logged = False

    def __len__(self) -> int:
        return len(self._rows)

    def lookup(self, keys: list) -> list[bool]:
        """Whether each row (a :func:`row_keys` entry or None) is cached; counts hits and misses."""
        found = [k is not None and k[0] in self._rows for k in keys]
        n = sum(found)
        self.hits += n
        self.misses += len(found) - n
        return found

    def fill(self, out: dict[str, torch.Tensor], b: int, key) -> None:
        """Write cached row ``key`` into row ``b`` of every output tensor."""
        row = self._rows[key[0]]
        for name, t_L in row.items():
            dst = out[name][b]
            L = t_L.shape[0]
            dst[:L].copy_(t_L, non_blocking=True)
            if dst.shape[0] > L:
                dst[L:].copy_(t_L[L - 1:L].expand((dst.shape[0] - L,) + tuple(t_L.shape[1:])))

    def store(self, out: dict[str, torch.Tensor], b: int, key) -> None:
        """Keep row ``b`` of the outputs under ``key`` while the budget allows."""
        if key is None or key[0] in self._rows:
            return
        L = key[1]
        size = sum(t[b, :L].numel() * t.element_size() for t in out.values())
        if self.bytes + size > self.budget:
            if not self._full_logged:
                log.info("teacher %r: output cache full (%.0f MB, %d rows); later rows are "
                         "computed each time", self.name, self.bytes / 2**20, len(self._rows))
                self._full_logged = True
            return
        self._rows[key[0]] = {n: t[b, :L].detach().to("cpu", copy=True) for n, t in out.items()}
        self.bytes += size

    def summary(self) -> str:
        total = self.hits + self.misses
        rate = self.hits / total if total else 0.0
        return (f"teacher {self.name!r} output cache: {self.hits} hits / {total} rows "
                f"({rate:.0%}), {len(self._rows)} rows kept, {self.bytes / 2**20:.1f} MB")


def contiguous_runs(rows: list[int]) -> list[slice]:
    """Sorted row indices as maximal runs of consecutive indices."""
    runs: list[slice] = []
    for r in rows:
        if runs and runs[-1].stop == r:
            runs[-1] = slice(runs[-1].start, r + 1)
        else:
            runs.append(slice(r, r + 1))
    return runs


__all__ = ["OutputCache", "contiguous_runs", "row_keys"]
