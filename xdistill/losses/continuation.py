"""Continuation KL: P-KL's chunk-start comparison carried on inside a chunk's first student token.

Legend: B batch, Ts/Tt student/teacher tokens, Vs/Vt vocabularies, C chunks, L most teacher
pieces of one student token, N loss chunks, R continuation rows (one per chunk and depth),
M group members over all rows, S class slots over all rows, K classes of all trie nodes.

**Why.** P-KL (:mod:`xdistill.losses.cross`) compares next-token distributions at chunk starts
only. A student token whose bytes the teacher spells in ``m >= 2`` pieces (a whole-number student
token ``85`` is the digit teacher's ``8``, ``5``; a long word is several sub-words) is compared
through its first piece alone, so everything the teacher knows about the pieces after the first
is lost: on numbers, P-KL transfers the leading digit and nothing about the others.

**What.** Each student token ``s`` has its teacher pieces ``pi(s)`` (the teacher's tokenization of
its bytes, :func:`xdistill.projection.methods.retokenize`). The student's chunk-start
distribution ``p`` over Vs is thereby a distribution over piece sequences (a trie), and its
conditionals along the observed teacher path are comparable with the teacher's next-token
distributions *inside* the chunk, which condition on the same text. For a loss chunk whose first
student token ``s*`` has pieces ``u_0..u_{m-1}`` and whose teacher tokens begin with exactly those
pieces, for every depth ``j = 1..m-1`` (teacher output row ``c + j - 1``, after ``u_<j``)::

    G_j      = {s : pi(s)[:j] == u_<j}          student tokens starting with the same j pieces
    class(s) = pi(s)[j], or END if pi(s) has exactly j pieces (the student token stops there)
    P_j(k)   = sum_{s in G_j, class(s)=k} p(s) / sum_{s in G_j} p(s)      (student, tau)
    Q_j(t)   = q_j(t) for every class token t;  Q_j(END) = 1 - sum_t Q_j(t)   (teacher, tau_t)
    loss    += tau^2 * KL(Q_j || P_j)

``Q_j(END)`` is the teacher's mass on continuations no student token of the group spells next,
i.e. where the student's token would end. When no student token ends at the node (END has no
members) the END slot is dropped and ``Q_j`` renormalised over the classes. This is token-level
forward KL along the observed path, exactly what a same-tokenizer KD loss does at every position,
read through the trie: with P-KL's depth-0 term (a first-piece projection) it is the chain rule of
the KL between the two trie distributions, teacher-forced along the data. Chunks whose teacher
tokens are not ``pi(s*)`` (the teacher split the bytes differently in context) get no
continuation term. Normalised per loss chunk like P-KL (pass the same ``num_valid``), so
``pkl + continuation`` is a sum over chunks. Only the student side carries gradients.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, fields

import torch

from xdistill.losses.chunks import ChunkAlignment, chunk_bounds, loss_chunks, resolve_count
from xdistill.losses.engine import DEFAULT_CHUNK_SIZE

END = -1


@dataclass(frozen=True)
class ContinuationTrie:
    """The student tokens' teacher pieces as a trie (build with :meth:`from_pieces`)."""

    # teacher pieces of each student token, int64 [Vs, L] (-1 padding)
    pieces_VsL: torch.Tensor
    # number of pieces of each student token, int64 [Vs] (0 = no bytes / unmapped)
    n_pieces_Vs: torch.Tensor
    # trie node queried at depth j for student token s (prefix pi(s)[:j]), int64 [Vs, L] (-1: none)
    node_VsL: torch.Tensor
    # node n's members are member_s[node_ptr[n]:node_ptr[n+1]], int64 [nodes + 1]
    node_ptr: torch.Tensor
    # member student ids and their slot in the node (0 = END, k >= 1 = class k - 1), int64 [M]
    member_s: torch.Tensor
    member_slot: torch.Tensor
    # node n's classes are class_t[class_ptr[n]:class_ptr[n+1]] (teacher ids), int64
    class_ptr: torch.Tensor
    class_t: torch.Tensor
    # whether some student token ends at the node (its END slot has members), bool [nodes]
    has_end: torch.Tensor
    # teacher vocabulary the piece ids index into
    teacher_vocab: int

    @classmethod
    def from_pieces(cls, pieces: list, teacher_vocab: int) -> "ContinuationTrie":
        """From ``pieces[s]`` = the teacher ids of student token ``s`` (empty = unmapped)."""
        Vs, L = len(pieces), max((len(p) for p in pieces), default=0)
        pieces_VsL = torch.full((Vs, max(L, 1)), -1, dtype=torch.long)
        members: dict[tuple, list] = defaultdict(list)
        for s, p in enumerate(pieces):
            p = [int(t) for t in p]
            if any(t < 0 or t >= teacher_vocab for t in p):
                raise ValueError(f"student token {s}: teacher piece ids {p} outside [0, "
                                 f"{teacher_vocab})")
            pieces_VsL[s, :len(p)] = torch.tensor(p, dtype=torch.long)
            for j in range(1, len(p) + 1):
                members[tuple(p[:j])].append((s, p[j] if j < len(p) else END))
        keys = [k for k, ms in members.items() if any(c != END for _, c in ms)]
        index = {k: n for n, k in enumerate(keys)}
        node_VsL = torch.full_like(pieces_VsL, -1)
        for s, p in enumerate(pieces):
            for j in range(1, len(p)):
                node_VsL[s, j] = index[tuple(int(t) for t in p[:j])]
        return cls._flatten(pieces_VsL, node_VsL, [members[k] for k in keys], teacher_vocab)

    @classmethod
    def _flatten(cls, pieces_VsL, node_VsL, node_members: list, teacher_vocab: int):
        node_ptr, member_s, member_slot, class_ptr, class_t, has_end = [0], [], [], [0], [], []
        for ms in node_members:
            classes = sorted({c for _, c in ms if c != END})
            slot = {c: k + 1 for k, c in enumerate(classes)}
            member_s += [s for s, _ in ms]
            member_slot += [0 if c == END else slot[c] for _, c in ms]
            class_t += classes
            node_ptr.append(len(member_s))
            class_ptr.append(len(class_t))
            has_end.append(any(c == END for _, c in ms))
        long = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
        return cls(pieces_VsL, (pieces_VsL >= 0).sum(1), node_VsL, long(node_ptr), long(member_s),
                   long(member_slot), long(class_ptr), long(class_t),
                   torch.tensor(has_end, dtype=torch.bool), int(teacher_vocab))

    @property
    def student_vocab(self) -> int:
        return int(self.pieces_VsL.shape[0])

    def to(self, device) -> "ContinuationTrie":
        """This trie on ``device`` (itself when already there; the moved copy is cached)."""
        device = torch.device(device)
        if self.pieces_VsL.device == device:
            return self
        cache = self.__dict__.setdefault("_moved", {})
        if str(device) not in cache:
            moved = {f.name: getattr(self, f.name) for f in fields(self)}
            cache[str(device)] = ContinuationTrie(**{k: v.to(device) if torch.is_tensor(v) else v
                                                     for k, v in moved.items()})
        return cache[str(device)]


