"""Review s25 (rollout): each test demonstrates a defect and FAILS on the reviewed code."""

from __future__ import annotations

import numpy as np
import torch

from xdistill.align import align_batch
from xdistill.losses import ChunkAlignment
from xdistill.losses.bytecredit import byte_logprob
from xdistill.losses.onpolicy import input_token_logprobs
from xdistill.rollout.bytecredit import build_byte_terms
from xdistill.tokenization.table import ROLE_BOS, ROLE_EOS, ROLE_TEXT, TokenByteTable

from bytecredit_reference import p_cover

BOS, END = 0, 1


# ----------------------------------------------------------------- tiny enumerable language models
class _Vocab:
    """Ids 0 (BOS) and 1 (END), then the given text pieces."""

    def __init__(self, pieces):
        self.pieces = [b"", b""] + [p.encode() for p in pieces]
        self.table = TokenByteTable.from_bytes_list(
            self.pieces, [ROLE_BOS, ROLE_EOS] + [ROLE_TEXT] * len(pieces))
        self.V = len(self.pieces)

    def id(self, piece: str) -> int:
        return self.pieces.index(piece.encode())


class _LM:
    """A distribution after every token prefix: seeded random logits, overridden by
    ``bias(prefix) -> {id: logit}``."""

    def __init__(self, vocab: _Vocab, seed: int, bias=None):
        self.vocab, self.seed, self.bias = vocab, seed, bias or (lambda p: {})

    def logp(self, prefix: tuple) -> np.ndarray:
        z = np.random.default_rng([self.seed, len(prefix), *prefix]).normal(size=self.vocab.V)
        z[BOS] = -np.inf
        for tid, val in self.bias(prefix).items():
            z[tid] = val
        m = z[np.isfinite(z)].max()
        return z - (m + np.log(np.exp(z - m).sum()))

    def p(self, prefix) -> np.ndarray:
        return np.exp(self.logp(tuple(prefix)))

    def logits(self, ids) -> torch.Tensor:
        return torch.tensor(np.stack([self.logp(tuple(ids[:t + 1])) for t in range(len(ids))]),
                            dtype=torch.float64)[None]


def _bounds(lm: _LM, ids, terms):
    z = lm.logits(ids)
    lb, ub = byte_logprob(z, input_token_logprobs(z, torch.tensor([ids])), terms)
    return lb.exp().tolist(), ub.exp().tolist()


