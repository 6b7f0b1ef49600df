"""``xdistill projection build`` between the real pretrained tokenizers, both directions, through
the CLI: coverage, and rows checked by their bytes (digits, words, Gemma's HTML-tag tokens)."""

from __future__ import annotations

import time

import pytest

from xdistill.commands.projection import main
from xdistill.projection import load_projection
from xdistill.projection.artifact import SOURCE_EXACT, SOURCE_MULTITOKEN

pytestmark = pytest.mark.real


def _build(tmp_path, student: str, teacher: str):
    out = tmp_path / f"{student}-{teacher}.npz"
    t0 = time.perf_counter()
    assert main(["build", "--student", student, "--teacher", teacher, "--method", "multitoken,exact",
                 "--top-k", "4", "-o", str(out), "-q"]) == 0
    return out, time.perf_counter() - t0


def _row_bytes(proj, s_tok, t_tok, piece: bytes) -> dict[bytes, float]:
    ids = [i for i in range(s_tok.vocab_size) if s_tok.table.token_bytes(i) == piece
           and s_tok.table.roles_V[i] == 0]
    return {t_tok.table.token_bytes(t): round(w, 4) for t, w in proj.row(ids[0]).items()}


def test_smollm2_student_gemma_teacher(tmp_path, get_tokenizer):
    s_tok, t_tok = get_tokenizer("smollm2-135m"), get_tokenizer("gemma3-270m")
    out, elapsed = _build(tmp_path, "smollm2-135m", "gemma3-270m")
    print(f"\nsmollm2-135m -> gemma3-270m projection built in {elapsed:.1f} s")
    assert elapsed < 40      # ~6 s on 2 cores
    proj = load_projection(out, s_tok, t_tok)
    cov = proj.meta["coverage"]
    assert proj.shape == (49_152, 262_144) and cov["mapped_fraction"] > 0.99
    assert cov["rows"]["exact"] > 40_000
    for piece in (b"7", b" ships", b"\n\n", b"  "):               # same bytes on both sides
        assert _row_bytes(proj, s_tok, t_tok, piece) == {piece: 1.0}, piece
    # a student word Gemma spells in several pieces: the first piece carries most weight
    tid = s_tok.hf.convert_tokens_to_ids("Ġunconventional")
    if proj.row_source_Vs[tid] == SOURCE_MULTITOKEN:
        row = _row_bytes(proj, s_tok, t_tok, b" unconventional")
        assert max(row, key=row.get) == t_tok.table.concat(t_tok.encode(" unconventional").ids[:1])


def test_gemma_student_smollm2_teacher(tmp_path, get_tokenizer):
    s_tok, t_tok = get_tokenizer("gemma3-270m"), get_tokenizer("smollm2-135m")
    out, elapsed = _build(tmp_path, "gemma3-270m", "smollm2-135m")
    print(f"\ngemma3-270m -> smollm2-135m projection built in {elapsed:.1f} s")
    assert elapsed < 60      # 262,144 student rows re-tokenized: ~11 s on 2 cores
    proj = load_projection(out, s_tok, t_tok)
    assert proj.shape == (262_144, 49_152) and proj.meta["coverage"]["mapped_fraction"] > 0.97
    for piece in (b"7", b" Paris", b"\n\n"):
        assert _row_bytes(proj, s_tok, t_tok, piece) == {piece: 1.0}, piece
    # Gemma's <h1> is text: SmolLM2 spells it "<", "h", "1", ">" (weights 0.1**i, normalised)
    h1 = _row_bytes(proj, s_tok, t_tok, b"<h1>")
    assert set(h1) == {b"<", b"h", b"1", b">"}
    assert h1[b"<"] == pytest.approx(1 / 1.111, abs=1e-3)
    assert proj.row_source_Vs[s_tok.hf.convert_tokens_to_ids("<h1>")] == SOURCE_MULTITOKEN
    assert proj.row_source_Vs[s_tok.hf.convert_tokens_to_ids("▁Paris")] == SOURCE_EXACT