def continuation_rows(align: ChunkAlignment, trie: ContinuationTrie, student_ids_BTs,
                      teacher_ids_BTt, s_loss_mask_BTs=None, t_loss_mask_BTt=None):
    """``(b_R, student row_R, teacher row_R, node_R, n_chunks)``: one row per depth of every loss
    chunk whose teacher tokens begin with its first student token's pieces (module doc);
    ``n_chunks`` is the local count of loss chunks (P-KL's normaliser)."""
    C = align.num_chunks
    b_N, c_N = torch.nonzero(loss_chunks(align, s_loss_mask_BTs, t_loss_mask_BTt), as_tuple=True)
    s_start, _ = chunk_bounds(align.s_chunk_BTs, C)
    t_start, t_end = chunk_bounds(align.t_chunk_BTt, C)
    a_N, tc_N, td_N = s_start[b_N, c_N], t_start[b_N, c_N], t_end[b_N, c_N]
    s_star_N = student_ids_BTs[b_N, a_N].long()
    if b_N.numel() and int(s_star_N.max()) >= trie.student_vocab:
        raise ValueError(f"student token {int(s_star_N.max())} is outside the continuation "
                         f"trie's vocabulary ({trie.student_vocab} tokens)")
    m_N = trie.n_pieces_Vs[s_star_N]
    L, Tt = trie.pieces_VsL.shape[1], teacher_ids_BTt.shape[1]
    j_L = torch.arange(L, device=m_N.device)
    pos_NL = (tc_N[:, None] + j_L).clamp(max=Tt - 1)
    seen_NL = teacher_ids_BTt[b_N[:, None], pos_NL].long()
    same_NL = (seen_NL == trie.pieces_VsL[s_star_N]) | (j_L >= m_N[:, None])
    ok_N = same_NL.all(1) & (m_N >= 2) & (tc_N + m_N <= td_N)
    want_NL = ok_N[:, None] & (j_L >= 1) & (j_L < m_N[:, None])
    n_R, j_R = torch.nonzero(want_NL, as_tuple=True)
    return (b_N[n_R], a_N[n_R] - 1, tc_N[n_R] + j_R - 1, trie.node_VsL[s_star_N[n_R], j_R],
            int(b_N.numel()))


