"""Slow float64 references of the 2026 on-policy cross-tokenizer losses, written from their
definitions (strict top-k, DPCA, SimpleOPD, BPM, ESCD), and small synthetic vocabularies.

Legend: B batch, Ts/Tt student/teacher tokens, Vs/Vt vocabularies, C chunks.
Everything is numpy / Python float64 with explicit loops over rows, chunks and tokens; nothing
here calls the implementation.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from xdistill.losses import ChunkAlignment
from xdistill.tokenization.table import ROLE_BOS, ROLE_CHAT, ROLE_EOS, ROLE_TEXT

WHITESPACE = b" \t\n\r\x0b\x0c"


def np64(x):
    return np.asarray(x.detach().double()) if torch.is_tensor(x) else np.asarray(x, np.float64)


def softmax(z, tau=1.0):
    z = np.asarray(z, np.float64) / tau
    e = np.exp(z - z.max())
    return e / e.sum()


def loss_chunk_list(align: ChunkAlignment, s_mask=None, t_mask=None, exact_only=False):
    """[(b, student token ids of the chunk, teacher token ids)] of the chunks that carry loss."""
    out = []
    s_chunk, t_chunk = align.s_chunk_BTs.tolist(), align.t_chunk_BTt.tolist()
    for b in range(len(s_chunk)):
        for k in range(align.chunk_valid_BC.shape[1]):
            if not bool(align.chunk_valid_BC[b, k]):
                continue
            if exact_only and not bool(align.chunk_exact_BC[b, k]):
                continue
            S = [i for i, c in enumerate(s_chunk[b]) if c == k]
            T = [j for j, c in enumerate(t_chunk[b]) if c == k]
            if not S or not T or S[0] == 0 or T[0] == 0:
                continue
            if s_mask is not None and not all(bool(s_mask[b, i]) for i in S):
                continue
            if t_mask is not None and not all(bool(t_mask[b, j]) for j in T):
                continue
            out.append((b, S, T))
    return out


def token_logp(z_BTV, ids_BT, tau=1.0):
    """log softmax(z[b, i-1] / tau)[ids[b, i]] at input positions (0 at i = 0), float64."""
    z, ids = np64(z_BTV), np.asarray(ids_BT)
    out = np.zeros(ids.shape)
    for b in range(ids.shape[0]):
        for i in range(1, ids.shape[1]):
            out[b, i] = math.log(softmax(z[b, i - 1], tau)[ids[b, i]])
    return out


# ------------------------------------------------------------------------------------ strict
def strict_ref(zs, zt, align, shared_s, shared_t, k, *, s_mask=None, t_mask=None, tau=1.0):
    zs, zt = np64(zs), np64(zt)
    total, units = 0.0, 0
    for b, S, T in loss_chunk_list(align, s_mask, t_mask, exact_only=True):
        q, p = softmax(zs[b, S[0] - 1], tau), softmax(zt[b, T[0] - 1], tau)
        qs = [q[s] for s in shared_s]
        chosen = sorted(range(len(qs)), key=lambda n: -qs[n])[:k]
        qk = np.array([qs[n] for n in chosen])
        pk = np.array([p[shared_t[n]] for n in chosen])
        qk, pk = qk / qk.sum(), pk / pk.sum()
        total += tau ** 2 * sum(a * math.log(a / c) for a, c in zip(qk, pk) if a > 0)
        units += 1
    return total, units


# ------------------------------------------------------------------------------------ policy
def ppo_ref(logp, beh, adv, eps_low=0.2, eps_high=0.28, c=10.0, lr_max=20.0):
    """(dual-clip PPO loss of one token, ratio clip active, dual clip active)."""
    rho = math.exp(min(max(logp - beh, -lr_max), lr_max))
    clipped = min(max(rho, 1 - eps_low), 1 + eps_high)
    l1, l2 = -adv * rho, -adv * clipped
    loss = max(l1, l2)
    dual = False
    if c is not None and adv < 0 and -c * adv < loss:
        loss, dual = -c * adv, True
    return loss, l2 > l1, dual


def dpca_ref(s_logp, beh, t_logp, align, *, s_mask=None, t_mask=None, adv_clamp=10.0, eps=1e-6,
             ppo=(0.2, 0.28, 10.0), baseline="none"):
    """(sum of token losses, units, counters) from the DPCA definition; ``baseline="mean"``
    subtracts the mean advantage over all unit tokens before the clamp (``"clipped_mean"``: the
    advantages clamped first, then centred)."""
    total, units = 0.0, 0
    fired = {"adv_clamped": 0, "ratio_clipped": 0, "dual_clipped": 0, "uniform_fallbacks": 0}
    raw = []
    for b, S, T in loss_chunk_list(align, s_mask, t_mask):
        LT = sum(max(float(t_logp[b, j]), -1e4) for j in T)
        LS = sum(float(beh[b, i]) for i in S)
        uniform = abs(LS) < eps
        fired["uniform_fallbacks"] += uniform
        for i in S:
            raw.append((b, i, (LT - LS) / len(S) if uniform else (LT / LS - 1.0) * float(beh[b, i])))
    if baseline == "clipped_mean" and adv_clamp is not None:
        raw = [(b, i, max(-adv_clamp, min(adv_clamp, a))) for b, i, a in raw]
    mean = (sum(a for _, _, a in raw) / len(raw)
            if raw and baseline in ("mean", "clipped_mean") else 0.0)
    for b, i, A in raw:
        A -= mean
        if adv_clamp is not None and abs(A) > adv_clamp:
            fired["adv_clamped"] += 1
            A = max(-adv_clamp, min(adv_clamp, A))
        loss, clip, dual = ppo_ref(float(s_logp[b, i]), float(beh[b, i]), A, *ppo)
        fired["ratio_clipped"] += clip
        fired["dual_clipped"] += dual
        total += loss
        units += 1
    return total, units, fired


def simple_opd_ref(s_logp, beh, t_logp, align, stop, s_mask, *, t_mask=None, adv_clamp=10.0,
                   ref_logp=None, beta=0.0, ppo=(0.2, 0.28, 10.0), baseline="none"):
    """(sum of token losses, units, scored tokens) from the SimpleOPD definition;
    ``baseline="mean"`` subtracts the mean over the scored tokens (others stay at 0);
    ``"clipped_mean"`` clamps them first."""
    adv = {}
    for b, S, T in loss_chunk_list(align, s_mask, t_mask, exact_only=True):
        if not bool(stop[b, S[0]]):
            adv[(b, S[0])] = float(t_logp[b, T[0]]) - float(beh[b, S[0]])
    if adv and baseline == "clipped_mean" and adv_clamp is not None:
        adv = {k: max(-adv_clamp, min(adv_clamp, v)) for k, v in adv.items()}
    if adv and baseline in ("mean", "clipped_mean"):
        mean = sum(adv.values()) / len(adv)
        adv = {k: v - mean for k, v in adv.items()}
    total, units = 0.0, 0
    for b in range(s_mask.shape[0]):
        for i in range(1, s_mask.shape[1]):
            if not bool(s_mask[b, i]):
                continue
            A = adv.get((b, i), 0.0)
            if adv_clamp is not None:
                A = max(-adv_clamp, min(adv_clamp, A))
            total += ppo_ref(float(s_logp[b, i]), float(beh[b, i]), A, *ppo)[0]
            if beta:
                r = min(max(float(ref_logp[b, i]) - float(s_logp[b, i]), -20.0), 20.0)
                total += beta * (math.exp(r) - 1 - r)
            units += 1
    return total, units, len(adv)


# ------------------------------------------------------------------------------- byte prefix
def is_text(table_bytes, roles, i):
    return roles[i] == ROLE_TEXT and len(table_bytes[i]) > 0


def phi_key_ref(s_bytes, s_roles, t_bytes, t_roles, w, s_stop, t_stop):
    """Bytes of the longest student text token that prefixes teacher token w; 'STOP'; None."""
    if w in t_stop:
        return "STOP" if s_stop else None
    if not is_text(t_bytes, t_roles, w):
        return None
    best = None
    for u in range(len(s_bytes)):
        if is_text(s_bytes, s_roles, u) and t_bytes[w].startswith(s_bytes[u]):
            if best is None or len(s_bytes[u]) > len(best):
                best = s_bytes[u]
    return best


def child_groups_ref(s_bytes, s_roles, t_bytes, t_roles, a):
    """{root residual: [teacher members]} of student token a, from the definition."""
    if not is_text(s_bytes, s_roles, a):
        return {}
    student_text = {s_bytes[u] for u in range(len(s_bytes)) if is_text(s_bytes, s_roles, u)}
    ab = s_bytes[a]
    G = [w for w in range(len(t_bytes)) if is_text(t_bytes, t_roles, w)
         and t_bytes[w].startswith(ab) and len(t_bytes[w]) > len(ab)
         and t_bytes[w] not in student_text]
    res = {w: t_bytes[w][len(ab):] for w in G}
    roots = {r for r in res.values()
             if not any(o != r and r.startswith(o) for o in res.values())}
    out: dict[bytes, list[int]] = {r: [] for r in roots}
    for w, r in res.items():
        (owner,) = [g for g in roots if r.startswith(g)]
        out[owner].append(w)
    return out


def completion_ref(s_bytes, s_roles, r):
    return [u for u in range(len(s_bytes)) if is_text(s_bytes, s_roles, u)
            and s_bytes[u].startswith(r)]


def byteprefix_ref(zs, zt, align, s_ids, s_tab, t_tab, *, s_stop, t_stop, s_mask=None,
                   t_mask=None, tau=1.0, child=False, mask_whitespace=False):
    """(sum over units of tau^2 KL(pbar || qbar) [+ child], units, masked, empty groups)."""
    zs, zt = np64(zs), np64(zt)
    s_bytes, s_roles = s_tab
    t_bytes, t_roles = t_tab
    keys = [phi_key_ref(s_bytes, s_roles, t_bytes, t_roles, w, s_stop, t_stop)
            for w in range(len(t_bytes))]
    image = {k for k in keys if k is not None}

    def members(key):
        if key == "STOP":
            return list(s_stop)
        return [u for u in range(len(s_bytes)) if is_text(s_bytes, s_roles, u)
                and s_bytes[u] == key]

    total, units, masked, empty = 0.0, 0, 0, 0
    for b, S, T in loss_chunk_list(align, s_mask, t_mask):
        a = int(s_ids[b, S[0]])
        if mask_whitespace and is_text(s_bytes, s_roles, a) and \
                all(c in WHITESPACE for c in s_bytes[a]):
            masked += 1
            continue
        q, p = softmax(zs[b, S[0] - 1], tau), softmax(zt[b, T[0] - 1], tau)
        pbar = {}
        for w in range(len(p)):
            pbar[keys[w]] = pbar.get(keys[w], 0.0) + p[w]
        qbar = {k: sum(q[u] for u in members(k)) for k in image}
        qbar[None] = 1.0 - sum(qbar.values())
        total += tau ** 2 * sum(m * math.log(m / qbar[k]) for k, m in pbar.items() if m > 0)
        if child:
            qc = softmax(zs[b, S[0]], tau)
            for r, ws in child_groups_ref(s_bytes, s_roles, t_bytes, t_roles, a).items():
                C = completion_ref(s_bytes, s_roles, r)
                if not C:
                    empty += 1
                    continue
                total -= sum(p[w] for w in ws) * math.log(sum(qc[u] for u in C))
        units += 1
    return total, units, masked, empty


def synthetic_tables():
    """Small student/teacher vocabularies (bytes, roles) with prefixes, duplicates and roles.

    Student: byte tokens, words, a duplicate of b"a", whitespace tokens, BOS, two stop tokens
    (EOS and an end-of-turn), a token no teacher token starts with. Teacher: longer words (some
    spelled by no student token, so they have child groups), bytes the student lacks (b"c..."),
    a stop token, a chat marker.
    """
    s_bytes = [b"", b"a", b"b", b" ", b"ab", b" a", b"\n", b"a", b"abb", b"", b"zz", b"ba",
               b" \n", b"bab", b"aba"]
    s_roles = [ROLE_BOS, 0, 0, 0, 0, 0, 0, 0, 0, ROLE_EOS, 0, 0, 0, 0, 0]
    s_bytes.append(b"")
    s_roles.append(ROLE_EOS)            # a second stop token (end-of-turn)
    t_bytes = [b"a", b"ab", b"abab", b"abba", b"abc", b"c", b"cab", b" ab", b" a", b"", b"",
               b"ba", b"bab", b"babb", b"\n\n", b" ", b"b", b"abbb", b"aab", b"", b"aa"]
    t_roles = [0] * len(t_bytes)
    t_roles[9], t_roles[10], t_roles[19] = ROLE_EOS, ROLE_CHAT, ROLE_EOS
    return (s_bytes, s_roles), (t_bytes, t_roles)


def random_ids(rng, B, T, V):
    return torch.from_numpy(rng.integers(0, V, size=(B, T)).astype(np.int64))


def identity_alignment(B, T):
    """Every token its own exact chunk (a teacher with the student's tokenizer)."""
    c = torch.arange(T).expand(B, T).clone()
    ones = torch.ones(B, T, dtype=torch.bool)
    return ChunkAlignment(c, c.clone(), ones, ones.clone())