# ------------------------------------------------------------------ 1. phantom bytes in byte credit
def test_byte_credit_of_a_unit_after_a_straddling_teacher_token_is_conditioned_on_the_prompt():
    """The prompt ends in a space (``"A: "``) and the student answers ``28``. The teacher reads
    the text in one piece (:mod:`xdistill.rollout.teacher_text`), so its first response token
    ``" 2"`` straddles the boundary and carries one phantom byte (the prompt's space, which the
    aligner removes: the unit's bytes are ``28`` on both sides).

    Expected (module doc of :mod:`xdistill.losses.bytecredit`: the event is the unit's bytes
    *from the model's state at the unit's start*): the teacher's probability that a text
    reading ``"A: "`` continues with ``28`` (no student token extends ``28``, so no boundary
    term), i.e. ``P_T([" 28"] | "A:") / P_T([" "] | "A:")``. The teacher here puts all its mass
    after ``"A:"`` on ``" 2"`` or ``"B"``, and none off its path, so the bounds must be exact.

    Actual: :func:`xdistill.rollout.bytecredit.build_byte_terms` builds the teacher's terms from
    its tokens' full table bytes (``" 28"``), phantom byte included: it scores the joint
    probability of the prompt's own space and the answer, ``P_T([" 28"] | "A:")``, 2.5 times
    too small here (and the student side has no such factor, so the credit is biased by the
    log-probability of the prompt's last byte)."""
    sv = _Vocab(["A", ":", " ", "2", "8", "28", "B"])
    tv = _Vocab(["A", ":", " ", "2", "8", " 2", "B"])
    # teacher: after "A:" 40 % " 2", 60 % "B" (never " ", never the end); after " 2": 70 % "8"
    a_t, colon_t, sp2_t, eight_t = tv.id("A"), tv.id(":"), tv.id(" 2"), tv.id("8")
    big = -60.0

    def t_bias(prefix):
        if prefix == (BOS, a_t, colon_t):
            return {i: (np.log(0.4) if i == sp2_t else np.log(0.6) if i == tv.id("B") else big)
                    for i in range(1, tv.V)}
        if prefix == (BOS, a_t, colon_t, sp2_t):
            return {i: (np.log(0.7) if i == eight_t else np.log(0.3 / (tv.V - 2)))
                    for i in range(1, tv.V)}
        return {}

    t_lm = _LM(tv, 1, t_bias)
    s_lm = _LM(sv, 2)
    # student row: BOS A : ' ' | 28 ; teacher row: BOS A : | ' 2' 8 (the one-piece reading)
    s_ids = [BOS, sv.id("A"), sv.id(":"), sv.id(" "), sv.id("28")]
    t_ids = [BOS, a_t, colon_t, sp2_t, eight_t]
    res = align_batch(np.array([[sv.id("28")]]), np.array([1]), np.array([[sp2_t, eight_t]]),
                      np.array([2]), sv.table, tv.table, t_phantom_BTt=np.array([[1, 0]]))
    assert res.n_chunks_B.tolist() == [1] and res.t_chunk_BTt.tolist() == [[0, 0]]
    align = ChunkAlignment(torch.tensor([[-1, -1, -1, -1, 0]]), torch.tensor([[-1, -1, -1, 0, 0]]),
                           torch.tensor([[True]]), torch.tensor([[False]]))
    s_mask = torch.tensor([[False, False, False, False, True]])
    t_mask = torch.tensor([[False, False, False, True, True]])
    credit = build_byte_terms(sv.table, tv.table, torch.tensor([s_ids]), torch.tensor([t_ids]),
                              align, s_mask, t_mask, None,
                              t_phantom_BTt=torch.tensor([[0, 0, 0, 1, 0]]))   # the view's
    ctx = (BOS, a_t, colon_t)
    ref = p_cover(t_lm, b" 28", ctx) / p_cover(t_lm, b" ", ctx)
    lb, ub = _bounds(t_lm, t_ids, credit.teacher)
    assert lb[0] <= ref * (1 + 1e-9) and ref <= ub[0] * (1 + 1e-9), (lb[0], ref, ub[0])


# ------------------------------------------------------ 2./3. base vs instruct: one tokenizer.json
def _base_and_instruct(name: str):
    """Two fresh copies of one tokenizer (same ``tokenizer.json``, same fingerprint): the
    "instruct" one with its chat template, the "base" one without (a base checkpoint)."""
    from xdistill.tokenization import load_tokenizer

    instruct, base = load_tokenizer(name), load_tokenizer(name)
    base.hf.chat_template = None
    assert base.fingerprint == instruct.fingerprint
    return base, instruct


def test_end_of_turn_id_follows_the_chat_template_not_only_the_fingerprint(monkeypatch):
    """Llama-3 base and Llama-3-Instruct share ``tokenizer.json`` (one fingerprint) but not their
    chat templates: the instruct template ends an assistant turn with ``<|eot_id|>``, the base
    tokenizer has no template (its end is the EOS ``<|end_of_text|>``).

    Expected: ``end_of_turn_id`` of the instruct tokenizer is ``<|eot_id|>`` whatever was asked
    before. Actual: the result is cached by fingerprint only (``render._EOT_CACHE``), so once
    the base student's value is cached the instruct teacher gets ``<|end_of_text|>``: the scorer
    appends the wrong end token to the teacher's chat rows (and, the other way round, the
    student's stop ids pick up the teacher's end of turn)."""
    from xdistill.rollout import render

    monkeypatch.setattr(render, "_EOT_CACHE", {})      # no leak into other tests
    base, instruct = _base_and_instruct("llama3")
    eot = int(instruct.hf.convert_tokens_to_ids("<|eot_id|>"))
    assert render.end_of_turn_id(base) == base.eos_id
    assert render.end_of_turn_id(instruct) == eot


