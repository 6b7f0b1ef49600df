"""Phantom bytes per token: the dummy-prefix space a legacy SentencePiece tokenizer (phi3) puts on
the first token of the text *and* after every special token written in the text.

``Encoding.phantom_T`` reports them per token; ``align_batch`` takes them per token
(``s_phantom_BTs`` / ``t_phantom_BTt``) or, as before, per row (``s_phantom_B``: at token 0).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from align_helpers import Vocab, check_invariants, compare_with_reference, pad, segment
from xdistill.align import align_batch, align_pair
from xdistill.errors import AlignmentError
from xdistill.tokenization.encode import Encoding
from xdistill.tokenization.table import ROLE_EOS

SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])
PIECES = ["a", "b ", ", ", "Hello", " world", "\n", "é", "  ", "<|endoftext|>", "<s>", "</s>"]
TEXT = st.lists(st.sampled_from(PIECES), max_size=10).map("".join)


def test_special_tokens_in_text_keep_the_next_token_aligned(get_tokenizer):
    """The issue's rows: qwen2 (no phantom) vs phi3 (a phantom space after each special token).
    With per-token phantoms the texts are equal: exact path, ',' and 'Hello' aligned; with the
    per-row form (the old call) they were not."""
    qwen, phi = get_tokenizer("qwen2"), get_tokenizer("phi3")
    want = {"a<|endoftext|>, b": [(0, 1, 0, 1, False), (1, 2, 1, 2, False), (2, 3, 2, 3, False),
                                  (3, 4, 3, 4, True)],
            "<|endoftext|>Hello world": [(0, 1, 0, 1, False), (1, 2, 1, 2, False),
                                         (2, 3, 2, 3, True)]}
    for text, chunks in want.items():
        eq, ep = qwen.encode(text), phi.encode(text)
        assert eq.phantom_T.tolist() == [0] * len(eq.ids)
        assert ep.phantom_T.tolist() == ([1, 0, 1, 0] if text.startswith("a") else [0, 1, 0])
        res = align_pair(eq.ids, ep.ids, qwen.table, phi.table, s_phantom=eq.phantom_T,
                         t_phantom=ep.phantom_T)
        assert res.chunks(0) == chunks and not res.used_dp_B[0]
        assert res.s_coverage_B[0] == res.t_coverage_B[0] == 1.0
        compare_with_reference(res, [eq.ids], [ep.ids], qwen.table, phi.table,
                               s_ph=[eq.phantom_T], t_ph=[ep.phantom_T])
        check_invariants(res, 0, eq.ids, ep.ids, qwen.table, phi.table, eq.phantom_T,
                         ep.phantom_T)
        # phi3 as the student: same chunks
        swapped = align_pair(ep.ids, eq.ids, phi.table, qwen.table, s_phantom=ep.phantom_T)
        assert swapped.chunks(0) == [(c[2], c[3], c[0], c[1], c[4]) for c in chunks]
        old = align_pair(eq.ids, ep.ids, qwen.table, phi.table, t_phantom=ep.phantom_prefix)
        assert old.n_chunks_B[0] < len(chunks)


@pytest.mark.parametrize("name", ["phi3", "llama-spm", "mistral", "gpt2"])
def test_encoding_phantom_T_is_what_the_text_lacks(get_tokenizer, name):
    """Per text token, its table bytes minus its first ``phantom_T`` bytes are its slice of the
    text; the first segment's phantoms are ``phantom_prefix`` when it starts the text;
    ``phantom_bytes_T`` falls back to ``phantom_prefix`` at token 0."""
    tok = get_tokenizer(name)

    @SETTINGS
    @given(TEXT)
    def run(text):
        enc = tok.encode(text)
        data = text.encode()
        ph_T = enc.phantom_T
        assert ph_T.dtype == np.int64 and ph_T.shape == enc.ids.shape and (ph_T >= 0).all()
        assert (enc.phantom_bytes_T() == ph_T).all()
        if not tok.is_exact_on(text):
            return
        roles = tok.table.roles_V[enc.ids]
        for k, tid in enumerate(enc.ids):
            if roles[k]:
                assert ph_T[k] == 0
                continue
            piece = tok.table.token_bytes(int(tid))
            assert piece[ph_T[k]:] == data[enc.starts[k]:enc.ends[k]], (text, k)
        if enc.phantom_prefix:
            first = int(np.flatnonzero(roles == 0)[0])
            assert ph_T[first] == enc.phantom_prefix

    run()
    legacy = Encoding(np.array([5, 6]), np.zeros(2, np.int64), np.zeros(2, np.int64), 1)
    assert legacy.phantom_bytes_T().tolist() == [1, 0]


def test_same_text_with_special_tokens_is_exact_on_real_pairs(get_tokenizer):
    """Any text (with ``<|endoftext|>``, special for both) tokenized by phi3 and by qwen2 is one
    text once the per-token phantoms are removed: exact path, everything aligned."""
    phi, qwen = get_tokenizer("phi3"), get_tokenizer("qwen2")
    shared = st.lists(st.sampled_from(PIECES[:-2]), max_size=10).map("".join)

    @SETTINGS
    @given(st.lists(shared, min_size=1, max_size=3))
    def run(texts):
        p_encs = [phi.encode(t) for t in texts]
        q_encs = [qwen.encode(t) for t in texts]
        s_ids, s_len = pad([e.ids.tolist() for e in p_encs])
        t_ids, t_len = pad([e.ids.tolist() for e in q_encs])
        s_ph, _ = pad([e.phantom_T.tolist() for e in p_encs])
        t_ph, _ = pad([e.phantom_T.tolist() for e in q_encs])
        res = align_batch(s_ids, s_len, t_ids, t_len, phi.table, qwen.table,
                          s_phantom_BTs=s_ph, t_phantom_BTt=t_ph)
        assert not res.used_dp_B.any(), texts
        assert (res.s_coverage_B == 1.0).all() and (res.t_coverage_B == 1.0).all(), texts
        for b, (p, q) in enumerate(zip(p_encs, q_encs)):
            check_invariants(res, b, p.ids, q.ids, phi.table, qwen.table, p.phantom_T,
                             q.phantom_T)
        compare_with_reference(res, [e.ids for e in p_encs], [e.ids for e in q_encs], phi.table,
                               qwen.table, s_ph=[e.phantom_T for e in p_encs],
                               t_ph=[e.phantom_T for e in q_encs])

    run()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.binary(min_size=1, max_size=6), st.booleans()), min_size=1,
                max_size=6), st.integers(0, 2**31))
def test_per_token_phantoms_on_synthetic_rows(parts, seed):
    """Segments separated by EOS; the student puts a phantom space on the first token of some
    segments. Per-token form == reference == invariants; exact path with full coverage; the
    per-row form is the per-token form with the count at token 0."""
    rng = np.random.default_rng(seed)
    vocab = Vocab()
    eos = vocab.role_id(ROLE_EOS)
    s, t, ph = [], [], []
    for data, phantom in parts:
        cuts = [c for c in range(1, len(data)) if rng.random() < 0.5]
        piece = (b" " if phantom else b"") + data
        seg_s = segment(vocab, piece, [c + int(phantom) for c in cuts] + [1] * (rng.random() < .3))
        s += seg_s + [eos]
        ph += [int(phantom)] + [0] * len(seg_s)
        t += segment(vocab, data, [c for c in range(1, len(data)) if rng.random() < 0.5]) + [eos]
    table = vocab.table()
    res = align_pair(s, t, table, table, s_phantom=ph)
    assert not res.used_dp_B[0] and res.s_coverage_B[0] == res.t_coverage_B[0] == 1.0
    compare_with_reference(res, [s], [t], table, table, s_ph=[ph])
    check_invariants(res, 0, s, t, table, table, ph, 0)
    for method in ("dp", "auto"):
        row = align_batch(np.array([s]), [len(s)], np.array([t]), [len(t)], table, table,
                          s_phantom_BTs=np.array([ph]), method=method)
        compare_with_reference(row, [s], [t], table, table, s_ph=[ph], method=method)
    first = [ph[0]] + [0] * (len(s) - 1)
    a = align_pair(s, t, table, table, s_phantom=ph[0])
    c = align_pair(s, t, table, table, s_phantom=first)
    assert a.chunks(0) == c.chunks(0)


def test_phantom_arguments_are_validated():
    vocab = Vocab()
    s = segment(vocab, b" ab", [1])          # " " "ab"
    t = segment(vocab, b"ab", [])
    table = vocab.table()
    ids = np.array([s])
    with pytest.raises(AlignmentError, match="give s_phantom_B or s_phantom_BTs, not both"):
        align_batch(ids, [2], np.array([t]), [1], table, table, s_phantom_B=[1],
                    s_phantom_BTs=[[1, 0]])
    with pytest.raises(AlignmentError, match="t_phantom_BTt has shape \\(1, 3\\)"):
        align_batch(ids, [2], np.array([t]), [1], table, table, t_phantom_BTt=[[0, 0, 0]])
    with pytest.raises(AlignmentError, match="s_phantom_BTs\\[0, 1\\] = -1 is negative"):
        align_batch(ids, [2], np.array([t]), [1], table, table, s_phantom_BTs=[[0, -1]])
    with pytest.raises(AlignmentError, match="student row 0: phantom bytes \\(4 in all, at "
                                             "tokens \\[0, 1\\]\\) run past"):
        align_pair(s, t, table, table, s_phantom=[1, 3])
    # a negative count on padding is never read; the phantom token becomes transparent
    res = align_batch(np.array([s + [0]]), [2], np.array([t]), [1], table, table,
                      s_phantom_BTs=[[1, 0, -5]])
    assert res.chunks(0) == [(0, 2, 0, 1, False)]
