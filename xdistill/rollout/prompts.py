"""Prompt sources and a resumable, rank- and worker-sharded prompt stream.

A prompt row holds either plain text (column/key ``prompt``) or a chat conversation (column/key
``messages``: a list of ``{role, content}``). Sources:

* arrow / feather / parquet files or directories, through :class:`xdistill.data.DocumentSource`
  (memory-mapped arrow; the prompt column plays the role of the text column);
* ``.jsonl`` files (one JSON object per line), read into memory (prompt sets are small).

:class:`PromptDataset` is an ``IterableDataset`` of ``(index, prompt)`` with the same sharding and
resume contract as :class:`xdistill.data.PackedDataset` (:mod:`xdistill.data.sharding`): in
epoch ``e`` the prompts are permuted with ``default_rng([seed, e])``; worker ``w`` of rank ``r``
(``W`` workers, ``R`` ranks) takes every ``R*W``-th prompt starting at ``r*W + w``.
:meth:`PromptDataset.state_dict` is the position *after the last prompt handed out*; torchdata's
``StatefulDataLoader`` keeps one per worker. Empty prompts are skipped and counted.
"""

from __future__ import annotations

import json
from pathlib import Path

from xdistill.data.chat import CHAT_ROLES, as_conversation, is_empty_conversation
from xdistill.data.dataset import doc_where
from xdistill.data.sharding import ShardedSourceDataset
from xdistill.data.source import DocumentSource
from xdistill.errors import DataError


def _utf8_line(raw: bytes, path: Path, line_no: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} line {line_no}: not valid UTF-8 ({exc.reason} at byte "
                        f"{exc.start}); prompt files are UTF-8 JSON lines") from None


class JsonlPrompts:
    """Prompts of ``.jsonl`` files (``{"prompt": str}`` or ``{"messages": [...]}`` per line)."""

    def __init__(self, paths, *, prompt_key: str = "prompt", messages_key: str = "messages",
                 route_key: str = ""):
        self.rows: list = []
        # per row: the value of ``route_key`` (the teacher that scores it), when routing is on
        self.routes: list[str] = []
        self.where: list[str] = []
        for path in [paths] if isinstance(paths, (str, Path)) else paths:
            path = Path(path)
            if not path.is_file():
                raise DataError(f"prompt file {path} does not exist")
            before = len(self.rows)
            with path.open("rb") as fh:
                for line_no, raw in enumerate(fh, 1):
                    line = _utf8_line(raw, path, line_no)
                    if line.strip():
                        where = f"{path} line {line_no}"
                        obj = self._object(line, where)
                        self.rows.append(self._parse(obj, where, prompt_key, messages_key))
                        self.where.append(where)
                        if route_key:
                            self.routes.append(self._route(obj, where, route_key))
            if len(self.rows) == before:
                raise DataError(f"prompt file {path} holds no prompts (it is empty or blank): "
                                f"give one JSON object per line, {{\"{prompt_key}\": ...}} or "
                                f"{{\"{messages_key}\": [...]}}")

    @staticmethod
    def _object(line: str, where: str) -> dict:
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: invalid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise DataError(f"{where}: expected a JSON object")
        return obj

    @staticmethod
    def _route(obj: dict, where: str, key: str) -> str:
        value = obj.get(key)
        if not isinstance(value, str) or not value:
            raise DataError(f"{where}: prompts.route_column is {key!r} but this prompt has no "
                            f"string {key!r} naming the teacher that scores it")
        return value

    @staticmethod
    def _parse(obj: dict, where: str, prompt_key: str, messages_key: str):
        if isinstance(obj.get(prompt_key), str):
            return obj[prompt_key]
        if obj.get(messages_key) is not None:
            return as_conversation(obj[messages_key], where, CHAT_ROLES)
        raise DataError(f"{where}: needs a string {prompt_key!r} or a {messages_key!r} list "
                        f"(keys found: {', '.join(obj) or 'none'})")

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, i: int):
        return self.rows[i]


