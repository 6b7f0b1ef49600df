"""Continuation KL against a from-the-definition float64 reference, gradients, invariances."""

from __future__ import annotations

import math

import pytest
import torch

from xdistill.losses.chunks import ChunkAlignment
from xdistill.losses.cross import count_loss_chunks
from xdistill.losses.continuation import ContinuationTrie, continuation_kl, continuation_rows

# teacher vocabulary 8; student token s -> teacher pieces (token 9 unmapped; token 10's prefix
# (4,) has no student token ending there, so its END slot is empty)
PIECES = [[0], [1], [2], [0, 1], [0, 2], [0, 1, 3], [1, 2], [3], [2, 0], [], [4, 5], [4, 6], [5]]
VT, VS = 8, len(PIECES)
END = "end"


def _batch():
    """Two rows of (student tokens, teacher tokens) chunks; returns ids, alignment, chunk list."""
    rows = [  # per row: list of (student ids, teacher ids) chunks, in order
        [([1], [1]), ([3], [0, 1]), ([5], [0, 1, 3]), ([4], [2, 2]), ([3, 7], [0, 1, 3])],
        [([12], [5]), ([10], [4, 5]), ([8], [2, 0]), ([11], [4, 6]), ([6], [1, 2])],
    ]
    Ts = max(sum(len(s) for s, _ in r) for r in rows)
    Tt = max(sum(len(t) for _, t in r) for r in rows)
    s_ids, t_ids = torch.zeros(2, Ts, dtype=torch.long), torch.zeros(2, Tt, dtype=torch.long)
    s_chunk, t_chunk = torch.full((2, Ts), -1), torch.full((2, Tt), -1)
    C = max(len(r) for r in rows)
    valid, chunks = torch.zeros(2, C, dtype=torch.bool), []
    for b, r in enumerate(rows):
        i = j = 0
        for c, (ss, tt) in enumerate(r):
            s_ids[b, i:i + len(ss)], s_chunk[b, i:i + len(ss)] = torch.tensor(ss), c
            t_ids[b, j:j + len(tt)], t_chunk[b, j:j + len(tt)] = torch.tensor(tt), c
            valid[b, c] = True
            chunks.append((b, i, j, j + len(tt)))
            i, j = i + len(ss), j + len(tt)
    align = ChunkAlignment(s_chunk, t_chunk, valid, torch.zeros_like(valid))
    return s_ids, t_ids, align, chunks


def _reference(zs, zt, s_ids, t_ids, chunks, tau, tau_t, count):
    """From the definition: per chunk and depth, group student tokens by their next piece."""
    total = 0.0
    for b, a, c, d in chunks:
        if a == 0 or c == 0:
            continue
        u = PIECES[int(s_ids[b, a])]
        m = len(u)
        if m < 2 or c + m > d or [int(x) for x in t_ids[b, c:c + m]] != u:
            continue
        p = torch.softmax(zs[b, a - 1].double() / tau, -1).tolist()
        for j in range(1, m):
            mass: dict = {}
            for s, pc in enumerate(PIECES):
                if len(pc) >= j and pc[:j] == u[:j]:
                    k = pc[j] if len(pc) > j else END
                    mass[k] = mass.get(k, 0.0) + p[s]
            z = sum(mass.values())
            P = {k: v / z for k, v in mass.items()}
            q = torch.softmax(zt[b, c + j - 1].double() / tau_t, -1).tolist()
            Q = {k: q[k] for k in P if k != END}
            if END in P:
                Q[END] = 1.0 - sum(Q.values())
            else:
                zq = sum(Q.values())
                Q = {k: v / zq for k, v in Q.items()}
            total += sum(Q[k] * math.log(Q[k] / P[k]) for k in Q if Q[k] > 0)
    return tau ** 2 * total / count


