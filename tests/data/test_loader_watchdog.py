"""The loader watchdog: a stuck worker ends the run with one message naming it (no silent hang)."""

from __future__ import annotations

import time

import pytest
from torch.utils.data import IterableDataset

from xdistill.data.loader import DataLoaderTimeout, WatchedIterator


pytestmark = pytest.mark.integration  # starts processes

class _Stuck(IterableDataset):
    """Yields one item, then blocks far longer than the watchdog allows."""

    def __iter__(self):
        yield 1
        time.sleep(60)
        yield 2


def test_stuck_worker_is_named_in_one_clear_error():
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(_Stuck(), batch_size=None, num_workers=1, timeout=2.0)
    it = WatchedIterator(loader, "data")
    assert int(next(it)) == 1
    t0 = time.monotonic()
    with pytest.raises(DataLoaderTimeout) as err:
        next(it)
    assert time.monotonic() - t0 < 30
    msg = str(err.value)
    assert "no batch from the data loader for 2 s" in msg
    assert "worker 0 (pid " in msg and "data.timeout_s" in msg


def test_other_errors_pass_through():
    class _Bad(IterableDataset):
        def __iter__(self):
            raise RuntimeError("corrupt shard x.arrow row 3")
            yield  # pragma: no cover

    from torchdata.stateful_dataloader import StatefulDataLoader

    it = WatchedIterator(StatefulDataLoader(_Bad(), batch_size=None, num_workers=0))
    with pytest.raises(RuntimeError, match="corrupt shard x.arrow row 3"):
        next(it)
