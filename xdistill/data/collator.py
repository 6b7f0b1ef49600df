"""CrossTokenizerCollator: packed windows -> a typed DistillBatch with one TeacherView per teacher.

Legend: B windows, Ts/Tt student/teacher tokens, C chunks, N aligned segment rows, I chunk items.

Runs inside DataLoader workers (it is picklable: plain attributes, tokenizers and numpy arrays).

Special-token policy (the same for every tokenizer): no tokenizer adds special tokens on its own
(``add_special_tokens=False`` everywhere). The collator places them explicitly:

* document separators: after each document, the student's EOS and each teacher's own EOS; a pair of
  separators forms a 1:1 chunk (valid, exact: both are EOS with no bytes);
* BOS: per window, when ``add_bos`` is set for the student (:class:`PackedDataset`) or a teacher
  (:class:`TeacherTokenization`; unset: the model's own default), never a second one before a text that
  starts with it (a chat template that writes it). A BOS on both sides is a 1:1 chunk; a BOS on
  one side only is unaligned;
* chat data: the special tokens that each tokenizer's own chat template writes (role markers,
  end-of-turn) are tokenized from the rendered text; the aligner aligns or drops them by role.

Alignment is done per segment (a piece of one document): the student's ids for the segment come
from the packer, the teacher tokenizes the same bytes (chat: its own rendering of the same span of
the conversation, mapped through the message contents), and ``align_batch`` aligns all segments of
the batch in one call with the SentencePiece phantom bytes of both sides, per token (the dummy
prefix, also the one after each special token in the text). Chunk ids
are then renumbered per window in token order (BOS chunk, segment chunks, EOS chunk, ...).

Truncation: a teacher with ``max_len`` keeps the longest prefix of the window that fits and ends at
a byte offset that is a token boundary on *both* sides; student tokens past it are unaligned for
that teacher (the student row is never cut per teacher).

Teachers whose tokenizer fingerprint, BOS/EOS ids and BOS setting equal the student's (and, for
chat data, whose chat template does: a base and an instruct checkpoint share ``tokenizer.json``
but not their templates) get the identity view: the student's ids, chunk ``i`` = token ``i``, all chunks exact, no aligner call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from xdistill.align import align_batch
from xdistill.data.batch import BatchStats, DistillBatch, TeacherView
from xdistill.data.chat import map_offset, render_chat, renders_alike, token_loss_mask
from xdistill.data.packing import DEFAULT_LOSS_ROLES, Segment, Window
from xdistill.tokenization.bos import resolve_add_bos
from xdistill.tokenization.tokenizer import padding_id


@dataclass(frozen=True)
class TeacherTokenization:
    """One teacher's tokenization as the collator and the rollout scorer see it (name, tokenizer,
    row limit, BOS); its loss settings are :class:`xdistill.losses.TeacherSpec`."""

    # teacher name (its key in the config); names the TeacherView
    name: str
    # the teacher's tokenizer (xdistill.tokenization.Tokenizer)
    tokenizer: Any
    # maximum teacher tokens per row (None: no limit)
    max_len: int | None = None
    # prepend the teacher's BOS token to every row (None: the teacher model's default)
    add_bos: bool | None = None


@dataclass
class _Row:
    """Layout of one aligned segment row (filled while building the teacher rows)."""

    b: int
    s_pos: int
    t_pos: int
    s_ids_T: np.ndarray
    t_ids_T: np.ndarray
    # phantom bytes per token (SentencePiece dummy-prefix spaces, also after in-text special
    # tokens), int64 [s_ids_T.size] / [t_ids_T.size]
    s_phantom_T: np.ndarray
    t_phantom_T: np.ndarray


def resolve_teacher_bos(teachers) -> tuple:
    """``teachers`` with every ``add_bos=None`` set to its model's default."""
    return tuple(t if t.add_bos is not None else
                 replace(t, add_bos=resolve_add_bos(None, t.tokenizer, f"teacher {t.name!r} add_bos"))
                 for t in teachers)


def _starts_with(encs, token_id) -> bool:
    """Whether the first encoding starts with ``token_id`` (a template that wrote the BOS)."""
    return bool(encs) and len(encs[0].ids) > 0 and int(encs[0].ids[0]) == int(token_id)


