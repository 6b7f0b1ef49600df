"""Slow float64 references written straight from the loss formulas, and random test inputs.

Legend: B batch, Ts/Tt student/teacher tokens, Vs/Vt vocabularies, C chunks, K top-k.
Everything here is numpy float64 with explicit Python loops over tokens and chunks.
"""

from __future__ import annotations

import numpy as np
import torch

from xdistill.losses import ChunkAlignment


def softmax(z, tau=1.0):
    z = np.asarray(z, dtype=np.float64) / tau
    m = np.max(z[np.isfinite(z)]) if np.isfinite(z).any() else 0.0
    e = np.exp(z - m)
    return e / e.sum()


def kl(q, p):
    """sum_{q>0} q log(q / p)."""
    q, p = np.asarray(q, np.float64), np.asarray(p, np.float64)
    nz = q > 0
    return float(np.sum(q[nz] * (np.log(q[nz]) - np.log(p[nz]))))


def jsd(p, q, beta):
    if beta == 0:
        return kl(q, p)
    if beta == 1:
        return kl(p, q)
    m = beta * q + (1 - beta) * p
    return beta * kl(q, m) + (1 - beta) * kl(p, m)


def sorted_l1(a, b):
    a, b = np.sort(a)[::-1], np.sort(b)[::-1]
    n = max(a.size, b.size)
    a, b = np.pad(a, (0, n - a.size)), np.pad(b, (0, n - b.size))
    return float(np.abs(a - b).sum())


def same_tok_ref(zs, zt, mask, div, tau=1.0):
    """tau^2 * mean over masked tokens i>=1 of div(p_{i-1}, q_{i-1}) (div takes (p, q))."""
    zs, zt, mask = (np.asarray(x.detach().double()) if torch.is_tensor(x) else x
                    for x in (zs, zt, mask))
    total, n = 0.0, 0
    for b in range(zs.shape[0]):
        for i in range(1, zs.shape[1]):
            if mask[b, i]:
                total += div(softmax(zs[b, i - 1], tau), softmax(zt[b, i - 1], tau))
                n += 1
    return tau ** 2 * total / max(n, 1)


def topk_tail_kl(p, q, ids):
    """KL between q and p coarsened to {each id in ids, everything else}."""
    qk, pk = q[ids], p[ids]
    return kl(np.append(qk, 1 - qk.sum()), np.append(pk, 1 - pk.sum()))


def ce_ref(zs, labels, tau=1.0):
    zs = np.asarray(zs.detach().double())
    total, n = 0.0, 0
    for b in range(zs.shape[0]):
        for i in range(1, zs.shape[1]):
            if labels[b, i] >= 0:
                total -= np.log(softmax(zs[b, i - 1], tau)[int(labels[b, i])])
                n += 1
    return total / max(n, 1)


def chunk_tokens(chunk_row, k):
    return [i for i, c in enumerate(chunk_row) if c == k]


def cross_ref(zs, zt, align, chunk_div, *, s_mask=None, exact_only=False, tau=1.0):
    """mean over loss chunks of chunk_div(p at student chunk start, q at teacher chunk start)."""
    zs, zt = np.asarray(zs.detach().double()), np.asarray(zt.detach().double())
    total, n = 0.0, 0
    for b in range(zs.shape[0]):
        for k in range(align.chunk_valid_BC.shape[1]):
            if not align.chunk_valid_BC[b, k] or (exact_only and not align.chunk_exact_BC[b, k]):
                continue
            S = chunk_tokens(align.s_chunk_BTs[b].tolist(), k)
            T = chunk_tokens(align.t_chunk_BTt[b].tolist(), k)
            if S[0] == 0 or T[0] == 0 or (s_mask is not None and not all(s_mask[b, S])):
                continue
            total += chunk_div(softmax(zs[b, S[0] - 1], tau), softmax(zt[b, T[0] - 1], tau))
            n += 1
    return total / max(n, 1)


def alm_ref(zs, s_ids, zt, t_ids, align, variant, alm_tau=100.0, s_mask=None):
    zs, zt = np.asarray(zs.detach().double()), np.asarray(zt.detach().double())
    total, n = 0.0, 0
    for b in range(zs.shape[0]):
        for k in range(align.chunk_valid_BC.shape[1]):
            if not align.chunk_valid_BC[b, k]:
                continue
            S = chunk_tokens(align.s_chunk_BTs[b].tolist(), k)
            T = chunk_tokens(align.t_chunk_BTt[b].tolist(), k)
            if S[0] == 0 or T[0] == 0 or (s_mask is not None and not all(s_mask[b, S])):
                continue
            ls = sum(np.log(softmax(zs[b, i - 1])[int(s_ids[b, i])]) for i in S)
            lt = sum(np.log(softmax(zt[b, j - 1])[int(t_ids[b, j])]) for j in T)
            if variant == "abs":
                d = abs(ls - lt)
            else:
                a, bb = np.exp(lt / alm_tau), np.exp(ls / alm_tau)
                d = -(a * np.log(bb) + (1 - a) * np.log(1 - bb))
            total += d
            n += 1
    return total / max(n, 1)


def random_alignment(rng, B, n_chunks=10, unaligned_p=0.2, exact_p=0.6, pad=2):
    """Random chunkings of equal byte strings (two-pointer style), with unaligned regions/padding.

    Each row: chunks of 1-3 student and 1-3 teacher tokens; some regions are unaligned (tokens -1,
    no chunk id); ids renumbered 0..n-1 over valid chunks; 1:1 chunks are exact with prob exact_p.
    Returns ChunkAlignment plus student/teacher lengths.
    """
    rows = []
    for _ in range(B):
        s_row, t_row, exact, cid = [], [], [], 0
        for _ in range(n_chunks):
            ls, lt = int(rng.choice([1, 1, 2, 3])), int(rng.choice([1, 1, 2, 3]))
            if rng.random() < unaligned_p:
                s_row += [-1] * ls
                t_row += [-1] * lt
                continue
            s_row += [cid] * ls
            t_row += [cid] * lt
            exact.append(ls == 1 and lt == 1 and rng.random() < exact_p)
            cid += 1
        rows.append((s_row, t_row, exact))
    Ts = max(len(r[0]) for r in rows) + pad
    Tt = max(len(r[1]) for r in rows) + pad
    C = max(max(len(r[2]) for r in rows), 1)
    s = np.full((B, Ts), -1, np.int64)
    t = np.full((B, Tt), -1, np.int64)
    valid = np.zeros((B, C), bool)
    ex = np.zeros((B, C), bool)
    s_len, t_len = [], []
    for b, (sr, tr, e) in enumerate(rows):
        s[b, :len(sr)], t[b, :len(tr)] = sr, tr
        valid[b, :len(e)], ex[b, :len(e)] = True, e
        s_len.append(len(sr))
        t_len.append(len(tr))
    align = ChunkAlignment(torch.from_numpy(s), torch.from_numpy(t), torch.from_numpy(valid),
                           torch.from_numpy(ex))
    return align, np.array(s_len), np.array(t_len)


def random_projection(rng, Vs, Vt, density=0.3):
    """Dense [Vs, Vt] non-negative matrix, rows sum to 1, one unmapped row, one unreached column."""
    W = rng.random((Vs, Vt)) * (rng.random((Vs, Vt)) < density)
    W[:, -1] = 0.0
    for s in range(Vs):
        if W[s].sum() == 0:
            W[s, rng.integers(0, Vt - 1)] = 1.0
    W = W / W.sum(1, keepdims=True)
    W[0] = 0.0
    return W
