"""A resumable, rank- and worker-sharded IterableDataset of packed windows.

Sharding (:mod:`xdistill.data.sharding`): in epoch ``e`` the documents are permuted with
``default_rng([seed, e])`` (identity order with ``shuffle=False``); the DataLoader worker ``w`` of
data-parallel rank ``r`` (``W`` workers per rank, ``R`` ranks) takes every ``R*W``-th document of
that permutation starting at ``r*W + w``. Every document is read exactly once per epoch by exactly
one (rank, worker) pair.

Resume: :meth:`PackedDataset.state_dict` returns the packing position *after the last window the
iterator handed out* (``epoch``, ``pos``, ``off``; see :mod:`xdistill.data.packing`) plus counters.
torchdata's ``StatefulDataLoader`` stores one such state per worker and hands it back to the same
worker after ``load_state_dict``, so a resumed loader yields exactly the remaining batches. A state
saved under another rank/worker layout or seed is refused (the document split would differ).

One iteration of the dataset runs ``epochs`` passes (``None``: forever; trainers stop at their step
budget). A new iteration starts at epoch 0 unless a state was loaded. With finite epochs, ranks may
get different numbers of windows: the trainer stops every rank at the first step any rank cannot
fill (``xdistill.train.core.agreed_micro_batches``).
"""

from __future__ import annotations

from xdistill.data.chat import CHAT_ROLES, as_conversation
from xdistill.data.packing import DEFAULT_LOSS_ROLES, encode_document, pack
from xdistill.data.sharding import ShardedSourceDataset
from xdistill.errors import DataError
from xdistill.tokenization.bos import resolve_add_bos


def doc_where(source, i: int) -> str:
    """Where document ``i`` of ``source`` is, for messages: its file and row when known."""
    if hasattr(source, "locate"):
        path, row = source.locate(i)
        return f"{path} row {row}"
    return f"document {i}"


class PackedDataset(ShardedSourceDataset):
    """Windows of ``window_len`` student tokens over a :class:`DocumentSource`.

    Args:
        source: the documents: a :class:`DocumentSource` or any sequence of str / conversations.
        student: the student tokenizer (``encode``, ``eos_id``, ``table``, ``hf``).
        window_len: student tokens per window, including the BOS when ``add_bos``.
        seed, shuffle: the per-epoch document permutation.
        rank, world_size: data-parallel position of this process.
        epochs: passes per iteration (None: forever).
        add_bos: windows start with the student's BOS (one per window, not per document);
            None: the student model's default (:mod:`xdistill.tokenization.bos`).
        loss_roles: chat roles whose content carries loss; end_of_turn: also their end marker.
    """

    def __init__(self, source, student, window_len: int, *, seed: int = 0, shuffle: bool = True,
                 rank: int = 0, world_size: int = 1, epochs: int | None = None,
                 add_bos: bool | None = None, loss_roles=DEFAULT_LOSS_ROLES, end_of_turn: bool = True,
                 specials_as_text: bool = True):
        super().__init__()
        if student.eos_id is None:
            raise DataError(f"student tokenizer {student.name!r} has no EOS token to separate documents")
        if add_bos and student.bos_id is None:
            raise DataError(f"add_bos is set but student tokenizer {student.name!r} has no BOS token")
        add_bos = resolve_add_bos(add_bos, student, "data.add_bos")
        if not 0 <= rank < world_size:
            raise DataError(f"rank {rank} outside world size {world_size}")
        if len(source) == 0:
            raise DataError("the data source has no documents")
        self.source, self.student = source, student
        self.window_len, self.seed, self.shuffle = int(window_len), int(seed), bool(shuffle)
        self.rank, self.world_size, self.epochs = int(rank), int(world_size), epochs
        self.add_bos, self.loss_roles, self.end_of_turn = add_bos, frozenset(loss_roles), end_of_turn
        self.specials_as_text = bool(specials_as_text)
        self.roles = CHAT_ROLES + tuple(sorted(self.loss_roles - set(CHAT_ROLES)))
        self._init_state()

    @staticmethod
    def _fresh_state() -> dict:
        return {"epoch": 0, "pos": 0, "off": 0, "windows": 0, "skipped_empty": 0}

    # a checkpoint written before ``data.specials_as_text`` existed read special-token strings
    # in text documents as special tokens
    LEGACY_BASIS = {"data.specials_as_text": False}

    def _position_basis(self) -> list[tuple[str, object]]:
        # a position is (document, student-token offset in it): another window length or BOS
        # setting continues at the next unread token (a supported resume), another tokenizer not
        return [("the student tokenizer", getattr(self.student, "fingerprint", None)),
                ("data.specials_as_text", self.specials_as_text)]

    # ------------------------------------------------------------------ iteration
    def _fetch(self, i: int):
        doc = self.source.get(i) if hasattr(self.source, "get") else self.source[i]
        if isinstance(doc, str):
            return doc
        return as_conversation(doc, doc_where(self.source, i), self.roles)

    def _encode(self, doc_index: int, doc):
        return encode_document(self.student, doc_index, doc, loss_roles=self.loss_roles,
                               end_of_turn=self.end_of_turn, where=doc_where(self.source, doc_index),
                               specials_as_text=self.specials_as_text)

    def __iter__(self):
        shard, num_shards = self.shard()
        st = self._begin_iteration()
        budget = self.window_len - int(self.add_bos)
        while self.epochs is None or st["epoch"] < self.epochs:
            order = self.order(st["epoch"], shard, num_shards)
            whole, windows = st["pos"] == 0 and st["off"] == 0, st["windows"]
            yield from pack(order, self._fetch, self._encode, st, budget, self.add_bos,
                            key=(st["epoch"], shard), bos_id=self.student.bos_id)
            st["epoch"], st["pos"], st["off"] = st["epoch"] + 1, 0, 0
            if len(order) == 0 and self.epochs is None:
                return  # more shards than documents: this shard never gets any
            if self.epochs is None and whole and len(order) and st["windows"] == windows:
                raise DataError(f"all {len(order)} documents of data shard {shard} (of "
                                f"{num_shards}: ranks x loader workers) are empty, so it can "
                                f"yield no window ({doc_where(self.source, int(order[0]))}: is "
                                "the text column the right one?)")