def _round_up(n: int, multiple: int) -> int:
    return max(1, -(-n // multiple) * multiple)


class CrossTokenizerCollator:
    """Turns a list of :class:`Window` into a :class:`DistillBatch` (see the module docstring).

    Args:
        student: the student tokenizer.
        teachers: one :class:`TeacherTokenization` per teacher, in config order.
        chunks, method: passed to ``xdistill.align.align_batch``.
        loss_roles, end_of_turn: chat loss policy for teacher tokenizations (the student's comes
            from the packer, which must use the same policy).
        specials_as_text: text documents' special-token strings are text for the teachers (the
            packer must use the same setting; ``data.specials_as_text``).
        pad_to_multiple_of: round the padded lengths up (e.g. 8 on GPUs).
    """

    def __init__(self, student, teachers=(), *, chunks: str = "minimal", method: str = "auto",
                 loss_roles=DEFAULT_LOSS_ROLES, end_of_turn: bool = True,
                 specials_as_text: bool = True, pad_to_multiple_of: int = 1):
        self.student, self.teachers = student, resolve_teacher_bos(teachers)
        names = [t.name for t in self.teachers]
        if len(set(names)) != len(names):
            raise ValueError(f"teacher names must be unique, got {names}")
        self.chunks, self.method = chunks, method
        self.loss_roles, self.end_of_turn = frozenset(loss_roles), end_of_turn
        self.specials_as_text = bool(specials_as_text)
        self.pad_to_multiple_of = int(pad_to_multiple_of)

    # ------------------------------------------------------------------ student
    def _student_rows(self, windows: list[Window]):
        """Student ids/loss per window and the row position of each segment's first token."""
        tok = self.student
        rows, losses, phantoms, seg_pos = [], [], [], []
        for w in windows:
            parts, loss, ph, pos, p = [], [], [], [], 0
            if w.bos:
                parts.append(np.array([tok.bos_id], dtype=np.int64))
                loss.append(np.zeros(1, dtype=bool))
                ph.append(np.zeros(1, dtype=np.int64))
                p = 1
            for seg in w.segments:
                pos.append(p)
                parts += [seg.ids_T, np.array([tok.eos_id] * int(seg.eos), dtype=np.int64)]
                loss += [seg.loss_T, np.full(int(seg.eos), seg.chat is None)]
                ph += [seg.phantom_T, np.zeros(int(seg.eos), dtype=np.int64)]
                p += seg.n_tokens
            rows.append(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64))
            losses.append(np.concatenate(loss) if loss else np.zeros(0, dtype=bool))
            phantoms.append(np.concatenate(ph) if ph else np.zeros(0, dtype=np.int64))
            seg_pos.append(pos)
        return rows, losses, phantoms, seg_pos

    def _same_rendering(self, spec: TeacherTokenization, windows) -> bool:
        """The teacher would write exactly the student's ids (the identity view applies): the
        same vocabulary and BOS/EOS, and for chat the same template (a base and an instruct
        checkpoint share ``tokenizer.json`` but not their templates)."""
        has_chat = any(seg.chat is not None for w in windows for seg in w.segments)
        return (spec.add_bos == any(w.bos for w in windows)
                and renders_alike(spec.tokenizer, self.student, has_chat))

    def __call__(self, windows) -> DistillBatch:
        t0 = time.perf_counter()
        windows = list(windows)
        rows, losses, phantoms, seg_pos = self._student_rows(windows)
        ids_BTs, attn_BTs = self._pad(rows, padding_id(self.student))
        loss_BTs = np.zeros_like(attn_BTs)
        phantom_BTs = np.zeros(ids_BTs.shape, dtype=np.int64)
        for b, (loss, ph) in enumerate(zip(losses, phantoms)):
            loss_BTs[b, :loss.size] = loss
            phantom_BTs[b, :ph.size] = ph
        views = []
        for spec in self.teachers:
            if self._same_rendering(spec, windows):
                views.append(self._identity_view(spec, ids_BTs, attn_BTs, loss_BTs))
            else:
                views.append(self._teacher_view(spec, windows, seg_pos, ids_BTs.shape, attn_BTs))
        labels_BTs = np.where(loss_BTs & attn_BTs, ids_BTs, -100)
        stats = BatchStats(student_tokens=int(attn_BTs.sum()), loss_tokens=int((loss_BTs & attn_BTs).sum()),
                           collate_seconds=time.perf_counter() - t0,
                           unaligned_fraction={v.name: 1.0 - v.coverage_s for v in views})
        return DistillBatch(torch.from_numpy(ids_BTs), torch.from_numpy(attn_BTs),
                            torch.from_numpy(labels_BTs), torch.from_numpy(loss_BTs & attn_BTs),
                            tuple(views), stats, torch.from_numpy(phantom_BTs))

    def _pad(self, rows, pad_id: int, length: int | None = None):
        T = _round_up(max((r.size for r in rows), default=1), self.pad_to_multiple_of)
        T = length if length is not None else T
        ids = np.full((len(rows), T), pad_id, dtype=np.int64)
        attn = np.zeros((len(rows), T), dtype=bool)
        for b, r in enumerate(rows):
            ids[b, :r.size] = r
            attn[b, :r.size] = True
        return ids, attn

    # ------------------------------------------------------------------ identity
    def _identity_view(self, spec: TeacherTokenization, ids_BTs, attn_BTs, loss_BTs) -> TeacherView:
        T = ids_BTs.shape[1] if spec.max_len is None else min(ids_BTs.shape[1], spec.max_len)
        t_attn = attn_BTs[:, :T]
        pos_BT = np.broadcast_to(np.arange(T), t_attn.shape)
        t_chunk = np.where(t_attn, pos_BT, -1).astype(np.int64)
        s_chunk = np.full(ids_BTs.shape, -1, dtype=np.int64)
        s_chunk[:, :T] = t_chunk
        n_chunks = t_attn.sum(1)
        C = max(int(n_chunks.max(initial=0)), 1)
        valid = np.arange(C)[None, :] < n_chunks[:, None]
        cov_s = float((s_chunk >= 0).sum() / max(attn_BTs.sum(), 1))
        return TeacherView(spec.name, torch.from_numpy(ids_BTs[:, :T].copy()), torch.from_numpy(t_attn.copy()),
                           torch.from_numpy((loss_BTs[:, :T] & t_attn).copy()), torch.from_numpy(s_chunk),
                           torch.from_numpy(t_chunk), torch.from_numpy(valid), torch.from_numpy(valid.copy()),
                           identity=True, coverage_s=cov_s, coverage_t=1.0)

    # ------------------------------------------------------------------ teachers
    def _teacher_pieces(self, spec: TeacherTokenization, windows):
        """Per window, per segment: (teacher text, teacher loss spans or None, chat mapping)."""
        tok, renders, out = spec.tokenizer, {}, []
        for w in windows:
            per = []
            for seg in w.segments:
                if seg.chat is None:
                    per.append((seg.text, None, None))
                    continue
                if seg.doc not in renders:
                    renders[seg.doc] = render_chat(tok, seg.chat.conversation)
                r = renders[seg.doc]
                to_teacher = (seg.chat.spans_M2, r.spans_M2, seg.chat.n_bytes, r.n_bytes,
                              seg.chat.core_M2, r.core_M2)
                a, e = map_offset(seg.byte_start, *to_teacher), map_offset(seg.byte_end, *to_teacher)
                text = r.text.encode("utf-8")[a:e].decode("utf-8", errors="replace")
                # spans reaching into the segment, and one ending exactly at its start (its
                # end-of-turn token opens the segment: the student's whole-document mask gives it
                # loss, so the teacher's gets it too)
                raw = r.loss_spans(self.loss_roles)
                raw = raw[(raw[:, 1] >= a) & (raw[:, 0] < e)]
                per.append((text, np.clip(raw, a, e) - a, (a, e, r)))
            out.append(per)
        return out

    def _encode_pieces(self, tok, flat: list) -> list:
        """The teacher's encodings of ``(text, spans, chat)`` pieces, in order: chat renderings
        with their template's special tokens, text documents as ``specials_as_text`` says."""
        plain = [i for i, p in enumerate(flat) if p[2] is None] if self.specials_as_text else []
        out: list = [None] * len(flat)
        groups = ((plain, True), (sorted(set(range(len(flat))) - set(plain)), False))
        for idx, as_text in groups:
            if idx:
                encs = tok.encode_batch([flat[i][0] for i in idx], add_special_tokens=False,
                                        specials_as_text=as_text)
                for i, enc in zip(idx, encs):
                    out[i] = enc
        return out

    @staticmethod
    def _common_cut(seg: Segment, enc, m: int, chat) -> tuple[int, int]:
        """(teacher tokens, student tokens) up to the last byte boundary shared by both sides
        among the first ``m`` teacher tokens."""
        t_starts, t_ends = np.asarray(enc.starts), np.asarray(enc.ends)
        seg_len = seg.byte_end - seg.byte_start
        for k in range(m, 0, -1):
            if k < t_starts.size and t_starts[k] < t_ends[k - 1]:
                continue  # inside a character split over tokens
            t_cut = int(t_starts[k]) if k < t_starts.size else None
            if chat is None:
                s_cut = seg_len if t_cut is None else t_cut
            else:
                a, e, r = chat
                t_abs = a + t_cut if t_cut is not None else e
                s_cut = map_offset(t_abs, r.spans_M2, seg.chat.spans_M2, r.n_bytes,
                                   seg.chat.n_bytes, r.core_M2, seg.chat.core_M2) - seg.byte_start
            if s_cut >= seg_len:
                return k, int(seg.ids_T.size)
            i = int(np.searchsorted(seg.starts_T, s_cut))
            if i < seg.starts_T.size and seg.starts_T[i] == s_cut and (i == 0 or seg.ends_T[i - 1] <= s_cut):
                return k, i
        return 0, 0

    def _teacher_rows(self, spec: TeacherTokenization, windows, seg_pos):
        """Teacher ids/loss per window, aligned segment rows and chunk items in token order."""
        tok = spec.tokenizer
        pieces = self._teacher_pieces(spec, windows)
        encs = iter(self._encode_pieces(tok, [p for per in pieces for p in per]))
        t_rows, t_losses, rows, items = [], [], [], []  # items: (b, kind, s_pos|row, t_pos)
        max_len = spec.max_len if spec.max_len is not None else 1 << 62
        t_eos = tok.eos_id
        for b, (w, per) in enumerate(zip(windows, pieces)):
            encs_b = [next(encs) for _ in per]
            parts, loss, t_p, used = [], [], 0, 0
            budget0 = max_len     # a BOS the template already wrote costs no extra token
            if spec.add_bos and not _starts_with(encs_b, tok.bos_id):
                budget0 -= 1
                parts.append(np.array([tok.bos_id], dtype=np.int64))
                loss.append(np.zeros(1, dtype=bool))
                t_p = 1
                if w.bos:
                    items.append((b, "role", 0, 0))
            for j, (seg, (text, spans, chat), enc) in enumerate(zip(w.segments, per, encs_b)):
                t_ids = np.asarray(enc.ids, dtype=np.int64)
                t_loss = (np.ones(t_ids.size, dtype=bool) if spans is None else
                          token_loss_mask(t_ids, np.asarray(enc.starts), np.asarray(enc.ends),
                                          tok.table.roles_V, spans, self.end_of_turn,
                                          blank_V=tok.table.blank_V))
                s_ids, n_eos = seg.ids_T, int(seg.eos and t_eos is not None)
                stop = t_ids.size + n_eos > budget0 - used
                if stop:
                    k_t, k_s = self._common_cut(seg, enc, min(t_ids.size, budget0 - used), chat)
                    t_ids, t_loss, s_ids, n_eos = t_ids[:k_t], t_loss[:k_t], s_ids[:k_s], 0
                if s_ids.size and t_ids.size:
                    items.append((b, "row", len(rows), 0))
                    rows.append(_Row(b, seg_pos[b][j], t_p, s_ids, t_ids,
                                     seg.phantom_T[:s_ids.size], enc.phantom_bytes_T()[:t_ids.size]))
                parts.append(t_ids)
                loss.append(t_loss)
                t_p, used = t_p + t_ids.size, used + t_ids.size
                if n_eos:
                    items.append((b, "role", seg_pos[b][j] + seg.ids_T.size, t_p))
                    parts.append(np.array([t_eos], dtype=np.int64))
                    loss.append(np.full(1, seg.chat is None))
                    t_p, used = t_p + 1, used + 1
                if stop:
                    break
            t_rows.append(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64))
            t_losses.append(np.concatenate(loss) if loss else np.zeros(0, dtype=bool))
        return t_rows, t_losses, rows, items

    def _align(self, spec: TeacherTokenization, rows: list[_Row]):
        N = len(rows)
        s_len = np.array([r.s_ids_T.size for r in rows], dtype=np.int64)
        t_len = np.array([r.t_ids_T.size for r in rows], dtype=np.int64)
        s_ids = np.zeros((N, int(s_len.max())), dtype=np.int64)
        t_ids = np.zeros((N, int(t_len.max())), dtype=np.int64)
        s_ph, t_ph = np.zeros_like(s_ids), np.zeros_like(t_ids)
        for n, r in enumerate(rows):
            s_ids[n, :r.s_ids_T.size] = r.s_ids_T
            t_ids[n, :r.t_ids_T.size] = r.t_ids_T
            s_ph[n, :r.s_ids_T.size] = r.s_phantom_T
            t_ph[n, :r.t_ids_T.size] = r.t_phantom_T
        return align_batch(s_ids, s_len, t_ids, t_len, self.student.table, spec.tokenizer.table,
                           s_phantom_BTs=s_ph, t_phantom_BTt=t_ph, chunks=self.chunks, method=self.method), s_len, t_len

    def _teacher_view(self, spec: TeacherTokenization, windows, seg_pos, shape_BTs, attn_BTs) -> TeacherView:
        B, Ts = shape_BTs
        t_rows, t_losses, rows, items = self._teacher_rows(spec, windows, seg_pos)
        ids_BTt, attn_BTt = self._pad(t_rows, padding_id(spec.tokenizer))
        loss_BTt = np.zeros_like(attn_BTt)
        for b, loss in enumerate(t_losses):
            loss_BTt[b, :loss.size] = loss
        s_chunk = np.full((B, Ts), -1, dtype=np.int64)
        t_chunk = np.full(ids_BTt.shape, -1, dtype=np.int64)
        res = self._align(spec, rows) if rows else None
        # chunk offsets: items in token order per window; a row item holds n_chunks chunks
        count_I = np.array([1 if kind == "role" else int(res[0].n_chunks_B[ref])
                            for _, kind, ref, _ in items], dtype=np.int64)
        b_I = np.array([it[0] for it in items], dtype=np.int64)
        ends_I = np.cumsum(count_I)
        first_I = np.searchsorted(b_I, b_I, side="left")
        off_I = ends_I - count_I - (ends_I[first_I] - count_I[first_I]) if items else ends_I
        n_chunks_B = np.bincount(b_I, weights=count_I, minlength=B).astype(np.int64)
        C = max(int(n_chunks_B.max(initial=0)), 1)
        exact_BC = np.zeros((B, C), dtype=bool)
        row_off = np.zeros(len(rows), dtype=np.int64)
        for (b, kind, ref, t_pos), off in zip(items, off_I):
            if kind == "role":
                s_chunk[b, ref], t_chunk[b, t_pos], exact_BC[b, off] = off, off, True
            else:
                row_off[ref] = off
        if rows:
            self._scatter_rows(rows, res, row_off, s_chunk, t_chunk, exact_BC)
        valid_BC = np.arange(C)[None, :] < n_chunks_B[:, None]
        cov_s = float((s_chunk >= 0).sum() / max(attn_BTs.sum(), 1))
        cov_t = float((t_chunk >= 0).sum() / max(attn_BTt.sum(), 1))
        return TeacherView(spec.name, torch.from_numpy(ids_BTt), torch.from_numpy(attn_BTt),
                           torch.from_numpy(loss_BTt & attn_BTt), torch.from_numpy(s_chunk),
                           torch.from_numpy(t_chunk), torch.from_numpy(valid_BC),
                           torch.from_numpy(exact_BC & valid_BC), identity=False,
                           coverage_s=cov_s, coverage_t=cov_t)

    @staticmethod
    def _scatter_rows(rows, aligned, row_off, s_chunk, t_chunk, exact_BC) -> None:
        """Write the per-segment alignment into the window arrays (vectorised over tokens)."""
        res, s_len, t_len = aligned
        b_N = np.array([r.b for r in rows], dtype=np.int64)
        for side, pos_N, lens, out in (("s", [r.s_pos for r in rows], s_len, s_chunk),
                                       ("t", [r.t_pos for r in rows], t_len, t_chunk)):
            chunk_NT = np.asarray(getattr(res, f"{side}_chunk_BT{side}"))
            n_idx, i_idx = np.nonzero(np.arange(chunk_NT.shape[1])[None, :] < lens[:, None])
            src = chunk_NT[n_idx, i_idx].astype(np.int64)
            out[b_N[n_idx], np.asarray(pos_N)[n_idx] + i_idx] = np.where(src >= 0, src + row_off[n_idx], -1)
        n_chunks = np.asarray(res.n_chunks_B, dtype=np.int64)
        exact_NC = np.asarray(res.chunk_exact_BC, dtype=bool)
        n_idx, c_idx = np.nonzero(np.arange(exact_NC.shape[1])[None, :] < n_chunks[:, None])
        exact_BC[b_N[n_idx], row_off[n_idx] + c_idx] = exact_NC[n_idx, c_idx]
