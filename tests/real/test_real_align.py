"""SmolLM2 and Gemma-3 tokenizations of the same text, aligned: every valid text chunk holds
identical bytes on both sides, chunks tile the text in order, and prose aligns almost fully."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from real_helpers import PROSE, PROSE_OR_RANDOM, UNICODE
from xdistill.align import align_pair
from xdistill.tokenization import ROLE_TEXT

pytestmark = pytest.mark.real


def _spans(tok, enc) -> list[bytes]:
    """Each token's text bytes: its table bytes minus its phantom bytes."""
    ph = enc.phantom_bytes_T()
    return [tok.table.token_bytes(int(i))[int(p):] for i, p in zip(enc.ids, ph)]


def check_chunks(s_tok, t_tok, text: str) -> float:
    s_enc, t_enc = s_tok.encode(text), t_tok.encode(text)
    res = align_pair(s_enc.ids, t_enc.ids, s_tok.table, t_tok.table,
                     s_phantom=s_enc.phantom_bytes_T(), t_phantom=t_enc.phantom_bytes_T())
    s_b, t_b = _spans(s_tok, s_enc), _spans(t_tok, t_enc)
    prev_s = prev_t = 0
    for s0, s1, t0, t1, _ in res.chunks(0):
        assert s0 >= prev_s and t0 >= prev_t                         # ordered and disjoint
        prev_s, prev_t = s1, t1
        if all(s_tok.table.roles_V[s_enc.ids[s0:s1]] == ROLE_TEXT):
            assert b"".join(s_b[s0:s1]) == b"".join(t_b[t0:t1]), (text, s0, s1, t0, t1)
    if s_tok.is_exact_on(text) and t_tok.is_exact_on(text):
        assert not res.used_dp_B[0]                                  # identical texts: exact path
    return float(res.s_coverage_B[0])


def test_prose_and_unicode_align_fully(get_tokenizer):
    s_tok, t_tok = get_tokenizer("smollm2-135m"), get_tokenizer("gemma3-270m")
    for text in PROSE + UNICODE:
        assert check_chunks(s_tok, t_tok, text) == 1.0, text


def test_chunk_invariant_on_random_text_both_directions(get_tokenizer):
    a, b = get_tokenizer("smollm2-135m"), get_tokenizer("gemma3-270m")

    @settings(max_examples=50, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(PROSE_OR_RANDOM)
    def run(text):
        text = text.replace("\u2581", " ")
        check_chunks(a, b, text)
        check_chunks(b, a, text)

    run()


def test_missing_bytes_stay_unaligned(get_tokenizer):
    """SmolLM2 drops \\x04; Gemma spells it with a byte-fallback token. The texts differ, so the
    row takes the DP path; everything around the dropped byte still aligns."""
    s_tok, t_tok = get_tokenizer("smollm2-135m"), get_tokenizer("gemma3-270m")
    text = "The ships\x04 sailed at dawn."
    s_enc, t_enc = s_tok.encode(text), t_tok.encode(text)
    res = align_pair(s_enc.ids, t_enc.ids, s_tok.table, t_tok.table)
    assert res.used_dp_B[0] and res.s_coverage_B[0] == 1.0
    unaligned = [t_tok.table.token_bytes(int(i)) for i, c in zip(t_enc.ids, res.t_chunk_BTt[0]) if c < 0]
    assert unaligned == [b"\x04"]
    assert np.all(res.chunk_valid_BC[0, :res.n_chunks_B[0]])
