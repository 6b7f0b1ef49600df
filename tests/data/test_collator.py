"""CrossTokenizerCollator with real tokenizer pairs and the real aligner."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from xdistill.data.collator import CrossTokenizerCollator, TeacherTokenization
from xdistill.data.dataset import PackedDataset
from xdistill.tokenization.table import ROLE_TEXT

TEXTS = [
    "The quick brown fox jumps over the lazy dog. " * 6,
    "naïve café — 東京 🙂🙃 tabs\tand\nnewlines  double  spaces, ünïcödé",
    "def f(x):\n    return x * 2  # code 12345\n",
    "Distillation transfers knowledge from teachers to students even when tokenizers differ. " * 4,
]
CHATS = [
    [("user", "What is 2+2?"), ("assistant", "It is 4.")],
    [("system", "Be brief."), ("user", "Name a colour."), ("assistant", "Blue, like the sky."),
     ("user", "Another?"), ("assistant", "Green.")],
]
PAIRS = [("gpt2", "qwen2"), ("gpt2", "mistral"), ("llama3", "bert")]


def _windows(student, docs, seq_len=64, add_bos=False):
    return list(PackedDataset(docs, student, seq_len, shuffle=False, epochs=1, add_bos=add_bos))


def _row_bytes(table, ids):
    return [table.token_bytes(int(i)) for i in ids]


def _pieces(table, ids):
    """Text bytes of a row split at role tokens (document separators)."""
    out, cur = [], []
    for i in ids:
        if table.roles_V[int(i)] != ROLE_TEXT:
            out.append(b"".join(cur))
            cur = []
        else:
            cur.append(table.token_bytes(int(i)))
    return out + [b"".join(cur)]


def _check_chunks(batch, view, s_table, t_table, lossy):
    for b in range(batch.input_ids_BTs.shape[0]):
        s_ids = batch.input_ids_BTs[b].numpy()
        t_ids = view.input_ids_BTt[b].numpy()
        sc, tc = view.s_chunk_BTs[b].numpy(), view.t_chunk_BTt[b].numpy()
        n = int(view.chunk_valid_BC[b].sum())
        assert sorted(set(sc[sc >= 0])) == list(range(n)) == sorted(set(tc[tc >= 0]))
        assert np.all(np.diff(sc[sc >= 0]) >= 0) and np.all(np.diff(tc[tc >= 0]) >= 0)
        assert not np.any(sc[~batch.attention_mask_BTs[b].numpy()] >= 0)
        for c in range(n):
            sb = b"".join(_row_bytes(s_table, s_ids[sc == c]))
            tb = b"".join(_row_bytes(t_table, t_ids[tc == c]))
            if lossy:
                assert sb.decode().strip().lower() or not tb
            elif sb != tb:
                assert sb.strip() == tb.strip(), (c, sb, tb)  # phantom-prefix space only


@pytest.mark.parametrize("s_name,t_name", PAIRS)
def test_teacher_tokens_cover_the_student_bytes(get_tokenizer, s_name, t_name):
    s_tok, t_tok = get_tokenizer(s_name), get_tokenizer(t_name)
    windows = _windows(s_tok, TEXTS)
    # no BOS on either side here (Mistral adds its <s> by default): rows compare byte for byte
    batch = CrossTokenizerCollator(s_tok, [TeacherTokenization("t", t_tok, add_bos=False)])(windows)
    view = batch.teacher("t")
    assert batch.input_ids_BTs.shape[1] == 64 and not view.identity
    _check_chunks(batch, view, s_tok.table, t_tok.table, t_tok.lossy)
    for b in range(len(windows)):
        s_mask, t_mask = batch.attention_mask_BTs[b], view.attention_mask_BTt[b]
        s_p = _pieces(s_tok.table, batch.input_ids_BTs[b][s_mask].numpy())
        t_p = _pieces(t_tok.table, view.input_ids_BTt[b][t_mask].numpy())
        if t_tok.eos_id is None:  # BERT: no separator tokens, compare the whole row
            s_p, t_p = [b"".join(s_p)], [b"".join(t_p)]
        assert len(s_p) == len(t_p)
        for sp, tp in zip(s_p, t_p):
            if t_tok.lossy:
                norm = lambda x: b"".join(x.lower().split())  # noqa: E731
                assert abs(len(norm(sp)) - len(norm(tp))) <= 0.2 * len(norm(sp)) + 2
            else:
                assert tp in (sp, b" " + sp), (sp, tp)  # SentencePiece may add its phantom space
    # lossy (BERT) coverage is the aligner's business; here it is low (see the report)
    assert view.coverage_s > (0.1 if t_tok.lossy else 0.85)
    assert batch.stats.unaligned_fraction["t"] == pytest.approx(1 - view.coverage_s)
    assert batch.stats.student_tokens == int(batch.attention_mask_BTs.sum())


def test_identity_view_for_same_tokenizer(get_tokenizer):
    tok = get_tokenizer("gpt2")
    batch = CrossTokenizerCollator(tok, [TeacherTokenization("same", get_tokenizer("gpt2"))])(_windows(tok, TEXTS))
    view = batch.teacher("same")
    assert view.identity and torch.equal(view.input_ids_BTt, batch.input_ids_BTs)
    pos = torch.arange(batch.input_ids_BTs.shape[1]).expand_as(view.s_chunk_BTs)
    assert torch.equal(view.s_chunk_BTs, torch.where(batch.attention_mask_BTs, pos, -1))
    assert torch.equal(view.chunk_exact_BC, view.chunk_valid_BC)
    assert view.coverage_s == 1.0


def test_truncation_at_a_shared_byte_boundary(get_tokenizer):
    s_tok, t_tok = get_tokenizer("gpt2"), get_tokenizer("qwen2")
    windows = _windows(s_tok, TEXTS)
    batch = CrossTokenizerCollator(s_tok, [TeacherTokenization("t", t_tok, max_len=21)])(windows)
    view = batch.teacher("t")
    assert view.input_ids_BTt.shape[1] <= 21
    for b in range(len(windows)):
        t_ids = view.input_ids_BTt[b][view.attention_mask_BTt[b]].numpy()
        s_ids = batch.input_ids_BTs[b].numpy()[view.s_chunk_BTs[b].numpy() >= 0]
        t_bytes = b"".join(_row_bytes(t_tok.table, t_ids))
        # the teacher covers exactly the bytes of the aligned student prefix ...
        assert t_bytes == b"".join(_row_bytes(s_tok.table, s_ids))
        # ... which is a prefix of the student row (the cut is at a student token boundary)
        row = b"".join(_row_bytes(s_tok.table, batch.input_ids_BTs[b][batch.attention_mask_BTs[b]].numpy()))
        assert row.startswith(t_bytes) and len(t_bytes) > 0
    assert view.coverage_s < 1.0


def test_bos_on_both_sides_is_a_chunk_and_one_sided_is_unaligned(get_tokenizer):
    s_tok, t_tok = get_tokenizer("llama3"), get_tokenizer("mistral")
    windows = _windows(s_tok, TEXTS[:2], add_bos=True)
    batch = CrossTokenizerCollator(s_tok, [TeacherTokenization("b", t_tok, add_bos=True),
                                           TeacherTokenization("n", t_tok, add_bos=False)])(windows)
    assert torch.all(batch.input_ids_BTs[:, 0] == s_tok.bos_id)
    both, one = batch.teacher("b"), batch.teacher("n")
    assert torch.all(both.input_ids_BTt[:, 0] == t_tok.bos_id)
    assert torch.all(both.s_chunk_BTs[:, 0] == 0) and torch.all(both.t_chunk_BTt[:, 0] == 0)
    assert torch.all(one.s_chunk_BTs[:, 0] == -1)
    assert not batch.loss_mask_BTs[:, 0].any()


@pytest.mark.parametrize("s_name,t_names", [("gpt2", ("qwen2", "llama3")), ("llama3", ("mistral",))])
def test_chat_loss_masks_land_on_the_same_bytes(get_tokenizer, s_name, t_names):
    s_tok = get_tokenizer(s_name)
    windows = _windows(s_tok, CHATS, seq_len=512)
    specs = [TeacherTokenization(n, get_tokenizer(n)) for n in t_names]
    batch = CrossTokenizerCollator(s_tok, specs)(windows)
    want = [b"".join(c.encode() for r, c in conv if r == "assistant") for conv in CHATS]
    assert len(windows) == 1  # both conversations in one window

    def loss_bytes(table, ids, mask):
        return b"".join(table.token_bytes(int(i)) for i in ids[mask])

    got_s = loss_bytes(s_tok.table, batch.input_ids_BTs[0].numpy(), batch.loss_mask_BTs[0].numpy())
    assert got_s == b"".join(want)
    for spec in specs:
        view = batch.teacher(spec.name)
        got_t = loss_bytes(spec.tokenizer.table, view.input_ids_BTt[0].numpy(), view.loss_mask_BTt[0].numpy())
        assert got_t == b"".join(want), spec.name
        # teachers with a chat template also train their end-of-turn token
        n_special = int((view.loss_mask_BTt[0] & torch.from_numpy(
            spec.tokenizer.table.roles_V[view.input_ids_BTt[0].numpy()] != ROLE_TEXT)).sum())
        assert n_special == 3
        # templates differ, contents align: most trained student tokens have a teacher chunk
        loss = batch.loss_mask_BTs[0]
        assert (view.s_chunk_BTs[0][loss] >= 0).float().mean() > 0.8


def test_collator_is_picklable(get_tokenizer):
    s_tok, t_tok = get_tokenizer("gpt2"), get_tokenizer("mistral")
    col = CrossTokenizerCollator(s_tok, [TeacherTokenization("t", t_tok)])
    clone = pickle.loads(pickle.dumps(col))
    windows = _windows(s_tok, TEXTS[:2])
    a, b = col(windows), clone(windows)
    assert torch.equal(a.teacher("t").t_chunk_BTt, b.teacher("t").t_chunk_BTt)


def test_conversation_split_across_windows_keeps_masks_and_bytes(get_tokenizer):
    s_tok, t_tok = get_tokenizer("gpt2"), get_tokenizer("qwen2")
    conv = [("user", "Tell me about foxes. " * 5), ("assistant", "Foxes are small canids. " * 8),
            ("user", "And dogs?"), ("assistant", "Dogs are loyal. " * 6)]
    windows = _windows(s_tok, [conv], seq_len=24)
    assert len(windows) > 4
    batch = CrossTokenizerCollator(s_tok, [TeacherTokenization("t", t_tok)])(windows)
    view = batch.teacher("t")
    want = b"".join(c.encode() for r, c in conv if r == "assistant")
    s_loss = b"".join(s_tok.table.token_bytes(int(i)) for i in batch.input_ids_BTs[batch.loss_mask_BTs])
    t_loss = b"".join(t_tok.table.token_bytes(int(i)) for i in view.input_ids_BTt[view.loss_mask_BTt])
    assert s_loss == want and t_loss == want  # the mapped window edges partition the teacher text


def test_chat_without_any_loss_role_is_an_error_naming_the_roles(get_tokenizer):
    """ShareGPT-style roles (human/gpt) with loss_roles [assistant] once trained at loss 0; now an
    unknown role is an error naming it, and a conversation without a trained role is one too."""
    from xdistill.errors import DataError

    docs = [CHATS[0], [("human", "What is 2+2?"), ("gpt", "It is 4.")]]
    with pytest.raises(DataError, match=r"document 1: message 0 has the unknown chat role "
                                        r"'human'; accepted roles: system, developer, user, "
                                        r"assistant, tool \(map others, e.g. human -> user"):
        _windows(get_tokenizer("gpt2"), docs, seq_len=512)
    with pytest.raises(DataError, match=r"document 0: chat roles \['system', 'user'\] include "
                                        r"none of data.loss_roles \['assistant'\]"):
        _windows(get_tokenizer("gpt2"), [[("system", "Be brief."), ("user", "Hi.")]])
    docs[1] = [("user", "What is 2+2?"), ("gpt", "It is 4.")]
    ok = list(PackedDataset(docs, get_tokenizer("gpt2"), 512, shuffle=False, epochs=1,
                            loss_roles=["assistant", "gpt"]))   # a role named there: accepted
    assert [int(seg.loss_T.sum()) > 0 for w in ok for seg in w.segments] == [True, True]


def test_chat_templates_that_write_the_bos_get_one_bos(get_tokenizer):
    """Gemma's and Mistral's templates write their BOS; the window BOS they default to is not
    added again, on the student's side nor on a teacher's."""
    gemma, mistral, gpt2 = (get_tokenizer(n) for n in ("gemma3-270m", "mistral", "gpt2"))
    for student in (gemma, mistral):
        windows = _windows(student, CHATS, seq_len=512, add_bos=None)
        batch = CrossTokenizerCollator(student, [])(windows)
        assert [int((row == student.bos_id).sum()) for row in batch.input_ids_BTs] == [2]
        assert int(batch.input_ids_BTs[0, 0]) == student.bos_id                # one per chat
        assert int(batch.input_ids_BTs[0, 1]) != student.bos_id
    windows = _windows(gpt2, CHATS, seq_len=512, add_bos=None)
    view = CrossTokenizerCollator(gpt2, [TeacherTokenization("g", gemma)])(windows).teacher("g")
    row = view.input_ids_BTt[0][view.attention_mask_BTt[0]]
    assert int(row[0]) == gemma.bos_id and int(row[1]) != gemma.bos_id
    assert int((row == gemma.bos_id).sum()) == 2


def test_an_unknown_role_in_prepared_data_names_role_file_and_row(get_tokenizer, tmp_path):
    """One ``wizard`` message among user/assistant ones was rendered silently; now the error
    names the role, the shard file and row, and the accepted roles."""
    import json

    from xdistill.data.prepare import prepare
    from xdistill.data.source import DocumentSource
    from xdistill.errors import DataError

    rows = [{"messages": [{"role": r, "content": c} for r, c in conv]} for conv in CHATS]
    rows.append({"messages": [{"role": "user", "content": "Hi"},
                              {"role": "wizard", "content": "Abracadabra."},
                              {"role": "assistant", "content": "Hello."}]})
    src = tmp_path / "chats.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    prepare([src], tmp_path / "data", progress=False)
    source = DocumentSource([tmp_path / "data"])
    with pytest.raises(DataError, match=r"\.arrow row 2: message 1 has the unknown chat role "
                                        r"'wizard'; accepted roles: system, developer, user, "
                                        r"assistant, tool"):
        list(PackedDataset(source, get_tokenizer("gpt2"), 512, shuffle=False, epochs=1))


def test_special_token_strings_in_text_documents_are_text_on_every_side(get_tokenizer):
    """A text document that spells ``<|endoftext|>`` and ``</s>`` (web text about tokenizers):
    with ``data.specials_as_text`` (the default) the student (GPT-2) and the teacher (Llama-2
    SentencePiece) both read those characters as text, so no EOS lands mid-document with loss
    and the two sides' bytes agree (every token aligned); ``false`` keeps each tokenizer's own
    reading (the student's EOS mid-document)."""
    import warnings

    from xdistill.data.collator import CrossTokenizerCollator, TeacherTokenization
    from xdistill.data.dataset import PackedDataset

    student, teacher = get_tokenizer("gpt2"), get_tokenizer("llama-spm")
    doc = "GPT-2 ends a text with <|endoftext|> and Llama-2 with </s>, as the docs say."
    for as_text in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            windows = list(PackedDataset([doc], student, 64, shuffle=False, epochs=1,
                                         add_bos=False, specials_as_text=as_text))
            col = CrossTokenizerCollator(student, [TeacherTokenization("t", teacher, add_bos=False)],
                                         specials_as_text=as_text)
        batch = col(windows)
        ids = batch.input_ids_BTs[0][batch.attention_mask_BTs[0]].tolist()
        mid_eos = student.eos_id in ids[:-1]
        assert mid_eos != as_text, (as_text, ids)
        if as_text:
            view = batch.teacher("t")
            t_ids = view.input_ids_BTt[0][view.attention_mask_BTt[0]].tolist()
            assert teacher.eos_id not in t_ids[:-1]
            assert view.coverage_s == 1.0 and view.coverage_t == 1.0
