"""Scoring rollouts for teachers of other tokenizers: identity path, a byte-identical teacher with
a renamed vocabulary (near-zero chunk losses), and multi-turn tool masks that survive
re-tokenization by two tokenizer families.

Legend: B samples, Ts/Tt student/teacher tokens, V vocabulary.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rollout_helpers import PermutedModel, PermutedTokenizer, tiny_llama
from xdistill.data import TeacherTokenization
from xdistill.losses import ChunkAlignment, projection_from_csr
from xdistill.losses.chunks import loss_chunks
from xdistill.losses.onpolicy import (ONPOLICY_LOSSES, Clamps, OnPolicyLossSpec,
                                      input_token_logprobs, onpolicy_loss)
from xdistill.losses.bytecredit import BYTE_CREDIT_KINDS, credit_alignment
from xdistill.losses.onpolicy_kinds import KINDS_2026
from xdistill.rollout.bytecredit import build_byte_terms
from xdistill.rollout import (HFGenerateEngine, RolloutScorer, SamplingParams,
                              rollouts_from_segments)
from xdistill.rollout.scoring import _truncate

TEXTS = [
    ("Tell me about the sea.", [("The sea is large and deep, and it is full of salt water.", True)]),
    ((("system", "You are terse."), ("user", "Count to five, please.")),
     [("One, two, three, four, five. Done!", True)]),
]
TOOL_TEXTS = [
    ((("user", "What is the weather in Paris?"),),
     [("Let me check. <call>weather(Paris)</call>", True),
      ("\n[tool] 18°C, cloudy; humidity 70%\n", False),
      ("It is 18 degrees and cloudy in Paris.", True)]),
    ("Compute 12*7 with the calculator:",
     [(" calc(12*7)", True), (" => 84 ", False), ("So the answer is 84.", True),
      (" [env] episode over ", False)]),
]


def _kind_kwargs(kind, view, t_logits, perm, V, s_table, t_table, s_logp_BTs):
    """Inputs of the 2026 kinds: they work on chunks (the identity view's for the same
    tokenizer), the shared vocabulary, the byte-prefix tables and the behaviour log-probs (= the
    student's own log-probs: the rollouts are scored by the model that 'sampled' them)."""
    from xdistill.losses.byteprefix import BytePrefixTables
    from xdistill.losses.onpolicy import input_token_logprobs
    from xdistill.projection.byteprefix import build_byteprefix_map
    from xdistill.rollout.bytecredit import build_long_token_tables

    t_ids = view.input_ids_BTt
    kw = dict(teacher_logits_BTtV=t_logits, teacher_ids_BTt=t_ids,
              t_loss_mask_BTt=view.loss_mask_BTt, behaviour_logp_BTs=s_logp_BTs,
              teacher_token_logp_BTt=input_token_logprobs(t_logits, t_ids),
              shared_s_idx_N=torch.arange(V),
              shared_t_idx_N=torch.arange(V) if view.identity else torch.from_numpy(perm),
              tables=BytePrefixTables.from_map(build_byteprefix_map(s_table, t_table)),
              long_tables=build_long_token_tables(s_table, t_table),
              ref_logp_BTs=s_logp_BTs)   # the reference is the student itself: KL 0
    return kw, ChunkAlignment.from_view(view)


def _loss_kwargs(kind, view, t_logits, perm, V):
    kw = {}
    if view.identity:
        kw["teacher_logits_BTtV"] = t_logits
        if kind == "topk_kl":
            lp = torch.log_softmax(t_logits, -1)
            kw = dict(topk_logp_BTtK=lp.topk(8, -1).values, topk_idx_BTtK=lp.topk(8, -1).indices)
        return kw, None
    align = ChunkAlignment.from_view(view)
    kw = dict(teacher_logits_BTtV=t_logits, teacher_ids_BTt=view.input_ids_BTt,
              t_loss_mask_BTt=view.loss_mask_BTt)
    if kind in ("reverse_kl", "jsd"):
        kw["projection"] = projection_from_csr(np.arange(V + 1), perm, np.ones(V), (V, V))
        kw["shared_s_idx_N"], kw["shared_t_idx_N"] = torch.arange(V), torch.from_numpy(perm)
    return kw, align


@pytest.fixture(scope="module")
def student(get_tokenizer):
    tok = get_tokenizer("gpt2")
    return tok, tiny_llama(tok.vocab_size, seed=1, logit_scale=20.0)


@pytest.mark.parametrize("cross", ["projection", "exact"])
def test_byte_identical_teachers_give_zero_loss(student, cross):
    """Teacher = student (identity path) and teacher = student with renamed ids (cross path).

    Rollouts come from text (the student's canonical tokenization), so the renamed teacher
    tokenizes the response exactly like the student and every chunk is 1:1; all losses vanish.
    (Sampled rollouts may be non-canonical: then chunk likelihoods compare different
    segmentations and are not zero even between byte-identical models.)
    """
    tok, model = student
    ptok = PermutedTokenizer(tok, seed=3)
    teacher = PermutedModel(model, ptok.perm)
    ro = rollouts_from_segments(tok, [p for p, _ in TEXTS], [s for _, s in TEXTS])
    scored = RolloutScorer(tok, [TeacherTokenization("same", tok), TeacherTokenization("perm", ptok)])(ro)
    b = scored.batch
    perm_view = b.teacher("perm")
    assert not perm_view.identity and perm_view.coverage_s == 1.0
    # every chunk is 1:1 with identical bytes except the final end-of-response role-token pair
    assert int((perm_view.chunk_valid_BC & ~perm_view.chunk_exact_BC).sum()) == len(TEXTS)
    z = model(input_ids=b.input_ids_BTs, attention_mask=b.attention_mask_BTs.long()).logits
    with torch.no_grad():
        zt_same = z.detach().clone()
        zt_perm = teacher(perm_view.input_ids_BTt, perm_view.attention_mask_BTt.long())
    s_logp = input_token_logprobs(z.detach(), b.input_ids_BTs, b.loss_mask_BTs)
    for kind in ONPOLICY_LOSSES:
        for view, zt in ((b.teacher("same"), zt_same), (perm_view, zt_perm)):
            if kind == "topk_kl" and not view.identity:
                continue
            if kind in KINDS_2026:
                t_table = tok.table if view.identity else ptok.table
                kw, align = _kind_kwargs(kind, view, zt, ptok.perm, tok.vocab_size, tok.table,
                                         t_table, s_logp)
            else:
                kw, align = _loss_kwargs(kind, view, zt, ptok.perm, tok.vocab_size)
            credits = ["token"]
            if kind in BYTE_CREDIT_KINDS and not view.identity:
                credits.append("byte")
            for credit in credits:
                spec = OnPolicyLossSpec(kind, cross=cross, clamps=Clamps(None, None, None),
                                        credit=credit)
                more = {}
                if credit == "byte":  # each side's byte-level probability: equal, r = 0
                    merged = credit_alignment(kind, spec.stop_advantage, align, scored.stop_BTs,
                                              b.loss_mask_BTs, view.loss_mask_BTt)
                    more = dict(byte_credit=build_byte_terms(
                        tok.table, ptok.table, b.input_ids_BTs, view.input_ids_BTt, merged,
                        b.loss_mask_BTs, view.loss_mask_BTt, scored.stop_BTs),
                        stop_BTs=scored.stop_BTs, teacher_logits_BTtV=zt,
                        teacher_ids_BTt=view.input_ids_BTt)
                out = onpolicy_loss(spec, z, b.input_ids_BTs, b.loss_mask_BTs, align=align,
                                    **{**kw, **more})
                (g,) = torch.autograd.grad(out.loss, z)
                assert out.units > 10, (kind, view.name)
                assert abs(float(out.loss.detach())) < 1e-5, (kind, view.name, credit,
                                                              float(out.loss))
                assert float(g.abs().max()) < 1e-5, (kind, view.name, credit)


def test_sampled_rollouts_identity_teacher_zero(student):
    tok, model = student
    ro = HFGenerateEngine(model, tok, max_prompt_len=32).generate(
        [p for p, _ in TEXTS], SamplingParams(1.0, 1.0, 10, seed=2))
    b = RolloutScorer(tok, [TeacherTokenization("same", tok)])(ro).batch
    z = model(input_ids=b.input_ids_BTs, attention_mask=b.attention_mask_BTs.long()).logits
    for kind in ("k1", "k3", "reverse_kl"):
        out = onpolicy_loss(OnPolicyLossSpec(kind), z, b.input_ids_BTs, b.loss_mask_BTs,
                            teacher_logits_BTtV=z.detach())
        (g,) = torch.autograd.grad(out.loss, z)
        assert out.units == int(ro.response_mask_BTr.sum())
        assert abs(float(out.loss.detach())) < 1e-6 and float(g.abs().max()) < 1e-6


def _runs(mask):
    """Maximal runs [a, b) of True in a 1-D bool array."""
    m = np.r_[False, np.asarray(mask, bool), False].astype(np.int8)
    d = np.diff(m)
    return list(zip(np.flatnonzero(d == 1), np.flatnonzero(d == -1)))


@pytest.mark.parametrize("teacher_name", ["qwen2", "mistral"])
def test_tool_spans_get_no_loss_on_any_side(get_tokenizer, student, teacher_name):
    tok, _ = student
    ttok = get_tokenizer(teacher_name)
    ro = rollouts_from_segments(tok, [p for p, _ in TOOL_TEXTS], [s for _, s in TOOL_TEXTS])
    scored = RolloutScorer(tok, [TeacherTokenization("t", ttok)])(ro)
    b, view = scored.batch, scored.batch.teacher("t")
    llm_texts = [t for _, segs in TOOL_TEXTS for t, llm in segs if llm]
    tool_texts = [t for _, segs in TOOL_TEXTS for t, llm in segs if not llm]
    assert 0.2 < scored.stats.tool_token_ratio < 0.6
    assert scored.stats.teacher_tool_ratio["t"] > 0.15
    # teacher side: every run of loss tokens spells a piece of an LLM segment, never tool text
    for row in range(2):
        ids = view.input_ids_BTt[row].numpy()
        for a, e in _runs(view.loss_mask_BTt[row].numpy()):
            text = ttok.table.concat(ids[a:e]).decode("utf-8", "replace")
            core = text.replace("\u2581", " ").strip()
            if not text:   # the teacher's end-of-turn token after the student's stop token
                assert e - a == 1 and ttok.table.roles_V[ids[a]] != 0
                continue
            assert core and any(core in t for t in llm_texts), (teacher_name, text)
            assert not any(core in t for t in tool_texts if len(core) > 3), text
    # chunks that carry loss contain only LLM tokens on both sides
    align = ChunkAlignment.from_view(view)
    ok = loss_chunks(align, b.loss_mask_BTs, view.loss_mask_BTt)
    assert int(ok.sum()) > 20
    for side, chunk, mask in (("s", align.s_chunk_BTs, b.loss_mask_BTs),
                              ("t", align.t_chunk_BTt, view.loss_mask_BTt)):
        in_loss = (chunk >= 0) & ok.gather(1, chunk.clamp_min(0))
        assert bool(mask[in_loss].all()), side
    # losses: tool positions get no gradient and teacher logits there do not matter
    g = torch.Generator().manual_seed(0)
    z = torch.randn(*b.input_ids_BTs.shape, tok.vocab_size, generator=g).requires_grad_(True)
    zt = torch.randn(*view.input_ids_BTt.shape, ttok.vocab_size, generator=g)
    tool_s = b.attention_mask_BTs & ~b.loss_mask_BTs
    tool_s[:, :int(ro.prompt_len_B.min())] = False
    tool_t = view.attention_mask_BTt & ~view.loss_mask_BTt
    zt2 = zt.clone()
    zt2[torch.roll(tool_t, -1, 1)] += 5 * torch.randn(int(tool_t.sum()), ttok.vocab_size,
                                                      generator=g)
    for kind in ("k1", "k3"):
        outs = []
        for teacher_logits in (zt, zt2):
            out = onpolicy_loss(OnPolicyLossSpec(kind), z, b.input_ids_BTs, b.loss_mask_BTs,
                                align=align, t_loss_mask_BTt=view.loss_mask_BTt,
                                teacher_logits_BTtV=teacher_logits, teacher_ids_BTt=view.input_ids_BTt)
            outs.append(out)
        (grad,) = torch.autograd.grad(outs[0].loss, z)
        rows = torch.roll(tool_s, -1, 1)
        assert float(grad[rows].abs().max()) == 0.0
        assert float(outs[0].loss.detach()) == pytest.approx(float(outs[1].loss.detach()), rel=1e-6)
        assert float(grad.abs().sum()) > 0


def test_truncate_keeps_the_bos_and_the_last_prompt_token():
    """From the definition, over random sizes: at most max_len tokens; the prefix keeps its
    first token when asked (the teacher's BOS) and a suffix of the rest, at least its last
    token when there is room; the region keeps the longest head that fits."""
    rng = np.random.default_rng(0)
    for _ in range(500):
        n_pre, n_reg, max_len = (int(x) for x in rng.integers([0, 0, 1], [8, 8, 14]))
        pre, reg = np.arange(100, 100 + n_pre), np.arange(200, 200 + n_reg)
        keep_first = n_pre > 0 and bool(rng.random() < 0.5)
        p, r, rl, rp, cut = _truncate(pre, reg, np.ones(n_reg, bool), np.zeros(n_reg, np.int64),
                                      max_len, keep_first)
        if n_pre + n_reg <= max_len:
            assert p.tolist() == pre.tolist() and r.tolist() == reg.tolist() and not cut
            continue
        assert p.size + r.size <= max_len
        assert r.tolist() == reg[:r.size].tolist() and rl.size == rp.size == r.size
        assert cut == (r.size < n_reg) and r.size == min(n_reg, max_len - p.size)
        head = int(keep_first)
        assert p[:head].tolist() == pre[:head].tolist()
        body = p[head:]
        assert body.tolist() == pre[n_pre - body.size:].tolist() if body.size else True
        if n_pre > head and max_len > head:
            assert body.size >= 1     # the prompt's last token survives
        assert body.size == min(max(max_len - n_reg - head, 1), n_pre - head, max(max_len - head, 0))


def test_a_cut_teacher_row_keeps_its_bos(get_tokenizer, student):
    """A teacher whose max_len is shorter than prompt + response: the prompt is cut from the left
    and the row still starts with the BOS the teacher asked for."""
    tok, _ = student
    ttok = get_tokenizer("mistral")
    ro = rollouts_from_segments(tok, [p for p, _ in TEXTS], [s for _, s in TEXTS])
    spec = TeacherTokenization("t", ttok, max_len=14, add_bos=True)
    view = RolloutScorer(tok, [spec])(ro).batch.teacher("t")
    for row in range(len(TEXTS)):
        n = int(view.attention_mask_BTt[row].sum())
        assert n <= 14 and int(view.input_ids_BTt[row, 0]) == ttok.bos_id


def test_identity_teacher_row_longer_than_its_max_len_is_an_error(student):
    tok, _ = student
    ro = rollouts_from_segments(tok, [p for p, _ in TEXTS], [s for _, s in TEXTS])
    longest = int((ro.prompt_len_B + ro.response_len_B).max())
    RolloutScorer(tok, [TeacherTokenization("same", tok, max_len=longest)])(ro)
    with pytest.raises(ValueError, match=rf"teacher 'same' uses the student's tokenizer .* row "
                                         rf"\d has {longest} tokens, more than its max_len "
                                         rf"{longest - 1}"):
        RolloutScorer(tok, [TeacherTokenization("same", tok, max_len=longest - 1)])(ro)


LONG_PROMPTS = ["one two three four five six seven eight nine ten eleven twelve",
                (("system", "Be brief, please."),
                 ("user", "Count on: one two three four five six seven eight nine ten")),
                (("user", "  Spaced café words, naïve ones, twelve or so of them here  "),)]


@pytest.mark.parametrize("s_name,t_name", [("gpt2", "qwen2"), ("qwen2", "mistral"),
                                           ("llama3", "gemma3-270m")])
def test_a_cut_student_prompt_is_the_teachers_context_too(get_tokenizer, s_name, t_name):
    """A prompt longer than rollout.max_prompt_len keeps its last student tokens; a
    cross-tokenizer teacher reads its own rendering from the same place (it read the whole
    prompt: context the student never saw), in the teacher row the scorer builds."""
    from xdistill.rollout.render import prompt_cut_offset, render_prompt, teacher_prompt_text

    s_tok, t_tok = get_tokenizer(s_name), get_tokenizer(t_name)
    ro = rollouts_from_segments(s_tok, LONG_PROMPTS, [[(" Yes.", True)]] * 3, max_prompt_len=9,
                                add_bos=False)
    spec = TeacherTokenization("t", t_tok, add_bos=False)
    view = RolloutScorer(s_tok, [spec], student_add_bos=False)(ro).batch.teacher("t")
    uncut = rollouts_from_segments(s_tok, LONG_PROMPTS, [[(" Yes.", True)]] * 3, add_bos=False)
    whole = RolloutScorer(s_tok, [spec], student_add_bos=False)(uncut).batch.teacher("t")
    for b, prompt in enumerate(LONG_PROMPTS):
        p = int(ro.prompt_len_B[b])
        cut = prompt_cut_offset(s_tok, prompt, p)
        s_raw = render_prompt(s_tok, prompt).encode()
        assert cut > 0 and s_tok.hf.decode(ro.prompt_ids_BTp[b, :p].tolist()) == \
            s_raw[cut:].decode()                          # where the student's kept row starts
        assert prompt_cut_offset(s_tok, prompt, 10_000) == 0
        t_text = teacher_prompt_text(t_tok, s_tok, prompt, cut)
        full = render_prompt(t_tok, prompt)
        assert full.endswith(t_text) and len(t_text) < len(full)
        if isinstance(prompt, str):
            assert t_text.encode() == s_raw[cut:]        # plain text: the very same bytes
        else:  # the same words of the last message, in the teacher's own template around them
            words = prompt[-1][1].split()
            s_part = s_raw[cut:].decode()
            first = next(i for i, w in enumerate(words) if " ".join(words[i:]) in s_part)
            assert " ".join(words[first:]) in t_text and " ".join(words[first - 1:]) not in t_text
        # the scorer's teacher row holds that prompt part, not the whole rendering
        assert int(view.attention_mask_BTt[b].sum()) < int(whole.attention_mask_BTt[b].sum())