def open_prompts(paths, *, prompt_column: str = "prompt", messages_column: str = "messages",
                 invalid_utf8: str = "error", route_column: str = ""):
    """A prompt source (``len``, ``get(i)`` -> str or conversation) for the given paths; with
    ``route_column`` (``.jsonl`` only) its ``routes[i]`` names the teacher of prompt ``i``."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not paths:
        raise DataError("no prompt paths given")
    jsonl = [Path(p).suffix == ".jsonl" for p in paths]
    if all(jsonl):
        return JsonlPrompts(paths, prompt_key=prompt_column, messages_key=messages_column,
                            route_key=route_column)
    if any(jsonl):
        raise DataError("prompt paths mix .jsonl with arrow/parquet; use one format")
    if route_column:
        raise DataError(f"prompts.route_column ({route_column!r}) needs .jsonl prompt files")
    return DocumentSource(paths, text_column=prompt_column, messages_column=messages_column,
                          invalid_utf8=invalid_utf8)


class PromptDataset(ShardedSourceDataset):
    """``(index, prompt)`` pairs of this rank/worker's shard (see the module docstring)."""

    _words = ("prompt", "prompts", "prompts")

    def __init__(self, source, *, seed: int = 0, shuffle: bool = True, rank: int = 0,
                 world_size: int = 1, epochs: int | None = None):
        super().__init__()
        if not 0 <= rank < world_size:
            raise DataError(f"rank {rank} outside world size {world_size}")
        if len(source) == 0:
            files = getattr(source, "files", None) or getattr(source, "paths", None) or []
            raise DataError("the prompt source has no prompts"
                            + (f": {', '.join(map(str, files))}" if files else ""))
        self.source, self.seed, self.shuffle = source, int(seed), bool(shuffle)
        self.rank, self.world_size, self.epochs = int(rank), int(world_size), epochs
        self._has_prompt: bool | None = None     # any non-empty prompt in the source (lazy)
        self._init_state()

    @staticmethod
    def _fresh_state() -> dict:
        return {"epoch": 0, "pos": 0, "prompts": 0, "skipped_empty": 0}

    def _check_state(self, state: dict) -> None:
        missing = set(self._fresh_state()) - set(state)
        if missing:
            raise DataError(f"prompt state lacks keys {sorted(missing)}")

    def _fetch(self, i: int):
        doc = self.source.get(i)
        if isinstance(doc, str):
            return doc if doc.strip() else None
        where = self.source.where[i] if isinstance(self.source, JsonlPrompts) else \
            doc_where(self.source, i)
        conv = as_conversation(doc, where, CHAT_ROLES)
        return None if not conv or is_empty_conversation(conv) else conv

    def _any_prompt_elsewhere(self) -> bool:
        """After a whole epoch of empty prompts in this shard: whether another epoch can give
        one (shuffled, and some prompt of the whole source is non-empty). Without shuffling the
        shard is the same every epoch."""
        if not self.shuffle:
            return False
        if self._has_prompt is None:
            self._has_prompt = any(self._fetch(i) is not None for i in range(len(self.source)))
        return self._has_prompt

    def __iter__(self):
        shard, num_shards = self.shard()
        st = self._begin_iteration()
        while self.epochs is None or st["epoch"] < self.epochs:
            order = self.order(st["epoch"], shard, num_shards)
            if len(order) == 0:
                return  # more shards than prompts: this shard never gets any
            whole_epoch, yielded = st["pos"] == 0, 0
            while st["pos"] < len(order):
                i = int(order[st["pos"]])
                st["pos"] += 1
                prompt = self._fetch(i)
                if prompt is None:
                    st["skipped_empty"] += 1
                    continue
                st["prompts"] += 1
                yielded += 1
                yield i, prompt
            if whole_epoch and not yielded and not self._any_prompt_elsewhere():
                raise DataError(f"prompt shard {shard} of {num_shards}: all {len(order)} of its "
                                "prompts are empty (blank text or a conversation with nothing to "
                                "answer); give non-empty prompts, or fewer ranks/workers")
            st["epoch"], st["pos"] = st["epoch"] + 1, 0


def collate_prompts(items) -> tuple[tuple[int, ...], tuple]:
    """``collate_fn`` for a DataLoader over :class:`PromptDataset`: (indices, prompts)."""
    return tuple(i for i, _ in items), tuple(p for _, p in items)
