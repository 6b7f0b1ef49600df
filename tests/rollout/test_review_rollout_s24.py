"""Review of ``xdistill/rollout`` (scoring, engine, prompts, render, teacher_text): tests that
failed before the fixes in the same commit, one per defect found.

Checked and found correct (no test here):

* batch-size invariance of the cross-tokenizer scorer: teacher ids, loss masks and both chunk
  maps of each row are identical when the row is scored alone or in a batch of 3 (qwen2,
  mistral, llama3 teachers of a gpt2 student, including a tool segment);
* empty responses (one row or all rows of length 0) score without error;
* ``prompt_cut_offset``: for gpt2/qwen2/llama3 and SentencePiece students (mistral, phi3,
  llama-spm), plain and chat prompts with non-ASCII text, with and without BOS, the cut offset
  points exactly where the kept prompt row starts (role tokens have no table bytes);
* engine behaviour log-probs equal a recomputation (unpadded rows, float64 model, T = 0.7 and
  T = 1.3 / top-p 0.9, left-padded batch of plain and chat prompts with BOS): identical;
* ``nucleus_logprobs`` follows transformers' ``TopPLogitsWarper`` convention; the engine's stop
  detection, mask and finish reasons; ``VocabIndex.extensions`` (prefix-free minimal suffixes);
* byte-level teachers (qwen2, llama3) read a response holding special-token text or invalid UTF-8
  byte-identically;
* a prompt + response beyond the student's positions: ``HFGenerateEngine`` itself does not check
  (GPT-2 fails with ``IndexError`` inside ``generate``), but the on-policy trainer refuses
  ``rollout.max_prompt_len + rollout.max_new_tokens`` beyond the model's positions at start-up
  (``check_positions``), so no test.

Failing tests (each a defect):

1. ``test_prompt_dataset_of_only_empty_prompts_raises_instead_of_hanging`` /
   ``test_a_shard_of_only_empty_prompts_does_not_hang``: ``PromptDataset.__iter__`` skips empty
   prompts forever when a shard has no non-empty prompt (``epochs=None``): the iterator never
   yields nor raises (a blank prompt file; a rank whose shard holds only blank prompts hangs
   while the other ranks wait on it).
2. ``test_non_utf8_jsonl_prompt_file_is_a_data_error``: a ``.jsonl`` prompt file that is not
   UTF-8 escapes as a bare ``UnicodeDecodeError`` naming neither file nor line (every other bad
   line gives a ``DataError`` with ``<file> line <n>``).
3. ``test_special_token_text_in_the_response_gets_no_dummy_space`` (mistral, llama-spm, phi3):
   when the student's response spells a teacher special-token string (``</s>``, ``<s>`` in HTML,
   ...) the SentencePiece teacher reads a dummy-prefix space at the response start (``A:28`` ->
   ``A: 28``), the very regression the one-piece encoding exists to prevent.
4. ``test_valid_text_after_an_invalid_byte_gets_no_dummy_space``: after an invalid UTF-8 byte
   the next valid run is encoded alone, so a SentencePiece teacher reads an extra space the
   student never wrote (``ab\\xe4\\xb8cd`` -> ``ab\\xe4\\xb8 cd``).
5. ``test_a_teacher_that_read_no_response_byte_marks_nothing_unpaired``: a teacher row cut
   before any response token (small ``max_len``) marks every student loss token as unpaired
   ("the teacher read their bytes"), while reading one more token marks none.
6. ``test_a_prompt_cut_inside_a_character_gives_the_teacher_no_unseen_bytes``: when the
   student's left-cut prompt row starts inside a character (byte-level tokens), the cut offset
   is rounded back to the character start, so the teacher reads bytes the student never saw.
7. ``test_rollouts_from_segments_hold_exactly_the_segment_texts`` (mistral, llama-spm): for a
   SentencePiece student every segment gets a dummy-prefix space (``' Hello there. \\n[tool]
   x = 4\\n Done.'``): student and teacher read bytes that are in no segment.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager

import numpy as np
import pytest

from xdistill.data import TeacherTokenization
from xdistill.errors import DataError
from xdistill.rollout import JsonlPrompts, PromptDataset, RolloutScorer, rollouts_from_segments
from xdistill.rollout.teacher_text import teacher_region


@contextmanager
def _time_limit(seconds: float):
    def _raise(*_):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ------------------------------------------------------------------ 1. empty prompts hang
def test_prompt_dataset_of_only_empty_prompts_raises_instead_of_hanging(tmp_path):
    path = tmp_path / "blank.jsonl"
    path.write_text('{"prompt": "   "}\n{"prompt": ""}\n{"messages": []}\n')
    ds = PromptDataset(JsonlPrompts(path))        # epochs=None: the trainer's setting
    try:
        with _time_limit(3.0):
            with pytest.raises(DataError):
                next(iter(ds))
    except TimeoutError:
        pytest.fail("PromptDataset over only empty prompts loops forever without yielding "
                    "or raising")


def test_a_shard_of_only_empty_prompts_does_not_hang(tmp_path):
    """Rank 1 of 2 (no shuffle) owns only the blank prompt: it must not spin forever while rank
    0 trains (it should raise a DataError naming the problem)."""
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"prompt": "Hello there"}\n{"prompt": "  "}\n')
    ds = PromptDataset(JsonlPrompts(path), shuffle=False, rank=1, world_size=2)
    try:
        with _time_limit(3.0):
            with pytest.raises(DataError):
                next(iter(ds))
    except TimeoutError:
        pytest.fail("a shard holding only empty prompts loops forever")


# ------------------------------------------------------------------ 2. non-UTF-8 prompt file
def test_non_utf8_jsonl_prompt_file_is_a_data_error(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes('{"prompt": "ok"}\n{"prompt": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1\.jsonl"):
        JsonlPrompts(path)


# ------------------------------------------------------------------ 3./4. dummy-prefix spaces
def _row_bytes(tok, ids) -> bytes:
    return tok.table.concat(np.asarray(ids, dtype=np.int64))


@pytest.mark.parametrize("name", ["mistral", "llama-spm", "phi3"])
def test_special_token_text_in_the_response_gets_no_dummy_space(get_tokenizer, name):
    """From the definition: the teacher's response region holds exactly the response bytes (no
    phantom byte at the start: the prompt ends in ':' and the response starts with a digit, so
    no token straddles the boundary). The response merely contains the teacher's EOS string."""
    tok = get_tokenizer(name)
    special = tok.hf.convert_ids_to_tokens(int(tok.eos_id))
    prompt, resp = "Q: 3+4\nA:", f"28 apples {special} done".encode()
    reg = teacher_region(tok, prompt, resp)
    assert int(reg.phantom_T.sum()) == 0, reg.phantom_T.tolist()
    assert _row_bytes(tok, reg.ids_T) == resp, _row_bytes(tok, reg.ids_T)
    # same prompt, response without the special string: read without the space (as designed)
    plain = teacher_region(tok, prompt, b"28 apples done")
    assert _row_bytes(tok, plain.ids_T) == b"28 apples done"


