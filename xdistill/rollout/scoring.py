"""Rollouts -> a DistillBatch scored by teachers of any tokenizer (one TeacherView per teacher).

Legend: B samples, Tp/Tr student prompt/response tokens, Ts student row tokens, Tt teacher row
tokens, R response-region rows, K byte spans.

Student rows: ``prompt ids + response ids`` exactly as sampled (never re-tokenized), right-padded.
Student loss mask = the rollout's response mask (LLM tokens; tool/environment tokens and padding
are 0).

Teacher rows (cross tokenizer): ``[BOS] +`` the teacher's own rendering of the prompt (its chat
template and generation prompt) with the student's response bytes inside, encoded in one piece
(:mod:`xdistill.rollout.teacher_text`: no byte added or lost; invalid UTF-8 spelled with the
teacher's byte tokens; a token straddling the prompt/response boundary carries phantom bytes) ``[+
end token]``. When the student's response ended with a stop token (EOS or end-of-turn), the
teacher's end token for the conversation (:func:`xdistill.rollout.render.end_of_turn_id`) follows
and the two stop tokens are paired as one role chunk whatever their roles: an end of turn on one
side is a stop on the other (:func:`bridge_stops`).

Masks through bytes: the LLM part of the response is a set of byte spans (maximal runs of
response tokens with mask 1). A teacher token carries loss iff it has bytes and they all lie
inside one LLM span (:func:`xdistill.data.chat.token_loss_mask`); the appended end token carries
loss iff the student's stop token did. Tokens straddling an LLM/tool edge carry no loss on either
side, and a chunk carries loss only if every token of it does on both sides
(:func:`xdistill.losses.chunks.loss_chunks`), so tool bytes never receive loss on any side.

Unpaired bytes: student loss tokens that no chunk pairs although the teacher read their bytes
(bytes the teacher vocabulary cannot spell, regions the aligner could not pair) are marked in the
view's ``s_unpaired_BTs``; the on-policy losses give them a documented penalty and the trainer
reports ``<teacher>/unaligned_frac`` (their share of the response's loss bytes).

Only the response regions are aligned (``align_batch`` over B rows): prompt tokens belong to no
chunk on either side. Teachers whose tokenizer fingerprint equals the student's (and with the same
BOS setting) get the identity view: the student's ids, chunk ``i`` = token ``i``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from xdistill.align import align_batch
from xdistill.data.batch import BatchStats, DistillBatch, TeacherView
from xdistill.data.chat import renders_alike, token_loss_mask
from xdistill.data.collator import resolve_teacher_bos
from xdistill.rollout.engine import Rollouts, _right_pad
from xdistill.rollout.render import (encode_prompts, end_of_turn_id, is_chat, prompt_cut_offset,
                                     teacher_prompt_text)
from xdistill.rollout.teacher_text import encode_continuation, teacher_region
from xdistill.tokenization.bos import resolve_add_bos
from xdistill.tokenization.tokenizer import padding_id


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
    # per teacher: fraction of the student's loss bytes in tokens no chunk pairs
    unaligned_frac: dict = field(default_factory=dict)
    # per teacher: response bytes its vocabulary cannot spell (left out of its text)
    missing_bytes: dict = field(default_factory=dict)
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
    # the student's own final stop token of responses that stopped (EOS / end of turn), bool
    # [B, Ts]; None when unknown
    stop_BTs: torch.Tensor | None = None


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
    mask (U+FFFD for invalid UTF-8); the spans are the decoded LLM runs. (For display; the scorer
    works on the raw bytes, :func:`response_bytes`.)
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


def response_bytes(table, ids_T: np.ndarray, mask_T: np.ndarray) -> tuple[bytes, np.ndarray]:
    """(the response's raw bytes, LLM byte spans ``[K, 2]``: maximal runs of mask-1 tokens)."""
    if ids_T.size == 0:
        return b"", np.zeros((0, 2), dtype=np.int64)
    beyond = ids_T[ids_T >= table.lengths_V.size]
    if beyond.size:
        raise ValueError(f"a rollout holds token id {int(beyond[0])}, beyond the student "
                         f"tokenizer's {table.lengths_V.size} ids (the engine sampled a padded "
                         "logit column; it must not sample ids the tokenizer lacks)")
    ends = np.cumsum(table.lengths_V[ids_T])
    starts = ends - table.lengths_V[ids_T]
    spans = []
    edges = np.flatnonzero(np.diff(mask_T.astype(np.int8))) + 1
    for a, b in zip(np.r_[0, edges], np.r_[edges, ids_T.size]):
        if mask_T[a] and ends[b - 1] > starts[a]:
            spans.append((int(starts[a]), int(ends[b - 1])))
    return table.concat(ids_T), np.asarray(spans, dtype=np.int64).reshape(-1, 2)


def bridge_stops(s_chunk_BTs, t_chunk_BTt, valid_BC, n_chunks_B, s_end_B, t_end_B) -> int:
    """Pair each row's final student stop token (row position ``s_end_B[b]``, -1 = none) with
    the teacher's appended end token (``t_end_B[b]``, -1 = none) as one role chunk, in place,
    when the aligner left both unpaired -- an EOS on one side against an end-of-turn marker on
    the other. ``valid_BC`` needs a spare column. Returns the number of bridged rows."""
    bridged = 0
    for b in range(s_chunk_BTs.shape[0]):
        i, j = int(s_end_B[b]), int(t_end_B[b])
        if i < 0 or j < 0 or s_chunk_BTs[b, i] >= 0 or t_chunk_BTt[b, j] >= 0:
            continue
        k = int(n_chunks_B[b])
        s_chunk_BTs[b, i], t_chunk_BTt[b, j] = k, k
        valid_BC[b, k] = True
        n_chunks_B[b] = k + 1
        bridged += 1
    return bridged


class RolloutScorer:
    """``scorer(rollouts) -> ScoredBatch`` (see the module docstring).

    Args:
        student: the student tokenizer; teachers: ``xdistill.data.TeacherTokenization`` per teacher.
        student_add_bos: whether the student's prompts start with its BOS (the engine's setting;
            None: the student model's default). A teacher's ``add_bos=None``: its model's.
        chunks, method: passed to ``xdistill.align.align_batch``.
    """

    def __init__(self, student, teachers=(), *, student_add_bos: bool | None = None,
                 chunks: str = "minimal", method: str = "auto"):
        self.student, self.teachers = student, resolve_teacher_bos(teachers)
        names = [t.name for t in self.teachers]
        if len(set(names)) != len(names):
            raise ValueError(f"teacher names must be unique, got {names}")
        self.chunks, self.method = chunks, method
        self.student_add_bos = resolve_add_bos(student_add_bos, student, "rollout.add_bos")

    def __call__(self, ro: Rollouts) -> ScoredBatch:
        t0 = time.perf_counter()
        ids, attn, loss, blp = _student_rows(ro, padding_id(self.student))
        real = torch.arange(ro.response_ids_BTr.shape[1])[None, :] < ro.response_len_B[:, None]
        n_resp = int(real.sum())
        tool_ratio = float((real & ~ro.response_mask_BTr).sum()) / max(n_resp, 1)
        views, t_tool, cov, dp, unal, missing = [], {}, {}, {}, {}, {}
        cuts = None   # where each student prompt row starts in its rendering: once per batch
        chat = any(is_chat(p) for p in ro.prompts)
        for spec in self.teachers:
            if (bool(spec.add_bos) == self.student_add_bos
                    and renders_alike(spec.tokenizer, self.student, chat)):
                view = _identity_view(spec, ids, attn, loss)
                t_tool[spec.name], dp[spec.name] = tool_ratio, 0.0
                unal[spec.name], missing[spec.name] = 0.0, 0
            else:
                cuts = cuts or [self._student_cut(ro, b) for b in range(ro.batch_size)]
                view, t_tool[spec.name], dp[spec.name], extra = self._teacher_view(
                    spec, ro, ids.shape, cuts)
                unal[spec.name], missing[spec.name] = extra["unaligned_frac"], extra["missing_bytes"]
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
        stats = ScoringStats(tool_ratio, n_resp, t_tool, cov, dp, unal, missing, seconds)
        stop = torch.zeros_like(loss)
        for b in range(ro.batch_size):
            if self._stopped(ro, b):
                stop[b, int(ro.prompt_len_B[b] + ro.response_len_B[b]) - 1] = True
        return ScoredBatch(batch, blp, ro.prompt_len_B.clone(), ro.rewards_B, stats, stop)

    # ------------------------------------------------------------------ cross tokenizer
    def _regions(self, spec, ro: Rollouts, cuts: list[int]):
        """Per sample: (prefix ids, region ids, region loss, region phantom, teacher stop,
        missing bytes, LLM spans, region byte end); ``cuts``: :meth:`_student_cut` per sample."""
        tok, s_table = spec.tokenizer, self.student.table
        out = []
        for b in range(ro.batch_size):
            r = int(ro.response_len_B[b])
            raw, spans = response_bytes(s_table, ro.response_ids_BTr[b, :r].numpy(),
                                        ro.response_mask_BTr[b, :r].numpy())
            reg = teacher_region(tok, teacher_prompt_text(tok, self.student, ro.prompts[b],
                                                          cuts[b]), raw)
            pre = reg.prefix_ids
            if spec.add_bos and not (pre.size and int(pre[0]) == int(tok.bos_id)):
                pre = np.concatenate([[int(tok.bos_id)], pre])
            t_ids, t_ph = reg.ids_T, reg.phantom_T
            t_loss = token_loss_mask(t_ids, reg.starts_T, reg.ends_T, tok.table.roles_V, spans,
                                     end_of_turn=False)
            t_stop = False
            if self._stopped(ro, b):
                end = end_of_turn_id(tok) if is_chat(ro.prompts[b]) else tok.eos_id
                if end is not None:
                    t_ids, t_ph = np.append(t_ids, int(end)), np.append(t_ph, 0)
                    t_loss = np.append(t_loss, bool(ro.response_mask_BTr[b, r - 1]))
                    t_stop = True
            pre, t_ids, t_loss, t_ph, cut = _truncate(pre, t_ids, t_loss, t_ph, spec.max_len,
                                                      keep_first=_starts_with_bos(pre, tok))
            # response bytes the teacher read (none when the cut left no region token)
            seen = (int(reg.ends_T[t_ids.size - 1]) if t_ids.size else 0) if cut else len(raw)
            out.append((pre, t_ids, t_loss, t_ph, t_stop and not cut, reg.missing_bytes, seen))
        return out

    def _teacher_view(self, spec, ro: Rollouts, shape_BTs, cuts: list[int]):
        B, Ts = shape_BTs
        regions = self._regions(spec, ro, cuts)
        s_len = ro.response_len_B.numpy().astype(np.int64)
        t_len = np.array([reg[1].size for reg in regions], dtype=np.int64)
        s_ids = np.zeros((B, max(int(s_len.max()), 1)), dtype=np.int64)
        s_ids[:, :ro.response_ids_BTr.shape[1]] = ro.response_ids_BTr.numpy()[:, :s_ids.shape[1]]
        s_ids[np.arange(s_ids.shape[1])[None, :] >= s_len[:, None]] = 0
        t_ids = np.zeros((B, max(int(t_len.max()), 1)), dtype=np.int64)
        t_ph = np.zeros_like(t_ids)
        for b, reg in enumerate(regions):
            t_ids[b, :reg[1].size], t_ph[b, :reg[3].size] = reg[1], reg[3]
        res = align_batch(s_ids, s_len, t_ids, t_len, self.student.table, spec.tokenizer.table,
                          t_phantom_BTt=t_ph, chunks=self.chunks, method=self.method)
        rows = [np.concatenate([pre, reg]) for pre, reg, *_ in regions]
        Tt = max(r.size for r in rows)
        pad = padding_id(spec.tokenizer)
        ids_BTt = np.full((B, Tt), pad, dtype=np.int64)
        attn_BTt = np.zeros((B, Tt), dtype=bool)
        loss_BTt = np.zeros((B, Tt), dtype=bool)
        s_chunk = np.full((B, Ts), -1, dtype=np.int64)
        t_chunk = np.full((B, Tt), -1, dtype=np.int64)
        ph_BTt = np.zeros((B, Tt), dtype=np.int64)
        p_s = ro.prompt_len_B.numpy()
        for b, (pre, reg, reg_loss, *_) in enumerate(regions):
            n = pre.size + reg.size
            ids_BTt[b, :n], attn_BTt[b, :n] = rows[b], True
            loss_BTt[b, pre.size:n] = reg_loss
            ph_BTt[b, pre.size:n] = t_ph[b, :reg.size]
            s_chunk[b, p_s[b]:p_s[b] + s_len[b]] = res.s_chunk_BTs[b, :s_len[b]]
            t_chunk[b, pre.size:n] = res.t_chunk_BTt[b, :reg.size]
        C = int(res.n_chunks_B.max(initial=0)) + 1   # a spare column for the stop bridge
        valid = np.zeros((B, C), dtype=bool)
        exact = np.zeros((B, C), dtype=bool)
        valid[:, :res.chunk_valid_BC.shape[1]] = res.chunk_valid_BC
        exact[:, :res.chunk_exact_BC.shape[1]] = res.chunk_exact_BC
        s_end = np.array([p_s[b] + n - 1 if self._stopped(ro, b) else -1
                          for b, n in enumerate(s_len)])
        t_end = np.array([reg[0].size + reg[1].size - 1 if reg[4] else -1 for reg in regions])
        bridge_stops(s_chunk, t_chunk, valid, res.n_chunks_B.copy(), s_end, t_end)
        unpaired, frac = self._unpaired(ro, s_chunk, regions)
        region_tokens = int(t_len.sum())
        region_loss = sum(int(reg[2].sum()) for reg in regions)
        tool = 1.0 - region_loss / max(region_tokens, 1)
        cov_s = float((s_chunk >= 0).sum() / max(int(s_len.sum()), 1))
        cov_t = float((t_chunk >= 0).sum() / max(region_tokens, 1))
        view = TeacherView(spec.name, torch.from_numpy(ids_BTt), torch.from_numpy(attn_BTt),
                           torch.from_numpy(loss_BTt), torch.from_numpy(s_chunk),
                           torch.from_numpy(t_chunk), torch.from_numpy(valid),
                           torch.from_numpy(exact & valid), identity=False,
                           coverage_s=cov_s, coverage_t=cov_t,
                           s_unpaired_BTs=torch.from_numpy(unpaired),
                           t_phantom_BTt=torch.from_numpy(ph_BTt))
        extra = {"unaligned_frac": frac, "missing_bytes": sum(reg[5] for reg in regions)}
        return view, tool, float(np.mean(res.used_dp_B)) if B else 0.0, extra

    def _student_cut(self, ro: Rollouts, b: int) -> int:
        """Byte offset in the student's rendering of prompt ``b`` where its (left-cut) prompt
        row starts (0: not cut): a cross-tokenizer teacher reads the prompt from there."""
        row = ro.prompt_ids_BTp[b, :int(ro.prompt_len_B[b])]
        kept = row.numel() - int(self.student_add_bos and row.numel() > 0
                                 and int(row[0]) == self.student.bos_id)
        return prompt_cut_offset(self.student, ro.prompts[b], kept)

    def _stopped(self, ro: Rollouts, b: int) -> bool:
        """The student's response ``b`` ended with its own stop token (a zero-byte role token)."""
        r = int(ro.response_len_B[b])
        return bool(r and ro.finish_reasons[b] == "stop" and
                    self.student.table.lengths_V[int(ro.response_ids_BTr[b, r - 1])] == 0)

    def _unpaired(self, ro: Rollouts, s_chunk_BTs, regions):
        """(student loss tokens the teacher read but no chunk pairs, bool [B, Ts]; their share of
        the response's loss bytes)."""
        B, Ts = s_chunk_BTs.shape
        out = np.zeros((B, Ts), dtype=bool)
        lengths = self.student.table.lengths_V
        bad_bytes = tot_bytes = 0
        for b in range(B):
            p, r = int(ro.prompt_len_B[b]), int(ro.response_len_B[b])
            ids = ro.response_ids_BTr[b, :r].numpy()
            mask = ro.response_mask_BTr[b, :r].numpy().astype(bool)
            ends = np.cumsum(lengths[ids]) if r else np.zeros(0, np.int64)
            # zero-byte tokens (the stop token) are paired by the stop bridge when the teacher
            # has an end token; a teacher without one never read a stop
            seen = (ends <= regions[b][6]) & (lengths[ids] > 0)
            unp = mask & (s_chunk_BTs[b, p:p + r] < 0) & seen
            out[b, p:p + r] = unp
            nbytes = np.maximum(lengths[ids], 1)  # a stop token counts as one unit
            bad_bytes += int(nbytes[unp].sum())
            tot_bytes += int(nbytes[mask].sum())
        return out, bad_bytes / max(tot_bytes, 1)


def _starts_with_bos(pre, tok) -> bool:
    return bool(pre.size) and tok.bos_id is not None and int(pre[0]) == int(tok.bos_id)


def _truncate(pre, reg, reg_loss, reg_ph, max_len, keep_first: bool = False):
    """Fit ``prefix + region`` into ``max_len`` teacher tokens: drop prefix tokens from the left
    first, keeping the first one when ``keep_first`` (the teacher's BOS) and at least the last
    one, then region tokens from the right. The last value tells whether region tokens were
    cut."""
    if max_len is None or pre.size + reg.size <= max_len:
        return pre, reg, reg_loss, reg_ph, False
    head = pre[:1] if keep_first else pre[:0]
    body = pre[head.size:]
    keep = min(max(max_len - reg.size - head.size, 1), body.size, max(max_len - head.size, 0))
    pre = np.concatenate([head, body[body.size - keep:]])
    room = max(max_len - pre.size, 0)
    return pre, reg[:room], reg_loss[:room], reg_ph[:room], room < reg.size


def _identity_view(spec, ids, attn, loss) -> TeacherView:
    """The student's rows as they are (same tokenizer and BOS); a row longer than the teacher's
    ``max_len`` is an error (cutting it would move the teacher's positions off the student's)."""
    name, lengths = spec.name, attn.sum(1)
    if spec.max_len is not None and int(lengths.max()) > spec.max_len:
        b = int(lengths.argmax())
        raise ValueError(f"teacher {name!r} uses the student's tokenizer and scores its rows as "
                         f"they are, but row {b} has {int(lengths[b])} tokens, more than its "
                         f"max_len {spec.max_len}")
    B, T = ids.shape
    pos = torch.arange(T).expand(B, T)
    chunk = torch.where(attn, pos, torch.full_like(pos, -1))
    n = attn.sum(1)
    C = max(int(n.max()), 1)
    valid = torch.arange(C)[None, :] < n[:, None]
    return TeacherView(name, ids.clone(), attn.clone(), loss.clone(), chunk.clone(), chunk.clone(),
                       valid, valid.clone(), identity=True, coverage_s=1.0, coverage_t=1.0)


def rollouts_from_segments(tok, prompts, segments, *, max_prompt_len: int = 1024,
                           add_bos: bool | None = None, finished: bool = True) -> Rollouts:
    """Rollouts from multi-turn data: per sample a list of ``(text, is_llm)`` response segments.

    Each segment is tokenized by the student on its own (as an agent loop appends the tool's
    output after the model's tokens), as a continuation: a SentencePiece student's dummy-prefix
    space is not added, so the response's bytes are the segments' texts; LLM segments get mask 1, tool/environment segments 0. With
    ``finished`` the student's end-of-turn token closes the response as an LLM token. Behaviour
    log-probs are 0 (unknown): use these rollouts for scoring and the distillation losses, not for
    importance-sampling corrections.
    """
    prompts = tuple(prompts)
    if len(segments) != len(prompts):
        raise ValueError(f"{len(segments)} segment lists for {len(prompts)} prompts")
    pre = encode_prompts(tok, prompts, max_prompt_len, add_bos=add_bos)
    resp, masks = [], []
    for b, segs in enumerate(segments):
        ids, mask = [], []
        for text, is_llm in segs:
            seg_ids = encode_continuation(tok, text, literal=False)[0]
            ids.append(seg_ids)
            mask.append(np.full(seg_ids.size, bool(is_llm)))
        if finished:
            end = end_of_turn_id(tok) if is_chat(prompts[b]) else tok.eos_id
            ids.append(np.array([end], dtype=np.int64))
            mask.append(np.ones(1, dtype=bool))
        resp.append(np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64))
        masks.append(np.concatenate(mask) if mask else np.zeros(0, dtype=bool))

    pad = padding_id(tok)
    p_ids, p_len = _right_pad(pre, pad)
    r_ids, r_len = _right_pad(resp, pad)
    m = torch.zeros(r_ids.shape, dtype=torch.bool)
    for b, mk in enumerate(masks):
        m[b, :mk.size] = torch.from_numpy(mk)
    return Rollouts(prompts, p_ids, p_len, r_ids, r_len, m, torch.zeros(r_ids.shape),
                    1.0, 1.0, tuple("stop" if finished else "length" for _ in prompts))
