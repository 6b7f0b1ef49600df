"""The teacher reads exactly the text the student wrote, inside its own rendering of the prompt.

For every lossless tokenizer family we ship (byte-level BPE: gpt2, qwen2, llama3; SentencePiece
with byte fallback: mistral, phi3, llama-spm), prompts ending in ':', a newline, a space and a
special token, and responses starting with a digit, a letter, a space and a newline:

* the teacher row equals a one-piece encoding of the rendered text (no dummy-prefix ``▁`` at the
  response start: the old bug had the teacher read ``A:▁28.`` for ``A:28.``);
* the response region's bytes, minus phantom bytes, are exactly the response bytes;
* through the scorer (a GPT-2 student), every response token of both sides is aligned and the
  student's stop token is paired with the teacher's end token.
"""

from __future__ import annotations

import numpy as np
import pytest

from xdistill.data import TeacherTokenization
from xdistill.rollout import RolloutScorer, rollouts_from_segments
from xdistill.rollout.teacher_text import teacher_region, utf8_runs

FAMILIES = ["gpt2", "qwen2", "llama3", "mistral", "phi3", "llama-spm"]
RESPONSES = ["28 apples.", "Paris is big.", " yes, 12", "\nok then"]


def _prompts(tok):
    special = tok.hf.convert_ids_to_tokens(int(tok.eos_id))
    return ["Q: 3+4\nA:", "Translate:\n", "The answer is ", f"Start{special}"]


def _region_bytes(tok, reg) -> bytes:
    out = b""
    for tid, ph in zip(reg.ids_T.tolist(), reg.phantom_T.tolist()):
        out += tok.table.token_bytes(tid)[ph:]
    return out


@pytest.mark.parametrize("name", FAMILIES)
def test_teacher_reads_the_response_in_one_piece(get_tokenizer, name):
    tok = get_tokenizer(name)
    for prompt in _prompts(tok):
        for resp in RESPONSES:
            reg = teacher_region(tok, prompt, resp.encode())
            whole = tok.encode(prompt + resp, add_special_tokens=False).ids
            got = np.concatenate([reg.prefix_ids, reg.ids_T])
            assert got.tolist() == list(whole), (name, prompt, resp)
            assert _region_bytes(tok, reg) == resp.encode(), (name, prompt, resp)
            assert reg.missing_bytes == 0


def test_sentencepiece_teacher_gets_no_dummy_space_after_the_prompt(get_tokenizer):
    """The regression behind the on-policy arm's failure: 'A:' + '28.' must not become
    'A:▁28.' for a SentencePiece teacher."""
    tok = get_tokenizer("mistral")
    reg = teacher_region(tok, "Q: 25+3\nA:", b"28.")
    first = tok.table.token_bytes(int(reg.ids_T[0]))
    assert not first.startswith(b" ") and reg.phantom_T[0] == 0
    assert _region_bytes(tok, reg) == b"28."


def test_straddling_token_gets_phantom_bytes(get_tokenizer):
    tok = get_tokenizer("gpt2")
    reg = teacher_region(tok, "The answer is ", b"42")
    assert tok.table.token_bytes(int(reg.ids_T[0])) == b" 42"
    assert reg.phantom_T[0] == 1 and reg.starts_T[0] == 0 and reg.ends_T[0] == 2


@pytest.mark.parametrize("name", ["qwen2", "mistral"])
def test_invalid_utf8_is_spelled_with_byte_tokens(get_tokenizer, name):
    """A byte-level student stopped inside a character: the teacher reads those raw bytes through
    its byte tokens (byte-level alphabet / <0xNN> fallback); no byte added or lost."""
    tok = get_tokenizer(name)
    resp = "ab ".encode() + "中".encode()[:2] + b" cd" + b"\xff"
    assert [v for _, _, v in utf8_runs(resp)] == [True, False, False, True, False]
    reg = teacher_region(tok, "Say:", resp)
    assert _region_bytes(tok, reg) == resp and reg.missing_bytes == 0


@pytest.mark.parametrize("name", ["qwen2", "mistral", "phi3"])
def test_literal_special_token_text_stays_text(get_tokenizer, name):
    """A student that spells a special token's string with ordinary tokens: the teacher reads
    those bytes as text, not as its control token."""
    tok = get_tokenizer(name)
    special = tok.hf.convert_ids_to_tokens(int(tok.eos_id))
    resp = f"x {special} y".encode()
    reg = teacher_region(tok, "Go:", resp)
    assert _region_bytes(tok, reg) == resp


