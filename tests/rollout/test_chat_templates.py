"""The Gemma-3 and Llama-2 assets chat with their own templates, and a teacher reads them.

Neither source (the Gemma-3 270M GGUF, llama.cpp's Llama-2 SentencePiece vocabulary) carries a
``tokenizer.chat_template``; without the shipped templates a chat prompt fell back to the generic
``user:/assistant:`` rendering and a Gemma teacher's rows ended with ``<eos>``. Through on-policy
scoring, a Gemma teacher reads ``<start_of_turn>model\\n`` + the student's response bytes +
``<end_of_turn>``, and the student's stop is paired with that ``<end_of_turn>``.
"""

from __future__ import annotations

import json

import pytest

from xdistill.data import TeacherTokenization
from xdistill.rollout import RolloutScorer, rollouts_from_segments
from xdistill.rollout.render import end_of_turn_id, render_prompt
from xdistill.tokenization.templates import (GEMMA3_CHAT_TEMPLATE, LLAMA2_CHAT_TEMPLATE,
                                             apply_shipped_template)

CONV = (("system", "Be brief."), ("user", "What is 2+3?"))


def test_llama_spm_renders_the_llama2_chat_format(get_tokenizer):
    tok = get_tokenizer("llama-spm")
    assert tok.hf.chat_template == LLAMA2_CHAT_TEMPLATE
    assert render_prompt(tok, CONV) == "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nWhat is 2+3? [/INST]"
    assert end_of_turn_id(tok) == tok.eos_id  # Llama-2 ends an answer with </s>


@pytest.mark.real
def test_gemma3_renders_its_turns(get_tokenizer):
    tok = get_tokenizer("gemma3-270m")
    assert tok.hf.chat_template == GEMMA3_CHAT_TEMPLATE
    assert render_prompt(tok, CONV) == ("<bos><start_of_turn>user\nBe brief.\n\nWhat is 2+3?"
                                        "<end_of_turn>\n<start_of_turn>model\n")
    eot = end_of_turn_id(tok)
    assert tok.hf.convert_ids_to_tokens(eot) == "<end_of_turn>" and eot != tok.eos_id


def _teacher_row(get_tokenizer, teacher_name: str):
    student, teacher = get_tokenizer("gpt2"), get_tokenizer(teacher_name)
    ro = rollouts_from_segments(student, [(("user", "What is 2+3?"),)], [[("5.", True)]],
                                finished=True)
    scored = RolloutScorer(student, [TeacherTokenization("t", teacher, None)])(ro)
    view = scored.batch.teacher("t")
    row = view.input_ids_BTt[0][view.attention_mask_BTt[0]]
    p, r = int(ro.prompt_len_B[0]), int(ro.response_len_B[0])
    stop_chunk = int(view.s_chunk_BTs[0, p + r - 1])
    last = int(view.attention_mask_BTt[0].sum()) - 1
    return teacher, row, stop_chunk, int(view.t_chunk_BTt[0, last])


@pytest.mark.real
def test_gemma_teacher_reads_its_own_turns_through_scoring(get_tokenizer):
    teacher, row, s_stop, t_stop = _teacher_row(get_tokenizer, "gemma3-270m")
    text = teacher.hf.decode(row.tolist(), skip_special_tokens=False)
    assert text == ("<bos><start_of_turn>user\nWhat is 2+3?<end_of_turn>\n"
                    "<start_of_turn>model\n5.<end_of_turn>")
    assert int(row[-1]) == end_of_turn_id(teacher)
    assert s_stop >= 0 and s_stop == t_stop  # the student's stop is paired with <end_of_turn>


def test_llama2_teacher_reads_inst_format_through_scoring(get_tokenizer):
    teacher, row, s_stop, t_stop = _teacher_row(get_tokenizer, "llama-spm")
    whole = teacher.encode("<s>[INST] What is 2+3? [/INST]5.", add_special_tokens=False).ids
    assert row.tolist() == list(whole) + [teacher.eos_id]
    assert s_stop >= 0 and s_stop == t_stop


def test_shipped_template_never_replaces_a_template(get_tokenizer):
    class Hf:
        chat_template = "{{ 'own' }}"
    hf = Hf()
    assert not apply_shipped_template(hf, "gemma3-270m") and hf.chat_template == "{{ 'own' }}"
    hf.chat_template = None
    assert not apply_shipped_template(hf, "gpt2") and hf.chat_template is None
    assert apply_shipped_template(hf, "llama-spm") and hf.chat_template == LLAMA2_CHAT_TEMPLATE


def test_llama_spm_builder_saves_the_template(tmp_path):
    """A fresh build writes the template into the asset folder (older builds get it at load)."""
    from xdistill.assets import BUILDERS, asset_dir

    out = tmp_path / "llama-spm"
    out.mkdir()
    BUILDERS["llama-spm"](asset_dir(), {}, out)
    saved = out / "chat_template.jinja"
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    template = saved.read_text() if saved.is_file() else cfg.get("chat_template")
    assert template == LLAMA2_CHAT_TEMPLATE
