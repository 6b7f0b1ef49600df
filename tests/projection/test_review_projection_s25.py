"""Review s25 (projection): each test demonstrates a defect and FAILS on the reviewed code."""

from __future__ import annotations

import pathlib

import pytest
from projection_helpers import synthetic_pair

from xdistill.projection import BuildConfig, build_projection, load_projection, save_projection
from xdistill.projection.audit import categorize
from xdistill.tokenization.table import ROLE_TEXT


def _id_of(tok, data: bytes) -> int:
    tab = tok.table
    return next(i for i in range(tab.vocab_size)
                if tab.roles_V[i] == ROLE_TEXT and tab.token_bytes(i) == data)


# ---------------------------------------------------------------- corpus method

@pytest.fixture
def digits_corpus(tmp_path):
    path = tmp_path / "c.txt"
    # three paragraphs (texts), each starting with a number SentencePiece does not merge with its
    # dummy-prefix "\u2581": Llama-SPM spells "2019" as ["\u2581", "2", "0", "1", "9"], the first
    # token holding nothing but the phantom space (no byte of the text)
    path.write_text("2019 was a good year.\n\n2019 again.\n\n2019 and 2020.\n", encoding="utf-8")
    return path


def test_corpus_chunk_start_is_not_a_phantom_only_teacher_token(get_tokenizer, digits_corpus):
    """GPT-2's text-initial token ``2019`` and Llama's ``2``,``0``,``1``,``9`` start the same
    chunk, so the corpus row of ``2019`` must put its weight on teacher ``2`` (the token holding
    the chunk's first byte). The corpus method takes the first teacher token *of the chunk*, which
    is the phantom-only ``\u2581`` (zero bytes of the text; it joins the chunk as a zero-length
    token): ``2019`` is projected onto a space, ``{"\u2581": 1.0}``."""
    student, teacher = get_tokenizer("gpt2"), get_tokenizer("llama-spm")
    proj = build_projection(student, teacher, BuildConfig(methods=("corpus",),
                                                          corpus_files=(str(digits_corpus),)))
    s = _id_of(student, b"2019")
    row = {teacher.table.token_bytes(t): w for t, w in proj.row(s).items()}
    assert row == {b"2": pytest.approx(1.0)}, row


def test_corpus_row_of_the_student_space_gets_no_phantom_observations(get_tokenizer, digits_corpus):
    """Mirror image with a SentencePiece *student*: Llama's phantom-only first token ``\u2581``
    (bytes ``b" "``) carries no byte of these texts, so it must collect no co-occurrence with
    GPT-2's ``2019`` (no space in it); the corpus row of the space token is ``{"2019": 1.0}``,
    i.e. every real space the student predicts would be projected onto the teacher's ``2019``."""
    student, teacher = get_tokenizer("llama-spm"), get_tokenizer("gpt2")
    proj = build_projection(student, teacher, BuildConfig(methods=("corpus",),
                                                          corpus_files=(str(digits_corpus),)))
    spaces = [i for i in range(student.vocab_size)          # "\u2581" and "<0x20>"
              if student.table.roles_V[i] == ROLE_TEXT and student.table.token_bytes(i) == b" "]
    assert int(student.encode("2019").ids[0]) in spaces     # the phantom-only first token
    bad = {(s, teacher.table.token_bytes(t)): w for s in spaces for t, w in proj.row(s).items()
           if b" " not in teacher.table.token_bytes(t)}
    assert not bad, f"student space token projected onto {bad}"


# ---------------------------------------------------------------- artifact

def test_failed_sidecar_write_keeps_the_previous_projection(tmp_path, monkeypatch):
    """Saving over an existing projection must leave the previous, loadable pair when the save
    fails (disk full, quota, permission). ``save_projection`` replaces ``p.npz`` first and only
    then writes the sidecar: when that write fails, the new matrix sits next to the old sidecar
    and the previous projection no longer loads (SHA-256 mismatch) -- nothing usable is left."""
    student, teacher = synthetic_pair()
    first = build_projection(student, teacher, BuildConfig(methods=("exact",), top_k=1))
    path, _ = save_projection(first, tmp_path / "p.npz")
    second = build_projection(student, teacher, BuildConfig(methods=("exact",), top_k=2))

    def disk_full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pathlib.Path, "write_text", disk_full)
    with pytest.raises(Exception):
        save_projection(second, path)
    monkeypatch.undo()
    back = load_projection(path, student, teacher)     # the old pair must still load
    assert back.meta["top_k"] == 1


# ---------------------------------------------------------------- audit

@pytest.mark.parametrize("text", ["\U0001F600", " \U0001F600"])
def test_emoji_tokens_are_non_ascii_not_punct(text):
    """The audit's categories (module docstring of ``projection/audit.py``) list emoji under
    ``non-ascii`` ("CJK, accents, emoji"), and ``punct`` is for punctuation such as ``.``, ``",``
    and ``),``. ``categorize`` files every emoji token (Unicode category So) under ``punct``, so
    the coverage report counts emoji as punctuation."""
    assert categorize(text.encode("utf-8"), ROLE_TEXT) == "non-ascii"