def _segment_logsumexp(x_M: torch.Tensor, seg_M: torch.Tensor, S: int) -> torch.Tensor:
    """``log sum exp`` of ``x`` per segment id, [S] (empty segments: log of the smallest float)."""
    top = torch.full((S,), float("-inf"), dtype=x_M.dtype, device=x_M.device)
    top = top.scatter_reduce(0, seg_M, x_M.detach(), "amax")
    shift = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    tot = torch.zeros(S, dtype=x_M.dtype, device=x_M.device).index_add(0, seg_M,
                                                                      torch.exp(x_M - shift[seg_M]))
    # a non-empty segment has tot >= 1; empty ones get a finite floor (masked by the caller)
    return shift + torch.log(tot.clamp_min(torch.finfo(tot.dtype).tiny))


def _ranges(ptr: torch.Tensor, node_R: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row of each entry, flat index into the CSR arrays) of nodes ``node_R``, each [M]."""
    lo_R, n_R = ptr[node_R], ptr[node_R + 1] - ptr[node_R]
    row_M = torch.repeat_interleave(torch.arange(node_R.numel(), device=ptr.device), n_R)
    first_M = torch.repeat_interleave(torch.cumsum(n_R, 0) - n_R, n_R)
    return row_M, lo_R[row_M] + torch.arange(row_M.numel(), device=ptr.device) - first_M


def _teacher_slots(z_t_nVt, trie, node_n, tau_t):
    """Teacher log Q per slot: (slot offsets [n], logQ [S], valid [S], row of each slot [S])."""
    with torch.no_grad():
        lse_n = torch.logsumexp(z_t_nVt / tau_t, -1)
        row_K, k_K = _ranges(trie.class_ptr, node_n)
        lq_K = z_t_nVt[row_K, trie.class_t[k_K]] / tau_t - lse_n[row_K]
        n_cls = trie.class_ptr[node_n + 1] - trie.class_ptr[node_n]
        off_n = torch.cumsum(n_cls + 1, 0) - (n_cls + 1)
        S = int((n_cls + 1).sum())
        cls_mass_n = torch.zeros_like(lse_n).index_add(0, row_K, lq_K.exp())
        end_n = (1 - cls_mass_n).clamp(min=0)
        has_end = trie.has_end[node_n]
        # no END members: Q renormalised over the classes, in log space (their summed mass
        # can underflow in float32 although each class's log Q is finite)
        norm_n = torch.where(has_end, torch.zeros_like(lse_n),
                             -_segment_logsumexp(lq_K, row_K, lse_n.numel()))
        logq_S = torch.full((S,), float("-inf"), dtype=lse_n.dtype, device=lse_n.device)
        logq_S[off_n] = torch.where(has_end, torch.log(end_n), logq_S[off_n])
        slot_K = off_n[row_K] + 1 + (k_K - trie.class_ptr[node_n][row_K])
        logq_S[slot_K] = lq_K + norm_n[row_K]
        valid_S = torch.ones(S, dtype=torch.bool, device=lse_n.device)
        valid_S[off_n] = has_end
        row_S = torch.repeat_interleave(torch.arange(node_n.numel(), device=node_n.device),
                                        n_cls + 1)
    return off_n, logq_S, valid_S, row_S


def _block_kl(student_logits_BTsVs, teacher_logits_BTtVt, trie, b_n, s_n, t_n, node_n, tau,
              tau_t, dt):
    """Sum over rows of ``KL(Q_j || P_j)`` for one block of continuation rows."""
    z_t_nVt = teacher_logits_BTtVt[b_n, t_n].to(dt)
    off_n, logq_S, valid_S, row_S = _teacher_slots(z_t_nVt, trie, node_n, tau_t)
    row_M, idx_M = _ranges(trie.node_ptr, node_n)
    x_M = student_logits_BTsVs[b_n[row_M], s_n[row_M], trie.member_s[idx_M]].to(dt) / tau
    lse_S = _segment_logsumexp(x_M, off_n[row_M] + trie.member_slot[idx_M], logq_S.numel())
    lse_n = _segment_logsumexp(x_M, row_M, node_n.numel())
    logp_S = lse_S - lse_n[row_S]
    keep_S = valid_S & torch.isfinite(logq_S)
    safe_q = torch.where(keep_S, logq_S, torch.zeros_like(logq_S))
    return torch.where(keep_S, safe_q.exp() * (safe_q - logp_S), torch.zeros_like(logp_S)).sum()


def continuation_kl(student_logits_BTsVs, teacher_logits_BTtVt, align: ChunkAlignment,
                    trie: ContinuationTrie, student_ids_BTs, teacher_ids_BTt, *,
                    s_loss_mask_BTs=None, t_loss_mask_BTt=None, temperature=1.0,
                    teacher_temperature=None, num_valid=None, chunk_size=DEFAULT_CHUNK_SIZE):
    """``tau^2 / count * sum over continuation rows of KL(Q_j || P_j)`` (module doc).

    ``student_ids_BTs`` / ``teacher_ids_BTt``: the token ids the logits were computed on;
    ``trie`` from :meth:`ContinuationTrie.from_pieces` for this tokenizer pair (moved to the
    logits' device by the caller). ``count`` is ``num_valid`` or the local number of loss chunks.
    """
    tau = float(temperature)
    tau_t = tau if teacher_temperature is None else float(teacher_temperature)
    Vs, Vt = student_logits_BTsVs.shape[-1], teacher_logits_BTtVt.shape[-1]
    if trie.student_vocab > Vs or trie.teacher_vocab > Vt:
        raise ValueError(f"continuation trie for vocabularies ({trie.student_vocab}, "
                         f"{trie.teacher_vocab}) does not fit logits ({Vs}, {Vt})")
    b_R, s_R, t_R, node_R, n_chunks = continuation_rows(
        align, trie, student_ids_BTs, teacher_ids_BTt, s_loss_mask_BTs, t_loss_mask_BTt)
    dt = torch.float64 if student_logits_BTsVs.dtype == torch.float64 else torch.float32
    total = student_logits_BTsVs.new_zeros((), dtype=dt)
    step = max(1, b_R.numel() if chunk_size is None else int(chunk_size))  # None: one block
    for lo in range(0, b_R.numel(), step):
        sl = slice(lo, lo + step)
        total = total + _block_kl(student_logits_BTsVs, teacher_logits_BTtVt, trie, b_R[sl],
                                  s_R[sl], t_R[sl], node_R[sl], tau, tau_t, dt)
    return total * tau ** 2 / resolve_count(num_valid, n_chunks)
