"""Review s25 (align + data collator): each test demonstrates a defect and FAILS on the reviewed code."""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest

CONV = (("user", "What is the capital of France? Tell me."),
        ("assistant", "Paris is the capital of France, and a big city."))


def _windows(docs, tok, window_len, add_bos=False):
    from xdistill.data.dataset import PackedDataset

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # "data.add_bos is ..., but ..." notes
        return list(PackedDataset(docs, tok, window_len, shuffle=False, epochs=1,
                                  add_bos=add_bos))


def _collate(student, teacher, windows, **spec):
    from xdistill.data.collator import CrossTokenizerCollator, TeacherTokenization

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        col = CrossTokenizerCollator(student, [TeacherTokenization("t", teacher, **spec)])
    return col(windows)


def test_identity_view_is_not_used_when_the_teacher_has_another_chat_template(tmp_path):
    """Expected: chat data reaches every teacher rendered with *its own* chat template
    (xdistill/data/chat.py: "Every tokenizer renders it with its own chat template"), so a
    ChatML teacher sees ``<|im_start|>user ... <|im_end|>``.

    Actual: a teacher whose ``tokenizer.json`` equals the student's (same fingerprint: the
    fingerprint does not cover the chat template, which lives in ``tokenizer_config.json``) gets
    the identity view, i.e. the *student's* rendering. Base and instruct checkpoints of one
    family share ``tokenizer.json`` but not the template (a base student without a template,
    an instruct teacher with one), so the instruct teacher is scored on the plain
    ``user:\\n...`` text it was never trained on, and its ``<|im_end|>`` end of turn is gone.
    """
    from xdistill.assets.paths import tokenizer_dir
    from xdistill.data.chat import render_chat
    from xdistill.tokenization import load_tokenizer

    base = tmp_path / "qwen2-base"
    shutil.copytree(tokenizer_dir("qwen2"), base)
    (base / "chat_template.jinja").unlink(missing_ok=True)
    cfg = json.loads((base / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (base / "tokenizer_config.json").write_text(json.dumps(cfg))
    student, teacher = load_tokenizer(str(base)), load_tokenizer("qwen2")
    assert student.fingerprint == teacher.fingerprint        # the premise: same tokenizer.json
    assert not render_chat(student, CONV).own_template and render_chat(teacher, CONV).own_template

    batch = _collate(student, teacher, _windows([CONV], student, 128), add_bos=False)
    view = batch.teacher("t")
    ids = view.input_ids_BTt[0][view.attention_mask_BTt[0]].tolist()
    own = teacher.encode(render_chat(teacher, CONV).text).ids.tolist()
    assert ids[:len(own)] == own, (
        f"teacher fed {teacher.hf.decode(ids)!r}, not its own rendering "
        f"{render_chat(teacher, CONV).text!r} (identity view: {view.identity})")


def test_llama2_template_end_of_turn_carries_loss(get_tokenizer):
    """Expected (xdistill/data/chat.py module doc): with ``end_of_turn=True`` "the student
    learns where a turn stops, and every tokenizer marks its own end-of-turn token"
    (``</s>`` is named among them).

    Actual: the Llama-2-chat template that xdistill ships for ``llama-spm``
    (xdistill/tokenization/templates.py) writes an answer as ``" {content} </s>"``: a text
    token ``" "`` sits between the content's end and ``</s>``. ``token_loss_mask`` looks only at
    *the first* token at or after the span end, finds the space (not special) and marks
    nothing, so a Llama-2 student never gets loss on ``</s>`` and never learns to stop, while a
    ChatML teacher's ``<|im_end|>`` (aligned with that ``</s>`` as an end-of-turn pair) does.
    """
    from xdistill.data.packing import encode_document

    tok = get_tokenizer("llama-spm")
    enc = encode_document(tok, 0, CONV)
    roles = tok.table.roles_V[enc.ids_T]
    eos = np.flatnonzero(enc.ids_T == tok.eos_id)
    assert eos.size == 1 and roles[eos[0]] != 0                 # the template's </s>
    assert tok.table.token_bytes(int(enc.ids_T[eos[0] - 1])) == b" "   # " {content} </s>"
    assert enc.loss_T[eos[0] - 2], "the answer's last token carries loss"
    assert enc.loss_T[eos[0]], "the assistant's </s> (end of turn) carries no loss"


@pytest.mark.parametrize("teacher", ["llama3", "gemma3-270m"])
def test_truncated_teacher_row_uses_its_whole_max_len_when_the_template_writes_the_bos(
        get_tokenizer, teacher):
    """Expected (xdistill/data/collator.py module doc): "a teacher with ``max_len`` keeps the
    longest prefix of the window that fits". A teacher whose chat template writes its BOS
    itself gets no second BOS (``_starts_with``), so its row is the same with ``add_bos`` True
    or False, and so should its truncated row be.

    Actual: ``_teacher_rows`` reserves a token for the BOS whenever ``spec.add_bos`` is set
    (``budget0 = max_len - int(spec.add_bos)``), also when no BOS is prepended because the
    text already starts with it: every truncated row is one token shorter than ``max_len``
    allows (and than the same teacher with ``add_bos=False``), for every Llama-3 / Gemma
    teacher with its default ``add_bos=True`` on chat data.
    """
    s_tok, t_tok = get_tokenizer("qwen2"), get_tokenizer(teacher)
    windows = _windows([CONV], s_tok, 128)
    lengths = {}
    for add_bos in (False, True):
        full = _collate(s_tok, t_tok, windows, add_bos=add_bos).teacher("t")
        cut = _collate(s_tok, t_tok, windows, add_bos=add_bos, max_len=12).teacher("t")
        assert int(full.input_ids_BTt[0, 0]) == t_tok.bos_id          # written by the template
        lengths[add_bos] = int(cut.attention_mask_BTt[0].sum())
        assert full.input_ids_BTt[0, :lengths[add_bos]].tolist() == \
            cut.input_ids_BTt[0, :lengths[add_bos]].tolist()
    assert lengths[False] == 12
    assert lengths[True] == lengths[False], (
        f"add_bos=True keeps {lengths[True]} of max_len=12 teacher tokens, add_bos=False "
        f"{lengths[False]}: a BOS that is never prepended still takes a token")


def test_student_phantom_spaces_after_in_text_special_tokens_reach_the_aligner(tmp_path):
    """Expected: the aligner sees each side's *text* (api.py: table bytes minus phantom bytes),
    so two tokenizations of the same rendering with the same vocabulary align completely, in
    either direction. Phi-3 puts a ``▁`` before every piece of text between added tokens: in
    its chat rendering each ``<|user|>`` / ``<|end|>`` / ``<|assistant|>`` is followed by a
    ``"▁"`` token whose byte is not in the text (``Encoding.phantom_T``).

    Actual: the teacher's per-token phantoms are passed (``t_phantom_BTt``), the student's are
    dropped: ``packing.encode_text`` keeps only ``phantom_prefix``, ``Segment.phantom`` holds
    token 0's count and ``CrossTokenizerCollator._align`` passes ``s_phantom_B``. So for a Phi-3
    *student* every phantom ``"▁"`` counts as a real space: the texts differ, the row goes
    through the DP and those student tokens are left unaligned (here 8 of 36, coverage 0.78),
    while the teacher's identical ``"▁"`` tokens are transparent and join the next chunk
    (teacher coverage 1.0). Teacher: the same ``tokenizer.json`` with an equivalent decoder
    (another fingerprint, so not the identity view; same ids).
    """
    from xdistill.assets.paths import tokenizer_dir
    from xdistill.tokenization import load_tokenizer

    copy = tmp_path / "phi3-copy"
    shutil.copytree(tokenizer_dir("phi3"), copy)
    spec = json.loads((copy / "tokenizer.json").read_text())
    spec["decoder"] = {"type": "Sequence", "decoders": [spec["decoder"]]}   # same decoding
    (copy / "tokenizer.json").write_text(json.dumps(spec))
    student, teacher = load_tokenizer("phi3"), load_tokenizer(str(copy))
    assert student.fingerprint != teacher.fingerprint
    conv = (("user", "hi"), ("assistant", "Sure thing."), ("user", "Why?"),
            ("assistant", "Because."))
    batch = _collate(student, teacher, _windows([conv], student, 128), add_bos=False)
    view = batch.teacher("t")
    assert not view.identity
    assert bool((batch.input_ids_BTs == view.input_ids_BTt).all())     # the very same ids
    assert view.coverage_t == 1.0
    s_chunk = view.s_chunk_BTs[0][batch.attention_mask_BTs[0]]
    lost = [student.table.token_bytes(int(i)) for i, c in
            zip(batch.input_ids_BTs[0].tolist(), s_chunk.tolist()) if c < 0]
    assert view.coverage_s == 1.0, f"student tokens left unaligned: {lost}"
