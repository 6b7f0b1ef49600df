"""Chat rendering (xdistill/data/chat.py) with real tokenizers' own templates: each message's
content is found where the template put it (not in template text equal to it), and byte offsets
map between two renderings when one template trims the contents and the other does not."""

from __future__ import annotations

import numpy as np
import pytest

from xdistill.data.chat import map_offset, render_chat, token_loss_mask
from xdistill.data.collator import CrossTokenizerCollator, TeacherTokenization
from xdistill.data.dataset import PackedDataset
from xdistill.tokenization.table import ROLE_TEXT

TEMPLATED = ["qwen2", "llama3", "smollm2-135m", "gemma3-270m", "phi3", "mistral"]


@pytest.mark.parametrize("name", TEMPLATED)
@pytest.mark.parametrize("reply", ["a", "assistant", "user", "model"])
def test_a_reply_equal_to_template_text_is_found_in_its_message(get_tokenizer, name, reply):
    """A one-letter or role-word reply also occurs in the template's text before it; the reply's
    span is the message itself, so its tokens (and the end-of-turn token) are the trained ones."""
    tok = get_tokenizer(name)
    conv = (("user", "Is e a vowel? Answer a or b, or name your role."), ("assistant", reply))
    r = render_chat(tok, conv)
    assert r.own_template
    raw = r.text.encode("utf-8")
    a, b = (int(x) for x in r.spans_M2[1])
    assert raw[a:b] == reply.encode() and a == raw.rfind(reply.encode())
    enc = tok.encode(r.text)
    mask = token_loss_mask(enc.ids, enc.starts, enc.ends, tok.table.roles_V,
                           r.loss_spans(frozenset({"assistant"})))
    trained = np.asarray(enc.ids)[mask]
    text_ids = [int(i) for i in trained if tok.table.roles_V[int(i)] == ROLE_TEXT]
    assert b"".join(tok.table.token_bytes(i) for i in text_ids) == reply.encode()
    assert len(trained) == len(text_ids) + 1   # the end-of-turn token after it


CONV = (("user", "Hi"), ("assistant", "  Sure, here you go:\n\n  - item  \n"),
        ("user", " more? "), ("assistant", "\tNo.\n"))


@pytest.mark.parametrize("s_name,t_name", [("qwen2", "gemma3-270m"), ("gemma3-270m", "qwen2"),
                                           ("qwen2", "llama3"), ("phi3", "gemma3-270m")])
def test_offsets_map_between_a_trimming_and_a_keeping_template(get_tokenizer, s_name, t_name):
    """Gemma's and Llama-3's templates trim contents, Qwen's and Phi-3's keep them: an offset
    inside a content maps inside the other rendering's content (never into template text such as
    ``<end_of_turn>``), onto the same byte of the content's core, monotonically."""
    s, t = get_tokenizer(s_name), get_tokenizer(t_name)
    rs, rt = render_chat(s, CONV), render_chat(t, CONV)
    src, dst = rs.text.encode("utf-8"), rt.text.encode("utf-8")
    args = (rs.spans_M2, rt.spans_M2, rs.n_bytes, rt.n_bytes, rs.core_M2, rt.core_M2)
    prev = 0
    for p in range(rs.n_bytes + 1):
        m = map_offset(p, *args)
        assert m >= prev, p
        prev = m
        for (a, b), (ta, tb), (ca, cb) in zip(rs.spans_M2, rt.spans_M2, rs.core_M2):
            if a < p < b:
                assert ta <= m <= tb, (p, m)
            if ca <= p < cb:
                assert dst[m] == src[p], (p, m)


def test_teacher_windows_of_a_trimmed_reply_keep_its_end_of_turn_whole(get_tokenizer):
    """Windows of a non-trimming student (Qwen2) cut at every length: the trimming teacher's
    (Gemma's) pieces never split ``<end_of_turn>`` and its trained bytes are the trimmed replies."""
    student, teacher = get_tokenizer("qwen2"), get_tokenizer("gemma3-270m")
    coll = CrossTokenizerCollator(student, [TeacherTokenization("gemma", teacher)])
    want = b"".join(c.strip().encode() for r, c in CONV if r == "assistant")
    eot = teacher.hf.convert_tokens_to_ids("<end_of_turn>")
    for seq_len in range(8, 48, 3):
        windows = list(PackedDataset([CONV], student, seq_len, shuffle=False, epochs=1))
        view = coll(windows).teacher("gemma")
        ids, loss = view.input_ids_BTt, view.loss_mask_BTt
        text = b"".join(teacher.table.token_bytes(int(i)) for i in ids[view.attention_mask_BTt])
        assert b"end_of_turn" not in text, seq_len                  # no split marker
        assert int((ids == eot).sum()) == 4, seq_len
        trained = [int(i) for i in ids[loss] if teacher.table.roles_V[int(i)] == ROLE_TEXT]
        assert b"".join(teacher.table.token_bytes(i) for i in trained) == want, seq_len
