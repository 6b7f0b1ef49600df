"""The aligner on real tokenizers of several families (asset cache, no hub): invariants over
random unicode, agreement with the pure-Python reference, and the DP scenarios of the issue."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from align_helpers import SPICY, check_invariants, compare_with_reference, pad
from xdistill.align import align_batch, align_pair

PAIRS = [("gpt2", "qwen2"), ("gpt2", "mistral"), ("llama3", "qwen2"), ("mistral", "bert"),
         ("qwen2", "bert"), ("phi3", "llama3")]
TEXT = st.lists(st.one_of(st.sampled_from(SPICY + ["def f(x):\n    return x", "  \n\n  ", "Hello"]),
                          st.characters(exclude_categories=("Cs",))), max_size=20).map("".join)
SETTINGS = settings(max_examples=15, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


def _encode(tok, texts, add_special_tokens=False):
    encs = [tok.encode(t, add_special_tokens=add_special_tokens) for t in texts]
    ids, lens = pad([e.ids.tolist() for e in encs], fill=tok.vocab_size + 7)  # junk padding
    return encs, ids, lens, np.array([e.phantom_prefix for e in encs])


def _align_texts(s_tok, t_tok, texts, **kw):
    s_encs, s_ids, s_len, s_ph = _encode(s_tok, texts)
    t_encs, t_ids, t_len, t_ph = _encode(t_tok, texts)
    res = align_batch(s_ids, s_len, t_ids, t_len, s_tok.table, t_tok.table, s_phantom_B=s_ph,
                      t_phantom_B=t_ph, **kw)
    s_rows = [e.ids.tolist() for e in s_encs]
    t_rows = [e.ids.tolist() for e in t_encs]
    compare_with_reference(res, s_rows, t_rows, s_tok.table, t_tok.table, s_ph, t_ph, **kw)
    for b in range(len(texts)):
        check_invariants(res, b, s_rows[b], t_rows[b], s_tok.table, t_tok.table, int(s_ph[b]),
                         int(t_ph[b]), chunks=kw.get("chunks", "minimal"))
    return res, s_rows, t_rows


@pytest.mark.parametrize("student,teacher", PAIRS)
def test_random_unicode_on_real_pairs(get_tokenizer, student, teacher):
    s_tok, t_tok = get_tokenizer(student), get_tokenizer(teacher)

    @SETTINGS
    @given(st.lists(TEXT, min_size=1, max_size=3), st.sampled_from(["minimal", "space"]))
    def run(texts, chunks):
        res, s_rows, t_rows = _align_texts(s_tok, t_tok, texts, chunks=chunks)
        lossless = not (s_tok.lossy or t_tok.lossy)
        for b, text in enumerate(texts):
            nfc = all(not getattr(tok, "nfc", False) for tok in (s_tok, t_tok))
            # SentencePiece reads a literal U+2581 in the text as its space marker (bytes " ")
            spm_marker = "\u2581" in text
            if lossless and nfc and not spm_marker:   # same text, lossless: exact, all aligned
                assert not res.used_dp_B[b], text
                assert res.s_coverage_B[b] == res.t_coverage_B[b] == 1.0, text

    run()


@pytest.mark.parametrize("name", ["gpt2", "mistral", "bert"])
def test_same_tokenizer_is_all_exact(get_tokenizer, name):
    tok = get_tokenizer(name)
    text = "Hello, World! 🙂 中文 naïve  code: x[i] += 1\n"
    enc = tok.encode(text)
    res = align_pair(enc.ids, enc.ids, tok.table, tok.table, s_phantom=enc.phantom_prefix,
                     t_phantom=enc.phantom_prefix)
    n = len(enc.ids)
    assert not res.used_dp_B[0]
    assert res.s_chunk_BTs[0].tolist() == list(range(n))
    text_tokens = tok.table.roles_V[enc.ids] == 0
    assert res.chunk_exact_BC[0].tolist() == text_tokens.tolist()


def test_bos_on_one_side_only(get_tokenizer):
    llama, qwen = get_tokenizer("llama3"), get_tokenizer("qwen2")
    text = "The year 2024 was 🙂 fine."
    bos = llama.bos_id if llama.bos_id is not None else 128000    # <|begin_of_text|>
    s_ids = np.concatenate([[bos], llama.encode(text).ids])
    t = qwen.encode(text)
    assert llama.table.roles_V[bos] != 0
    for method in ("auto", "dp"):
        res = align_pair(s_ids, t.ids, llama.table, qwen.table, method=method)
        compare_with_reference(res, [s_ids.tolist()], [t.ids.tolist()], llama.table,
                               qwen.table, method=method)
        assert res.s_chunk_BTs[0][0] == -1
        assert (res.s_chunk_BTs[0][1:] >= 0).all() and res.t_coverage_B[0] == 1.0
        assert res.used_dp_B[0] == (method == "dp")


def test_different_chat_templates_around_the_same_messages(get_tokenizer):
    qwen, llama = get_tokenizer("qwen2"), get_tokenizer("llama3")
    messages = [{"role": "user", "content": "What is 12 + 30? 🙂"},
                {"role": "assistant", "content": "It is 42, of course."}]
    rendered = [tok.hf.apply_chat_template(messages, tokenize=False) for tok in (qwen, llama)]
    s = qwen.encode(rendered[0])
    t = llama.encode(rendered[1])
    assert (qwen.table.roles_V[s.ids] != 0).sum() >= 4
    assert (llama.table.roles_V[t.ids] != 0).sum() >= 4
    res = align_pair(s.ids, t.ids, qwen.table, llama.table)
    assert res.used_dp_B[0]
    compare_with_reference(res, [s.ids.tolist()], [t.ids.tolist()], qwen.table, llama.table)
    check_invariants(res, 0, s.ids, t.ids, qwen.table, llama.table)
    aligned = b"".join(qwen.table.token_bytes(int(i)) for i, c in zip(s.ids, res.s_chunk_BTs[0])
                       if c >= 0)
    assert b" is 42, of course." in aligned and b" + 30?" in aligned
    role_pairs = [k for k, (s0, s1, t0, t1, _) in enumerate(res.chunks(0))
                  if qwen.table.roles_V[s.ids[s0]] != 0]
    assert len(role_pairs) >= 2      # end-of-turn markers pair by role


def test_wordpiece_lowercased_vs_cased(get_tokenizer):
    gpt2, bert = get_tokenizer("gpt2"), get_tokenizer("bert")
    res, s_rows, t_rows = _align_texts(gpt2, bert, ["Hello World. THE Quick fox, naïve."])
    assert res.used_dp_B[0]
    chunks = {gpt2.table.concat(s_rows[0][s0:s1]) for s0, s1, *_ in res.chunks(0)}
    assert {b"Hello", b".", b","} <= chunks       # case-folded matches where no space precedes
    assert 0.2 < res.s_coverage_B[0] < 1.0


def test_truncated_mid_character(get_tokenizer):
    gpt2, qwen = get_tokenizer("gpt2"), get_tokenizer("qwen2")
    text = "ok 🙂🙂"
    s = gpt2.encode(text).ids
    t = qwen.encode(text).ids
    def broken(k):
        try:
            gpt2.table.concat(s[:k]).decode("utf-8")
            return False
        except UnicodeDecodeError:
            return True

    cut = next(k for k in range(1, len(s)) if broken(k))   # gpt2 splits emoji into byte pieces
    res = align_pair(s[:cut], t, gpt2.table, qwen.table)
    assert res.used_dp_B[0]
    compare_with_reference(res, [s[:cut].tolist()], [t.tolist()], gpt2.table, qwen.table)
    check_invariants(res, 0, s[:cut], t, gpt2.table, qwen.table)
    assert res.s_chunk_BTs[0][0] == 0 and res.s_chunk_BTs[0][cut - 1] == -1


def test_different_text_in_the_middle(get_tokenizer):
    mistral, qwen = get_tokenizer("mistral"), get_tokenizer("qwen2")
    a = "Shared opening words. The middle says apples and pears. Shared closing words."
    b = "Shared opening words. Nothing like it here at all!!! Shared closing words."
    s, t = mistral.encode(a), qwen.encode(b)
    res = align_pair(s.ids, t.ids, mistral.table, qwen.table, s_phantom=s.phantom_prefix)
    assert res.used_dp_B[0]
    compare_with_reference(res, [s.ids.tolist()], [t.ids.tolist()], mistral.table, qwen.table,
                           s_ph=[s.phantom_prefix])
    check_invariants(res, 0, s.ids, t.ids, mistral.table, qwen.table, s.phantom_prefix)
    un_t = b"".join(qwen.table.token_bytes(int(i)) for i, c in zip(t.ids, res.t_chunk_BTt[0])
                    if c < 0)
    assert b"Nothing" in un_t and b"Shared" not in un_t
    assert b"closing" in qwen.table.concat(t.ids[res.t_chunk_BTt[0] >= 0])


PROSE = ("The committee met on Tuesday to discuss the budget. Several members, including Dr. "
         "Smith, argued that the proposal was too expensive; others disagreed.\n\nIn the end, "
         "they voted 7-3 to approve it, and the new library will open in September 2025. "
         "\"It's a great day for the town,\" said Mayor O'Brien.")


@pytest.mark.parametrize("student", ["gpt2", "llama3", "mistral"])
def test_lossy_bert_teacher_covers_english_prose(get_tokenizer, student):
    """Lossy comparison space (ASCII lower case, whitespace removed): cased prose is fully
    aligned with uncased WordPiece on the exact path; an accent (stripped by BERT) only leaves
    its own word unaligned, via the DP."""
    s_tok, bert = get_tokenizer(student), get_tokenizer("bert")
    accented = PROSE.replace("open", "reopen in the café")
    res, s_rows, t_rows = _align_texts(s_tok, bert, [PROSE, accented])
    assert not res.used_dp_B[0] and res.s_coverage_B[0] == res.t_coverage_B[0] == 1.0
    assert res.used_dp_B[1] and min(res.s_coverage_B[1], res.t_coverage_B[1]) > 0.95
    un_s = s_tok.table.concat([i for i, c in zip(s_rows[1], res.s_chunk_BTs[1]) if c < 0])
    assert b"caf" in un_s and len(un_s) <= 8
