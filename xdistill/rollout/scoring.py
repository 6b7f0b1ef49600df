"""Rollouts -> a DistillBatch scored by teachers of any tokenizer (one TeacherView per teacher).

Legend: B samples, Tp/Tr student prompt/response tokens, Ts student row tokens, Tt teacher row
tokens, R response-region rows, K byte spans.

Student rows: ``prompt ids + response ids`` exactly as sampled (never re-tokenized), right-padded.
Student loss mask = the rollout's response mask (LLM tokens; tool/environment tokens and padding
are 0).

Teacher rows (cross tokenizer): ``[BOS] + encode(render_prompt(teacher, prompt)) +
encode(response text) [+ end token]``: the prompt is re-rendered with the teacher's own chat
template and generation prompt, and the response *bytes* (the concatenated table bytes of the
student's response tokens) are appended verbatim and tokenized on their own (so both sides have a
token boundary where the response starts). When the student's response ended with a stop token,
the teacher's own end-of-turn token (:func:`xdistill.rollout.render.end_of_turn_id`) follows; the
aligner pairs the two role tokens.

Masks through bytes: the LLM part of the response is a set of byte spans (maximal runs of
response tokens with mask 1). A teacher token carries loss iff it has bytes and they all lie
inside one LLM span (:func:`xdistill.data.chat.token_loss_mask`); the appended end token carries
loss iff the student's stop token did. Tokens straddling an LLM/tool edge carry no loss on either
side, and a chunk carries loss only if every token of it does on both sides
(:func:`xdistill.losses.chunks.loss_chunks`), so tool bytes never receive loss on any side.
Invalid UTF-8 in the response (a byte-level model may stop mid-character) is decoded with
U+FFFD per LLM/tool piece; the aligner's DP path leaves those bytes unaligned.

Only the response regions are aligned (``align_batch`` over B rows): prompt tokens belong to no
chunk on either side. Teachers whose tokenizer fingerprint equals the student's (and with the same
BOS setting) get the identity view: the student's ids, chunk ``i`` = token ``i``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from xdistill.data.batch import BatchStats, DistillBatch, TeacherView
from xdistill.data.chat import token_loss_mask
from xdistill.rollout.engine import Rollouts, _pad_id
from xdistill.rollout.render import end_of_turn_id, is_chat, render_prompt


@dataclass(frozen=True)
class ScoringStats:
    """Diagnostics of one scored batch (python numbers)."""

    # response tokens that are tool/environment tokens (mask 0), over all real response tokens
    tool_token_ratio: float = 0.0
    # real response tokens (student side)
    response_tokens: int = 0
    # per teacher: fraction of the teacher's response-region tokens that carry no loss
    teacher_tool_ratio: dict = field(default_factory=dict)
    # per teacher: fraction of student loss tokens inside a valid chunk
    coverage: dict = field(default_factory=dict)
    # per teacher: fraction of rows aligned through the DP path (bytes differed)
    dp_fraction: dict = field(default_factory=dict)
    # seconds spent re-rendering, tokenizing and aligning
    seconds: float = 0.0


@dataclass(frozen=True)
class ScoredBatch:
    """A DistillBatch built from rollouts, plus what the on-policy loss needs besides."""

    batch: DistillBatch
    # behaviour log-probs at student row positions (0 outside the response), float32 [B, Ts]
    behaviour_logp_BTs: torch.Tensor
    # row position of each sample's first response token, int64 [B]
    response_start_B: torch.Tensor
    # per-sample reward (None when the rollouts carry none), float32 [B]
    rewards_B: torch.Tensor | None
    stats: ScoringStats


def _student_rows(ro: Rollouts, pad: int):
    Lp, Lr = ro.prompt_len_B.tolist(), ro.response_len_B.tolist()
    B, Ts = ro.batch_size, max(a + b for a, b in zip(Lp, Lr))
    ids = torch.full((B, Ts), pad, dtype=torch.long)
    attn = torch.zeros((B, Ts), dtype=torch.bool)
    loss = torch.zeros((B, Ts), dtype=torch.bool)
    blp = torch.zeros((B, Ts), dtype=torch.float32)
    for b in range(B):
        p, r = Lp[b], Lr[b]
        ids[b, :p], ids[b, p:p + r] = ro.prompt_ids_BTp[b, :p], ro.response_ids_BTr[b, :r]
        attn[b, :p + r] = True
        loss[b, p:p + r] = ro.response_mask_BTr[b, :r]
        blp[b, p:p + r] = ro.behaviour_logp_BTr[b, :r]
    return ids, attn, loss, blp


def response_text(table, ids_T: np.ndarray, mask_T: np.ndarray) -> tuple[str, np.ndarray]:
    """(response text, LLM byte spans ``[K, 2]`` in ``text.encode()`` coordinates).

    The text is the concatenation of the tokens' table bytes, decoded per maximal run of equal
    mask (U+FFFD for invalid UTF-8); the spans are the decoded LLM runs.
    """
    lengths = table.lengths_V[ids_T] if ids_T.size else np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    raw = table.concat(ids_T)
    pieces, spans, pos = [], [], 0
    edges = np.flatnonzero(np.diff(mask_T.astype(np.int8))) + 1 if ids_T.size else np.zeros(0, int)
    for a, b in zip(np.r_[0, edges], np.r_[edges, ids_T.size]):
        if b <= a:
            continue
        lo = int(ends[a - 1]) if a > 0 else 0
        piece = raw[lo:int(ends[b - 1])].decode("utf-8", errors="replace")
        n = len(piece.encode("utf-8"))
        if mask_T[a] and n:
            spans.append((pos, pos + n))
        pieces.append(piece)
        pos += n
    return "".join(pieces), np.asarray(spans, dtype=np.int64).reshape(-1, 2)


class RolloutScorer:
    """``scorer(rollouts) -> ScoredBatch`` (see the module docstring).

    Args:
        student: the student tokenizer; teachers: ``xdistill.data.TeacherSpec`` per teacher.
        student_add_bos: whether the student's prompts start with its BOS (the engine's setting).
        chunks, method: passed to ``xdistill.align.align_batch``.
    """

    def __init__(self, student, teachers=(), *, student_add_bos: bool = False,
                 chunks: str = "minimal", method: str = "auto"):
        self.student, self.teachers = student, tuple(teachers)
        names = [t.name for t in self.teachers]
        if len(set(names)) != len(names):
            raise ValueError(f"teacher names must be unique, got {names}")
        self.student_add_bos, self.chunks, self.method = bool(student_add_bos), chunks, method

    def __call__(self, ro: Rollouts) -> ScoredBatch:
        t0 = time.perf_counter()
        ids, attn, loss, blp = _student_rows(ro, _pad_id(self.student))
        real = torch.arange(ro.response_ids_BTr.shape[1])[None, :] < ro.response_len_B[:, None]
        n_resp = int(real.sum())
        tool_ratio = float((real & ~ro.response_mask_BTr).sum()) / max(n_resp, 1)
        views, t_tool, cov, dp = [], {}, {}, {}
        for spec in self.teachers:
            if (spec.tokenizer.fingerprint == self.student.fingerprint
                    and bool(spec.add_bos) == self.student_add_bos):
                view = _identity_view(spec.name, ids, attn, loss)
                t_tool[spec.name], dp[spec.name] = tool_ratio, 0.0
            else:
                view, t_tool[spec.name], dp[spec.name] = self._teacher_view(spec, ro, ids.shape)
            cov_mask = loss.clone()
            cov_mask[:, 0] = False
            cov[spec.name] = float((view.s_chunk_BTs[cov_mask] >= 0).float().mean()) if cov_mask.any() else 1.0
            views.append(view)
        labels = torch.where(loss, ids, torch.full_like(ids, -100))
        seconds = time.perf_counter() - t0
        bstats = BatchStats(student_tokens=int(attn.sum()), loss_tokens=int(loss.sum()),
                            collate_seconds=seconds,
                            unaligned_fraction={v.name: 1.0 - v.coverage_s for v in views})
        batch = DistillBatch(ids, attn, labels, loss, tuple(views), bstats)
        stats = ScoringStats(tool_ratio, n_resp, t_tool, cov, dp, seconds)
        return ScoredBatch(batch, blp, ro.prompt_len_B.clone(), ro.rewards_B, stats)

    # ------------------------------------------------------------------ cross tokenizer
    def _regions(self, spec, ro: Rollouts):
        """Per sample: (teacher prefix ids, region ids, region loss, region phantom)."""
        tok, s_table = spec.tokenizer, self.student.table
        texts, spans = [], []
        for b in range(ro.batch_size):
            r = int(ro.response_len_B[b])
            text, sp = response_text(s_table, ro.response_ids_BTr[b, :r].numpy(),
                                     ro.response_mask_BTr[b, :r].numpy())
            texts.append(text)
            spans.append(sp)
        prefixes = [render_prompt(tok, p) for p in ro.prompts]
        encs = tok.encode_batch(prefixes + texts, add_special_tokens=False)
        out = []
        for b in range(ro.batch_size):
            pre = np.asarray(encs[b].ids, dtype=np.int64)
            if spec.add_bos:
                pre = np.concatenate([[int(tok.bos_id)], pre])
            enc = encs[ro.batch_size + b]
            t_ids = np.asarray(enc.ids, dtype=np.int64)
            t_loss = token_loss_mask(t_ids, np.asarray(enc.starts), np.asarray(enc.ends),
                                     tok.table.roles_V, spans[b], end_of_turn=False)
            r = int(ro.response_len_B[b])
            last = int(ro.response_ids_BTr[b, r - 1]) if r else -1
            if r and ro.finish_reasons[b] == "stop" and self.student.table.lengths_V[last] == 0:
                end = end_of_turn_id(tok) if is_chat(ro.prompts[b]) else tok.eos_id
                if end is not None:
                    t_ids = np.append(t_ids, int(end))
                    t_loss = np.append(t_loss, bool(ro.response_mask_BTr[b, r - 1]))
            pre, t_ids, t_loss = _truncate(pre, t_ids, t_loss, spec.max_len)
            out.append((pre, t_ids, t_loss, int(getattr(enc, "phantom_prefix", 0) or 0)))
        return out

    def _teacher_view(self, spec, ro: Rollouts, shape_BTs):
        from xdistill.align import align_batch

        B, Ts = shape_BTs
        regions = self._regions(spec, ro)
        s_len = ro.response_len_B.numpy().astype(np.int64)
        t_len = np.array([reg[1].size for reg in regions], dtype=np.int64)
        s_ids = np.zeros((B, max(int(s_len.max()), 1)), dtype=np.int64)
        s_ids[:, :ro.response_ids_BTr.shape[1]] = ro.response_ids_BTr.numpy()[:, :s_ids.shape[1]]
        s_ids[np.arange(s_ids.shape[1])[None, :] >= s_len[:, None]] = 0
        t_ids = np.zeros((B, max(int(t_len.max()), 1)), dtype=np.int64)
        for b, reg in enumerate(regions):
            t_ids[b, :reg[1].size] = reg[1]
        res = align_batch(s_ids, s_len, t_ids, t_len, self.student.table, spec.tokenizer.table,
                          s_phantom_B=np.zeros(B, dtype=np.int64),
                          t_phantom_B=np.array([reg[3] for reg in regions], dtype=np.int64),
                          chunks=self.chunks, method=self.method)
        rows = [np.concatenate([pre, reg]) for pre, reg, _, _ in regions]
        Tt = max(r.size for r in rows)
        pad = _pad_id(spec.tokenizer)
        ids_BTt = np.full((B, Tt), pad, dtype=np.int64)
        attn_BTt = np.zeros((B, Tt), dtype=bool)
        loss_BTt = np.zeros((B, Tt), dtype=bool)
        s_chunk = np.full((B, Ts), -1, dtype=np.int64)
        t_chunk = np.full((B, Tt), -1, dtype=np.int64)
        p_s = ro.prompt_len_B.numpy()
        for b, (pre, reg, reg_loss, _) in enumerate(regions):
            n = pre.size + reg.size
            ids_BTt[b, :n], attn_BTt[b, :n] = rows[b], True
            loss_BTt[b, pre.size:n] = reg_loss
            s_chunk[b, p_s[b]:p_s[b] + s_len[b]] = res.s_chunk_BTs[b, :s_len[b]]
            t_chunk[b, pre.size:n] = res.t_chunk_BTt[b, :reg.size]
        C = max(int(res.n_chunks_B.max(initial=0)), 1)
        valid = np.zeros((B, C), dtype=bool)
        exact = np.zeros((B, C), dtype=bool)
        valid[:, :res.chunk_valid_BC.shape[1]] = res.chunk_valid_BC[:, :C]
        exact[:, :res.chunk_exact_BC.shape[1]] = res.chunk_exact_BC[:, :C]
        region_tokens = int(t_len.sum())
        region_loss = sum(int(reg[2].sum()) for reg in regions)
        tool = 1.0 - region_loss / max(region_tokens, 1)
        cov_s = float((s_chunk >= 0).sum() / max(int(s_len.sum()), 1))
        cov_t = float((t_chunk >= 0).sum() / max(region_tokens, 1))
        view = TeacherView(spec.name, torch.from_numpy(ids_BTt), torch.from_numpy(attn_BTt),
                           torch.from_numpy(loss_BTt), torch.from_numpy(s_chunk),
                           torch.from_numpy(t_chunk), torch.from_numpy(valid),
                           torch.from_numpy(exact & valid), identity=False,
                           coverage_s=cov_s, coverage_t=cov_t)
        return view, tool, float(np.mean(res.used_dp_B)) if B else 0.0


def _truncate(pre, reg, reg_loss, max_len):
    """Fit ``prefix + region`` into ``max_len`` teacher tokens: drop prefix tokens from the left
    first (the generation prompt survives), then region tokens from the right."""
    if max_len is None or pre.size + reg.size <= max_len:
        return pre, reg, reg_loss
    keep_pre = max(max_len - reg.size, 1)
    pre = pre[-keep_pre:]
    room = max(max_len - pre.size, 0)
    return pre, reg[:room], reg_loss[:room]


def _identity_view(name: str, ids, attn, loss) -> TeacherView:
    B, T = ids.shape
    pos = torch.arange(T).expand(B, T)
    chunk = torch.where(attn, pos, torch.full_like(pos, -1))
    n = attn.sum(1)
    C = max(int(n.max()), 1)
    valid = torch.arange(C)[None, :] < n[:, None]
    return TeacherView(name, ids.clone(), attn.clone(), loss.clone(), chunk.clone(), chunk.clone(),
                       valid, valid.clone(), identity=True, coverage_s=1.0, coverage_t=1.0)


def rollouts_from_segments(tok, prompts, segments, *, max_prompt_len: int = 1024,
                           add_bos: bool = False, finished: bool = True) -> Rollouts:
    """Rollouts from multi-turn data: per sample a list of ``(text, is_llm)`` response segments.

    Each segment is tokenized by the student on its own (as an agent loop appends the tool's
    output after the model's tokens); LLM segments get mask 1, tool/environment segments 0. With
    ``finished`` the student's end-of-turn token closes the response as an LLM token. Behaviour
    log-probs are 0 (unknown): use these rollouts for scoring and the distillation losses, not for
    importance-sampling corrections.
    """
    from xdistill.rollout.render import encode_prompts

    prompts = tuple(prompts)
    if len(segments) != len(prompts):
        raise ValueError(f"{len(segments)} segment lists for {len(prompts)} prompts")
    pre = encode_prompts(tok, prompts, max_prompt_len, add_bos=add_bos)
    resp, masks = [], []
    for b, segs in enumerate(segments):
        ids, mask = [], []
        for text, is_llm in segs:
            seg_ids = np.asarray(tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)
            ids.append(seg_ids)
            mask.append(np.full(seg_ids.size, bool(is_llm)))
        if finished:
            end = end_of_turn_id(tok) if is_chat(prompts[b]) else tok.eos_id
            ids.append(np.array([end], dtype=np.int64))
            mask.append(np.ones(1, dtype=bool))
        resp.append(np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64))
        masks.append(np.concatenate(mask) if mask else np.zeros(0, dtype=bool))
    from xdistill.rollout.engine import _right_pad

    pad = _pad_id(tok)
    p_ids, p_len = _right_pad(pre, pad)
    r_ids, r_len = _right_pad(resp, pad)
    m = torch.zeros(r_ids.shape, dtype=torch.bool)
    for b, mk in enumerate(masks):
        m[b, :mk.size] = torch.from_numpy(mk)
    return Rollouts(prompts, p_ids, p_len, r_ids, r_len, m, torch.zeros(r_ids.shape),
                    1.0, 1.0, tuple("stop" if finished else "length" for _ in prompts))