@pytest.mark.parametrize("name", [n for n in FAMILIES if n != "gpt2"])
def test_scorer_aligns_every_response_token_and_bridges_the_stop(get_tokenizer, name):
    student, teacher = get_tokenizer("gpt2"), get_tokenizer(name)
    prompts = ["Q: 3+4\nA:", "Translate:\n", "The answer is ", "Hi there:"]
    ro = rollouts_from_segments(student, prompts, [[(r, True)] for r in RESPONSES],
                                finished=True)
    scored = RolloutScorer(student, [TeacherTokenization("t", teacher, None)])(ro)
    view = scored.batch.teacher("t")
    end = teacher.eos_id
    lead = [teacher.bos_id] if teacher.add_bos_default else []   # the model's own BOS default
    for b in range(len(prompts)):
        row = view.input_ids_BTt[b][view.attention_mask_BTt[b]].tolist()
        whole = teacher.encode(prompts[b] + RESPONSES[b], add_special_tokens=False).ids
        assert row == lead + list(whole) + [end], (name, b)  # one piece, then the teacher's stop
        p, r = int(ro.prompt_len_B[b]), int(ro.response_len_B[b])
        assert (view.s_chunk_BTs[b, p:p + r] >= 0).all(), (name, b)  # the stop token included
        region = view.t_chunk_BTt[b][view.loss_mask_BTt[b]]
        assert (region >= 0).all(), (name, b)
    assert not view.s_unpaired_BTs.any()
    assert scored.stats.unaligned_frac["t"] == 0.0


def test_prompt_that_already_starts_with_bos_gets_one_bos(get_tokenizer):
    """A rendered prompt whose template writes the BOS itself is not given a second one."""
    from xdistill.rollout.render import encode_prompts

    tok = get_tokenizer("mistral")
    bos = tok.hf.convert_ids_to_tokens(int(tok.bos_id))
    with_bos, plain = encode_prompts(tok, [f"{bos}Hello there", "Hello there"], 64, add_bos=True)
    for ids in (with_bos, plain):
        assert int((ids == tok.bos_id).sum()) == 1 and ids[0] == tok.bos_id


def test_unset_teacher_bos_follows_the_teacher_model(get_tokenizer):
    """A Gemma teacher with add_bos unset reads its <bos> first (without it its loss was 6.36
    against 4.27); a SmolLM2 teacher and the GPT-2 student get none."""
    student = get_tokenizer("gpt2")
    ro = rollouts_from_segments(student, ["Q: 1+1\nA:"], [[("2.", True)]], finished=True)
    gemma, smol = get_tokenizer("gemma3-270m"), get_tokenizer("smollm2-135m")
    scorer = RolloutScorer(student, [TeacherTokenization("gemma", gemma), TeacherTokenization("smol", smol)])
    assert not scorer.student_add_bos
    scored = scorer(ro)
    assert int(scored.batch.teacher("gemma").input_ids_BTt[0, 0]) == gemma.bos_id
    assert int(scored.batch.teacher("smol").input_ids_BTt[0, 0]) != smol.bos_id


def test_teacher_bos_is_set_per_teacher(get_tokenizer):
    """The student without a BOS, one teacher with its own BOS: only that teacher's row starts
    with it; the teacher whose setting follows the student's gets none."""
    student, spm = get_tokenizer("gpt2"), get_tokenizer("mistral")
    ro = rollouts_from_segments(student, ["Q: 1+1\nA:"], [[("2.", True)]], finished=True)
    scored = RolloutScorer(student, [TeacherTokenization("bos", spm, None, add_bos=True),
                                     TeacherTokenization("nobos", spm, None, add_bos=False)])(ro)
    assert int(scored.batch.input_ids_BTs[0, 0]) != student.bos_id
    assert int(scored.batch.teacher("bos").input_ids_BTt[0, 0]) == spm.bos_id
    assert int(scored.batch.teacher("nobos").input_ids_BTt[0, 0]) != spm.bos_id


def test_teacher_bos_setting_resolution(get_tokenizer):
    """Unset follows the teacher model's own default (Mistral adds its <s>, GPT-2 adds none);
    an explicit value wins."""
    from types import SimpleNamespace

    from xdistill.errors import ConfigError
    from xdistill.train.teacher_plan import teacher_bos

    spm, gpt2 = get_tokenizer("mistral"), get_tokenizer("gpt2")
    t = lambda v: SimpleNamespace(name="t", add_bos=v)  # noqa: E731
    assert teacher_bos(t(None), spm) and not teacher_bos(t(None), gpt2)
    assert teacher_bos(t(True), gpt2) and not teacher_bos(t(False), spm)
    if get_tokenizer("bert").bos_id is None:
        assert not teacher_bos(t(None), get_tokenizer("bert"))
        with pytest.raises(ConfigError, match="has no BOS token"):
            teacher_bos(t(True), get_tokenizer("bert"))
