"""Per-epoch permutation, rank x worker sharding and resumable state of a row source.

Shared by :class:`xdistill.data.PackedDataset` (documents) and
:class:`xdistill.rollout.PromptDataset` (prompts). In epoch ``e`` the rows ``0..n-1`` are permuted
with ``default_rng([seed, e])`` (identity order with ``shuffle=False``); the DataLoader worker ``w``
of data-parallel rank ``r`` (``W`` workers per rank, ``R`` ranks) takes every ``R*W``-th row of that
permutation starting at ``r*W + w``, so every row is read exactly once per epoch by exactly one
(rank, worker) pair.

Resume: the state is a dict of counters owned by the subclass (``_fresh_state``) plus a ``layout``
entry ``[shard, shards, seed, rows, shuffle, ...]`` (the subclass may add what its positions
depend on: :meth:`ShardedSourceDataset._position_basis`); torchdata's ``StatefulDataLoader`` keeps
one state per worker. A state saved under another layout is refused (the row split, or what a
position inside it means, would differ). A layout saved before the later entries existed is
compared on the entries it has.
"""

from __future__ import annotations

import copy

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from xdistill.errors import DataError


class ShardedSourceDataset(IterableDataset):
    """Base of an ``IterableDataset`` over ``len(self.source)`` rows read in sharded epoch order.

    Subclasses set ``source``, ``seed``, ``shuffle``, ``rank`` and ``world_size``, call
    :meth:`_init_state`, define ``_fresh_state()`` and start ``__iter__`` with
    :meth:`_begin_iteration`. ``_words`` names (state, rows, what to keep) in the layout error.
    """

    _words = ("data", "documents", "data")

    def _init_state(self) -> None:
        self._state = self._fresh_state()
        self._resume: dict | None = None

    @staticmethod
    def _fresh_state() -> dict:
        raise NotImplementedError

    # ------------------------------------------------------------------ sharding
    def shard(self) -> tuple[int, int]:
        """(shard id, number of shards) of the calling process/worker."""
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.rank * nw + wid, self.world_size * nw

    def order(self, epoch: int, shard: int, num_shards: int) -> np.ndarray:
        """Row indices of one shard in epoch ``epoch``."""
        n = len(self.source)
        perm = (np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle
                else np.arange(n))
        return perm[shard::num_shards]

    # ------------------------------------------------------------------ state
    def _layout(self) -> list:
        return list(self.shard()) + [self.seed, len(self.source), self.shuffle] + [
            value for _, value in self._position_basis()]

    def _position_basis(self) -> list[tuple[str, object]]:
        """Hook: (config key, value) pairs a saved position depends on besides the row order."""
        return []

    # basis keys added after checkpoints were written without them: key -> the value such a
    # checkpoint was written under (a key not listed here is simply not compared)
    LEGACY_BASIS: dict[str, object] = {}

    def _complete(self, layout: list, expected: list) -> list:
        """A saved layout shorter than this one (written before later basis keys existed),
        extended by the values those checkpoints were written under, where known."""
        keys = [key for key, _ in self._position_basis()]
        fixed = len(expected) - len(keys)     # shard, shards, seed, rows, shuffle: then the keys
        out = list(layout)
        for key in keys[len(out) - fixed:] if len(out) >= fixed else []:
            if key not in self.LEGACY_BASIS:
                break
            out.append(self.LEGACY_BASIS[key])
        return out

    def _basis_error(self, layout: list, expected: list) -> DataError | None:
        """The error naming the first setting (shuffle, then the hook's) that changed."""
        what, _, _ = self._words
        keys = ["shuffle"] + [key for key, _ in self._position_basis()]
        for key, saved, now in zip(keys, layout[4:], expected[4:]):
            if saved != now:
                return DataError(f"cannot resume: the checkpoint's {what} state was saved with "
                                 f"{key} = {saved!r}, the run now has {now!r}: a saved position "
                                 f"means another place; keep {key} unchanged to resume, or "
                                 "start afresh (--resume none)")
        return None

    def state_dict(self) -> dict:
        state = copy.deepcopy(self._resume if self._resume is not None else self._state)
        state["layout"] = self._layout()
        return state

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        layout = state.pop("layout", None)
        expected = self._layout()
        if layout is not None and len(layout) < len(expected):
            layout = self._complete(list(layout), expected)
        if layout is not None and list(layout) != expected[:len(layout)]:
            what, rows, keep = self._words
            if list(layout[:4]) == expected[:4]:
                raise self._basis_error(list(layout), expected)
            if layout[3] != expected[3]:
                raise DataError(f"cannot resume: the checkpoint's {what} state is a position in "
                                f"{layout[3]} {rows}, the {what} now has {expected[3]}; resume on "
                                f"the same {keep}, or start afresh (--resume none)")
            raise DataError(f"cannot resume {what} state saved as (shard, shards, seed, {rows}) = "
                            f"{tuple(layout)} in layout {tuple(expected)}: keep ranks, "
                            f"num_workers, seed and {keep} unchanged to resume exactly")
        self._check_state(state)
        self._resume = state

    def _check_state(self, state: dict) -> None:
        """Hook: refuse a loaded state (without its ``layout``) that this dataset cannot use."""

    def _begin_iteration(self) -> dict:
        """The state a new iteration continues from (the loaded one, else a fresh one)."""
        st = self._resume if self._resume is not None else self._fresh_state()
        self._resume = None
        self._state = st
        return st