def test_same_tokenizer_json_with_another_chat_template_gets_the_teachers_rendering(monkeypatch):
    """A base student (no chat template) scored by an instruct teacher of the same
    ``tokenizer.json`` on a chat prompt.

    Expected: the teacher reads the prompt rendered with *its own* template and generation
    prompt (module doc of :mod:`xdistill.rollout.scoring`; the off-policy collator refuses the
    identity view in exactly this case: "a base and an instruct checkpoint share tokenizer.json
    but not their templates"). Actual: ``RolloutScorer`` takes the identity view whenever the
    fingerprints and BOS settings match, so the instruct teacher scores the student's generic
    ``user: ...`` rendering, which it never saw in training."""
    from xdistill.data import TeacherTokenization
    from xdistill.rollout import RolloutScorer, render, rollouts_from_segments

    monkeypatch.setattr(render, "_EOT_CACHE", {})
    base, instruct = _base_and_instruct("llama3")
    conv = (("user", "What is 3+4?"),)
    ro = rollouts_from_segments(base, [conv], [[("It is 7.", True)]], add_bos=True)
    spec = TeacherTokenization("t", instruct, add_bos=True)
    view = RolloutScorer(base, [spec], student_add_bos=True)(ro).batch.teacher("t")
    row = view.input_ids_BTt[0][view.attention_mask_BTt[0]].numpy()
    text = instruct.hf.decode(row.tolist())
    assert render.render_prompt(instruct, conv) in text, text
    assert not view.identity


# ------------------------------------------------------------------ 4. a prompt cut down to its BOS
def test_a_prompt_row_cut_to_its_bos_scores_with_no_prompt_context(get_tokenizer):
    """``rollout.max_prompt_len: 1`` is accepted (``RolloutConfig`` wants >= 1) and, with the
    student's BOS, :func:`encode_prompts` keeps the BOS alone: the student saw none of the
    prompt. Expected: the cut offset is the end of the rendering (``prompt_cut_offset(tok,
    prompt, 0)`` = its byte length) and a cross-tokenizer teacher reads no prompt byte either.
    Actual: ``prompt_cut_offset`` indexes ``starts[len(starts)]`` and the scorer dies with an
    ``IndexError``."""
    from xdistill.data import TeacherTokenization
    from xdistill.rollout import RolloutScorer, rollouts_from_segments
    from xdistill.rollout.render import prompt_cut_offset

    s_tok, t_tok = get_tokenizer("llama3"), get_tokenizer("qwen2")
    prompt, resp = "Tell me a story", " Once upon a time."
    ro = rollouts_from_segments(s_tok, [prompt], [[(resp, True)]], add_bos=True,
                                max_prompt_len=1, finished=False)
    assert ro.prompt_ids_BTp[0, :int(ro.prompt_len_B[0])].tolist() == [s_tok.bos_id]
    assert prompt_cut_offset(s_tok, prompt, 0) == len(prompt.encode())
    spec = TeacherTokenization("t", t_tok, add_bos=True)
    view = RolloutScorer(s_tok, [spec], student_add_bos=True)(ro).batch.teacher("t")
    row = view.input_ids_BTt[0][view.attention_mask_BTt[0]].numpy()
    assert t_tok.table.concat(row) == resp.encode()


def test_the_scorers_view_carries_the_straddling_tokens_phantom_byte(get_tokenizer):
    """The plain prompt ``"The capital of France is "`` ends in a space; a Llama-3 teacher reads
    ``" Paris"`` in one piece. The view hands that token's phantom byte to byte credit
    (``TeacherView.t_phantom_BTt``, read by the trainer's ``byte_credit_terms``), and the
    terms built from it score the unit given the space (one denominator unit)."""
    from xdistill.data import TeacherTokenization
    from xdistill.rollout import RolloutScorer, rollouts_from_segments

    s_tok, t_tok = get_tokenizer("gpt2"), get_tokenizer("llama3")
    ro = rollouts_from_segments(s_tok, ["The capital of France is "], [[("Paris.", True)]],
                                add_bos=False)
    spec = TeacherTokenization("t", t_tok, add_bos=True)
    batch = RolloutScorer(s_tok, [spec], student_add_bos=False)(ro).batch
    view = batch.teacher("t")
    ph = view.t_phantom_BTt[0]
    first = int(torch.nonzero(view.loss_mask_BTt[0])[0])
    assert t_tok.table.token_bytes(int(view.input_ids_BTt[0, first])) == b" Paris"
    assert int(ph[first]) == 1 and int(ph.sum()) == 1
    align = ChunkAlignment(view.s_chunk_BTs, view.t_chunk_BTt, view.chunk_valid_BC,
                           view.chunk_exact_BC)
    credit = build_byte_terms(s_tok.table, t_tok.table, batch.input_ids_BTs, view.input_ids_BTt,
                              align, batch.loss_mask_BTs, view.loss_mask_BTt, None,
                              t_phantom_BTt=view.t_phantom_BTt)
    assert credit.teacher.num_den == 1 and int((credit.teacher.den_N >= 0).sum()) == 1