@pytest.mark.parametrize("name", ["mistral", "llama-spm"])
def test_valid_text_after_an_invalid_byte_gets_no_dummy_space(get_tokenizer, name):
    """A byte-level student's response with a truncated character in the middle: the teacher's
    region tokens must spell exactly those bytes; a SentencePiece teacher reads an extra ' '
    before 'cd' (the run after the invalid bytes is encoded alone, with its dummy prefix)."""
    tok = get_tokenizer(name)
    resp = b"ab" + "\u4e2d".encode()[:2] + b"cd ef"
    reg = teacher_region(tok, "Say:", resp)
    assert reg.missing_bytes == 0
    assert _row_bytes(tok, reg.ids_T) == resp, _row_bytes(tok, reg.ids_T)


# ------------------------------------------------------------------ 5. unpaired when nothing read
def test_a_teacher_that_read_no_response_byte_marks_nothing_unpaired(get_tokenizer):
    s_tok, t_tok = get_tokenizer("gpt2"), get_tokenizer("mistral")
    ro = rollouts_from_segments(s_tok, ["Tell me a story about the sea"],
                                [[(" The sea is big and deep.", True)]])

    def score(max_len):
        spec = TeacherTokenization("t", t_tok, max_len=max_len, add_bos=True)
        sc = RolloutScorer(s_tok, [spec])(ro)
        return sc.batch.teacher("t"), sc.stats

    view3, stats3 = score(3)      # BOS, one prompt token, ' The': reads one response token
    assert int(view3.loss_mask_BTt.sum()) == 1 and int(view3.s_unpaired_BTs.sum()) == 0
    view2, stats2 = score(2)      # BOS, one prompt token: reads no response byte at all
    assert int(view2.loss_mask_BTt.sum()) == 0 and int((view2.t_chunk_BTt >= 0).sum()) == 0
    # "unpaired" = loss tokens the teacher read but no chunk pairs: the teacher read none
    assert int(view2.s_unpaired_BTs.sum()) == 0, int(view2.s_unpaired_BTs.sum())
    assert stats2.unaligned_frac["t"] <= stats3.unaligned_frac["t"]