def _logits(seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    s_ids, t_ids, align, chunks = _batch()
    zs = torch.randn(2, s_ids.shape[1], VS + 2, generator=g, dtype=dtype) * 2
    zt = torch.randn(2, t_ids.shape[1], VT + 3, generator=g, dtype=dtype) * 2
    return zs, zt, s_ids, t_ids, align, chunks


@pytest.mark.parametrize("tau,tau_t", [(1.0, 1.0), (2.0, 2.0), (1.5, 0.7)])
def test_matches_reference(tau, tau_t):
    trie = ContinuationTrie.from_pieces(PIECES, VT)
    zs, zt, s_ids, t_ids, align, chunks = _logits(0)
    count = count_loss_chunks(align)
    got = continuation_kl(zs, zt, align, trie, s_ids, t_ids, temperature=tau,
                          teacher_temperature=tau_t, chunk_size=3)
    want = _reference(zs, zt, s_ids, t_ids, chunks, tau, tau_t, count)
    assert want > 0
    assert float(got) == pytest.approx(want, rel=1e-10, abs=1e-12)


def test_rows_skip_mismatched_paths_and_short_tokens():
    trie = ContinuationTrie.from_pieces(PIECES, VT)
    _, _, s_ids, t_ids, align, _ = _logits(0)
    b, s_row, t_row, node, n = continuation_rows(align, trie, s_ids, t_ids)
    assert n == count_loss_chunks(align) == 8  # chunks at position 0 on either side are dropped
    # row 0: token 3 (depth 1), token 5 (depths 1, 2), not token 4 (teacher split [2, 2]),
    # the multi-token chunk's first token 3 (depth 1); row 1: 10, 8, 11, 6 (depth 1 each)
    assert b.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert t_row.tolist() == [1, 3, 4, 8, 1, 3, 5, 7]
    assert s_row.tolist() == [0, 1, 1, 3, 0, 1, 2, 3]
    assert (node >= 0).all()


def test_masked_chunks_are_left_out():
    trie = ContinuationTrie.from_pieces(PIECES, VT)
    zs, zt, s_ids, t_ids, align, _ = _logits(1)
    mask = torch.ones_like(s_ids, dtype=torch.bool)
    mask[0, 2] = False  # the chunk of token 5
    full = continuation_kl(zs, zt, align, trie, s_ids, t_ids, num_valid=1)
    part = continuation_kl(zs, zt, align, trie, s_ids, t_ids, s_loss_mask_BTs=mask, num_valid=1)
    assert float(part) < float(full)
    assert continuation_rows(align, trie, s_ids, t_ids, mask)[0].numel() == 6


def test_gradcheck_student_side():
    trie = ContinuationTrie.from_pieces(PIECES, VT)
    zs, zt, s_ids, t_ids, align, _ = _logits(2)
    zs.requires_grad_(True)
    torch.autograd.gradcheck(
        lambda x: continuation_kl(x, zt, align, trie, s_ids, t_ids, temperature=1.3,
                                  chunk_size=2), (zs,))


def test_zero_when_teacher_conditionals_match_the_students():
    """Teacher rows built from the student's own conditionals (END mass on a token no group
    member continues with) give exactly zero, for every chunk."""
    trie = ContinuationTrie.from_pieces(PIECES, VT)
    zs, _, s_ids, t_ids, align, chunks = _logits(3)
    zt = torch.full((2, t_ids.shape[1], VT), -30.0, dtype=torch.float64)
    for b, a, c, d in chunks:
        u = PIECES[int(s_ids[b, a])]
        p = torch.softmax(zs[b, a - 1], -1)
        for j in range(1, len(u)):
            mass: dict = {}
            for s, pc in enumerate(PIECES):
                if len(pc) >= j and pc[:j] == u[:j]:
                    k = pc[j] if len(pc) > j else 7  # token 7 continues nothing in these groups
                    mass[k] = mass.get(k, 0.0) + float(p[s])
            for k, v in mass.items():
                zt[b, c + j - 1, k] = math.log(v)
    got = continuation_kl(zs, zt, align, trie, s_ids, t_ids)
    assert abs(float(got)) < 1e-9


def test_no_multi_piece_tokens_gives_zero_and_no_grad_error():
    trie = ContinuationTrie.from_pieces([[i % VT] for i in range(VS)], VT)
    zs, zt, s_ids, t_ids, align, _ = _logits(4)
    assert float(continuation_kl(zs, zt, align, trie, s_ids, t_ids)) == 0.0


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="student token 1: teacher piece ids"):
        ContinuationTrie.from_pieces([[0], [9]], 8)
    trie = ContinuationTrie.from_pieces(PIECES, VT)
    zs, zt, s_ids, t_ids, align, _ = _logits(0)
    with pytest.raises(ValueError, match="does not fit logits"):
        continuation_kl(zs[..., :5], zt, align, trie, s_ids, t_ids)


def test_float32_close_to_float64():
    trie = ContinuationTrie.from_pieces(PIECES, VT)
    zs, zt, s_ids, t_ids, align, _ = _logits(5)
    hi = continuation_kl(zs, zt, align, trie, s_ids, t_ids)
    lo = continuation_kl(zs.float(), zt.float(), align, trie, s_ids, t_ids)
    assert float(lo) == pytest.approx(float(hi), rel=1e-5)
