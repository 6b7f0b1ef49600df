"""Review of xdistill/data (session 23): each test demonstrates one defect and fails before its fix."""

from __future__ import annotations

import json

import numpy as np
import pytest

from xdistill.errors import DataError


def test_review_s23_chat_column_of_json_strings_is_a_data_error_not_attribute_error(tmp_path):
    """Defect: a ``messages`` column stored as JSON *strings* (common in Hugging Face datasets
    that serialise conversations) is opened by :class:`DocumentSource` without a type check, and
    the first ``get`` dies in ``_chat_row_ok`` with ``AttributeError: 'pyarrow.lib.StringArray'
    object has no attribute 'values'`` -- a traceback from inside a loader worker, and the same
    from ``xdistill data info --verify`` (``verify_documents``). A text column of a wrong type
    already gets a one-line DataError ("text column 'text' has type int64, expected string or
    binary").

    Expected: a DataError naming the file, the column and its type (expected
    ``list<struct<role, content>>``), raised when the source is opened or the row is read.

    Suggested fix: xdistill/data/source.py, ``DocumentSource._open_one``: check that the chat
    column is a (large_)list of struct (as ``as_binary`` does for the text column) and raise a
    DataError otherwise.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from xdistill.data.source import DocumentSource
    from xdistill.data.verify import verify_documents

    conv = json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    path = tmp_path / "chats.parquet"
    pq.write_table(pa.table({"messages": [conv, conv]}), path)

    with pytest.raises(DataError, match="messages"):
        DocumentSource(path).get(0)
    with pytest.raises(DataError, match="chats.parquet"):
        verify_documents(path, progress=False)


def _loader(docs, tok, workers):
    from xdistill.data.config import DataConfig
    from xdistill.data.loader import build_loader

    cfg = DataConfig(seq_len=32, batch_size=2, num_workers=workers, seed=1, epochs=1,
                     multiprocessing_context="fork")
    return build_loader(cfg, tok, source=docs, rank=0, world_size=1)


@pytest.mark.parametrize("saved,now", [(2, 0), (0, 2)])
def test_review_s23_resume_with_num_workers_changed_to_or_from_zero_is_a_data_error(
        tiny_tok, saved, now):
    """Defect: a loader state saved with ``data.num_workers = 2`` and loaded into a loader with
    ``num_workers = 0`` (or the reverse) fails inside torchdata with a bare ``AssertionError:
    State doesn't contain key '_num_yielded' expected for single process dataloader`` (resp.
    ``'_snapshot' expected for multiprocess dataloader``). Changing 2 -> 1 workers gets the
    intended one-line DataError ("cannot resume data state saved as (shard, shards, ...) ...:
    keep ranks, num_workers, seed and data unchanged"); going to or from 0 workers (a natural
    thing to do when debugging a run) does not. Training resumes call ``loader.load_state_dict``
    directly (xdistill/train/mode.py ``load_loader_states``), so the user sees the assertion.

    Expected: a DataError that says the state was saved with another number of loader workers
    (num_workers), as for 2 -> 1.

    Suggested fix: xdistill/data/loader.py, the ``StatefulDataLoader`` subclass built in
    ``_loader_class``: override ``load_state_dict`` to compare the saved state's kind
    (``_snapshot`` present = multiprocess; its worker count) with ``self.num_workers`` and raise
    the DataError before torchdata asserts.
    """
    docs = [f"doc{i} " * 30 for i in range(40)]
    first = _loader(docs, tiny_tok, saved)
    it = iter(first)
    next(it)
    next(it)
    state = first.state_dict()
    del it
    resumed = _loader(docs, tiny_tok, now)
    with pytest.raises(DataError, match="num_workers"):
        resumed.load_state_dict(state)
        next(iter(resumed))


def test_review_s23_teacher_end_of_turn_keeps_its_loss_when_a_window_starts_at_it(get_tokenizer):
    """Defect: when a window boundary falls exactly at the end of a trained (assistant) message,
    the next window starts with the end-of-turn token. The student's loss mask is computed on the
    whole document, so the student's ``<|im_end|>`` there carries loss (end_of_turn=True); the
    collator computes the teacher's mask per segment from the loss spans clipped to the segment
    (``CrossTokenizerCollator._teacher_pieces``) and drops spans that became empty -- including
    the span that ends exactly at the segment start, whose end-of-turn token is the segment's
    first token. The teacher's ``<|eot_id|>`` then has loss False, and the chunk pairing it with
    the student's ``<|im_end|>`` (aligned together) is excluded from distillation
    (``losses.chunks.loss_chunks`` needs both masks), while the same token carries loss in both
    masks when no window boundary falls there.

    Expected: the teacher's end-of-turn token that opens the window carries loss, as the
    student's does.

    Suggested fix: xdistill/data/collator.py, ``_teacher_pieces``: keep the spans that end
    exactly at the segment start (clipped to ``[0, 0]``: ``token_loss_mask`` then marks only the
    special token at byte 0 as end of turn), i.e. filter on the unclipped span (``end >= a and
    start < e``) instead of on ``clipped_end > clipped_start``.
    """
    from xdistill.data.collator import CrossTokenizerCollator, TeacherTokenization
    from xdistill.data.dataset import PackedDataset
    from xdistill.data.packing import encode_document

    s_tok, t_tok = get_tokenizer("qwen2"), get_tokenizer("llama3")
    conv = (("user", "What is the capital of France?"), ("assistant", "Paris is the capital."),
            ("user", "ok"), ("assistant", "Good."))
    enc = encode_document(s_tok, 0, conv)
    eot = int(np.flatnonzero(enc.loss_T & (s_tok.table.roles_V[enc.ids_T] != 0))[0])
    assert enc.loss_T[eot - 1]          # the assistant content's last token, then its <|im_end|>
    # BOS + the tokens before the end of turn fill the first window exactly
    windows = list(PackedDataset([conv], s_tok, eot + 1, shuffle=False, epochs=1, add_bos=True))
    second = windows[1]
    assert int(second.segments[0].ids_T[0]) == int(enc.ids_T[eot])
    collator = CrossTokenizerCollator(s_tok, [TeacherTokenization("t", t_tok, add_bos=True)])
    batch = collator([second])
    view = batch.teacher("t")
    assert bool(batch.loss_mask_BTs[0, 1])             # the student's end of turn: loss
    chunk = int(view.s_chunk_BTs[0, 1])
    assert chunk >= 0
    t_pos = np.flatnonzero(view.t_chunk_BTt[0].numpy() == chunk)
    assert t_pos.size == 1
    assert t_tok.table.roles_V[int(view.input_ids_BTt[0, t_pos[0]])] != 0   # <|eot_id|>
    assert bool(view.loss_mask_BTt[0, t_pos[0]]), \
        "the teacher's end-of-turn token lost its loss at the window boundary"