# ------------------------------------------------------------------ 6. cut inside a character
def test_a_prompt_cut_inside_a_character_gives_the_teacher_no_unseen_bytes(get_tokenizer):
    """gpt2 spells U+1D518 with three byte-level tokens; a left-cut prompt row may start at
    the second or third. The teacher must read no context the student did not see: its prompt
    text (a plain prompt: the same bytes) is a suffix of the student's kept prompt bytes."""
    from xdistill.rollout.render import encode_prompts, prompt_cut_offset, teacher_prompt_text

    s_tok, t_tok = get_tokenizer("gpt2"), get_tokenizer("qwen2")
    prompt = "x \U0001D518\U0001D518 hello world"
    for keep in (3, 4):          # rows starting at b'\x98' and b'\x94\x98' of the second char
        row = encode_prompts(s_tok, [prompt], keep, add_bos=False)[0]
        seen = s_tok.table.concat(row)
        cut = prompt_cut_offset(s_tok, prompt, row.size)
        t_text = teacher_prompt_text(t_tok, s_tok, prompt, cut).encode()
        assert seen.endswith(t_text), (keep, seen, t_text)


# ------------------------------------------------------------------ 7. segments of an SP student
@pytest.mark.parametrize("name", ["mistral", "llama-spm"])
def test_rollouts_from_segments_hold_exactly_the_segment_texts(get_tokenizer, name):
    """``rollouts_from_segments`` builds a response from ``(text, is_llm)`` segments: its bytes
    (what student and teacher read after the prompt) must be the segments' texts. A
    SentencePiece student's per-segment encoding puts a dummy-prefix space before every segment
    (``Encoding.phantom_prefix`` reports it; it is dropped on the floor), so the rollout reads
    ``' Hello there. \\n[tool] x = 4\\n Done.'``: the ``A:▁28`` defect the teacher side avoids."""
    from xdistill.rollout.scoring import response_bytes

    tok = get_tokenizer(name)
    segs = [("Hello there.", True), ("\n[tool] x = 4\n", False), ("Done.", True)]
    ro = rollouts_from_segments(tok, ["Q:"], [segs], add_bos=True, finished=False)
    r = int(ro.response_len_B[0])
    raw, spans = response_bytes(tok.table, ro.response_ids_BTr[0, :r].numpy(),
                                ro.response_mask_BTr[0, :r].numpy())
    assert raw == "".join(t for t, _ in segs).encode(), raw
    assert spans.tolist() == [[0, 12], [26, 31]]


# ------------------------------------------------------------------ 3b. after a chat template
@pytest.mark.parametrize("name", ["mistral", "llama-spm", "phi3", "qwen2", "llama3", "gpt2"])
def test_special_token_text_after_a_chat_prompt_is_read_as_text(get_tokenizer, name):
    """The literal path after a rendered chat prompt (role tokens in the prefix): the region holds
    exactly the response bytes, no role token, and the prompt's tokens up to its last role token
    are the one-piece encoding's (phi3 puts a dummy space after every role token, mistral and
    llama-spm do not: the region follows the tokenizer's own rule)."""
    from xdistill.rollout.render import render_prompt

    tok = get_tokenizer(name)
    prefix = render_prompt(tok, [{"role": "user", "content": "What is 3+4?"}])
    specials = [tok.hf.convert_ids_to_tokens(int(i)) for i in (tok.eos_id, tok.bos_id)
                if i is not None]
    resp = f"7 {' and '.join(specials)} done".encode()
    reg = teacher_region(tok, prefix, resp)
    assert (tok.table.roles_V[reg.ids_T] == 0).all()
    body = _row_bytes(tok, reg.ids_T)
    assert body[int(reg.phantom_T[0]):] == resp and int(reg.phantom_T[1:].sum()) == 0, body
    natural = np.asarray(tok.encode(prefix + "7", add_special_tokens=False).ids)
    roles = np.flatnonzero(tok.table.roles_V[natural] != 0)
    if roles.size:
        last = int(roles[-1])
        assert reg.prefix_ids[:last + 1].tolist() == natural[:last + 1].tolist()
    # without special-token strings the literal path gives exactly the one-piece region
    from xdistill.rollout.teacher_text import _literal_region

    text = "7 and done"
    one = teacher_region(tok, prefix, text.encode())
    lit = _literal_region(tok, prefix, text)
    assert lit[0].tolist() == one.prefix_ids.tolist() and lit[1].tolist() == one.ids_T.tolist()
    assert lit[2].tolist() == one.phantom_T.tolist()
