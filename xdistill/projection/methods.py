"""Projection methods that need no corpus: exact bytes, roles, multitoken re-tokenization.

Every method returns a sparse triplet ``(s_N, t_N, w_N)`` (student row, teacher column, weight);
:mod:`xdistill.projection.build` composes them, keeps the top-k per row and renormalises.

* **exact**: student token ``s`` and teacher token ``t`` contribute identical bytes -> ``W[s,t]=1``.
  When several teacher tokens share those bytes (SentencePiece ``▁`` and ``<0x20>``), one is chosen
  by :func:`teacher_preference` (the one the teacher itself produces for those bytes).
* **roles**: student bos/eos/pad/unk tokens map to the teacher token of the same role: its
  designated ``bos_id``/``eos_id``/``pad_id``/``unk_id`` when that token has the role, else all
  teacher tokens of that role uniformly, else (no token has the role) the designated id. Chat, tool and other special tokens stay unmapped: they have no text bytes and no
  meaning shared across tokenizers.
* **multitoken**: the bytes of student token ``s`` are re-tokenized by the teacher into pieces
  ``t_0..t_{n-1}``; piece ``i`` gets weight ``decay**i / sum_j decay**j`` (NeMo-RL's ``0.9*0.1**i``
  normalised is ``decay=0.1``). Repeated teacher ids add up. Bytes that are not valid UTF-8 on their
  own (a byte-fallback ``<0xE4>`` token, a byte-BPE token holding half a character) cannot be passed
  to a text tokenizer: they are split into maximal valid UTF-8 segments, which the teacher encodes,
  and single invalid bytes, which map to the teacher's single-byte token (byte-BPE byte or
  ``<0xNN>`` byte fallback); a byte the teacher has no token for is dropped (WordPiece).
  When the teacher adds a phantom prefix (SentencePiece's dummy ``▁`` that is not in the text), the
  first piece is replaced by the teacher token holding only its real bytes (or dropped when it is
  nothing but the phantom); if no such token exists its real bytes are split greedily into the
  longest teacher tokens.
* **reverse** (optional, added to multitoken): each teacher token whose bytes the *student*
  re-tokenizes into exactly one token ``s`` adds ``reverse_weight`` to ``W[s,t]``.

Legend: ``Vs``/``Vt`` vocabularies, ``N`` non-zeros / pieces.
"""

from __future__ import annotations

import re

import numpy as np
from tqdm import tqdm

from xdistill.projection.bytematch import (
    byte_token_map, match_bytes, resolve_one_per_row, text_ids)
from xdistill.tokenization.table import (
    ROLE_BOS, ROLE_EOS, ROLE_PAD, ROLE_UNK, TokenByteTable)

_SURROGATE = re.compile("([\udc80-\udcff])")
_PREFERENCE_CACHE: dict[int, tuple[TokenByteTable, np.ndarray]] = {}
EMPTY = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64))


def _encode_texts(tok, texts: list[str]) -> list[tuple[list[int], int]]:
    """``(ids, phantom_prefix)`` of each text, a special token's string read as the text it
    spells (a student text token ``</s>`` is spelled with the teacher's text tokens, not mapped
    onto its end-of-sequence token, which has no bytes)."""
    if hasattr(tok, "encode_ids_batch"):          # no byte offsets needed: the fast path
        return tok.encode_ids_batch(texts, specials_as_text=True)
    return [([int(i) for i in e.ids], int(getattr(e, "phantom_prefix", 0) or 0))
            for e in tok.encode_batch(texts, add_special_tokens=False)]


def _encode_clean(tok, texts: list[str]) -> list[list[int]]:
    """Teacher ids of each text with any phantom prefix removed (see the module docstring)."""
    table = tok.table
    encoded = _encode_texts(tok, texts)
    out: list[list[int]] = []
    lookup = None
    for ids, phantom in encoded:
        if phantom and ids:
            real = table.token_bytes(ids[0])[phantom:]
            if lookup is None:
                lookup = _bytes_dict(tok)
            ids = _greedy_split(real, lookup) + ids[1:]
        out.append(ids)
    return out


def _bytes_dict(tok) -> dict[bytes, int]:
    """Teacher bytes -> preferred id, for the rare phantom-prefix fix-up."""
    table = tok.table
    pref = teacher_preference(tok)
    ids = text_ids(table)
    ids = ids[np.lexsort((ids, pref[ids]))[::-1]]  # least preferred first, so the best wins
    return {table.token_bytes(int(i)): int(i) for i in ids}


def _greedy_split(data: bytes, lookup: dict[bytes, int]) -> list[int]:
    """Longest-match split of ``data`` into tokens of ``lookup`` (bytes without a token dropped)."""
    out, pos, max_len = [], 0, 64
    while pos < len(data):
        for end in range(min(len(data), pos + max_len), pos, -1):
            tid = lookup.get(data[pos:end])
            if tid is not None:
                out.append(tid)
                pos = end
                break
        else:
            pos += 1
    return out


def teacher_preference(tok) -> np.ndarray:
    """Rank per teacher id (lower = preferred) to choose among tokens with identical bytes.

    For each group of duplicates the token the teacher itself produces for those bytes wins;
    otherwise the highest id (byte-fallback ``<0xNN>`` tokens sit at the start of SentencePiece
    vocabularies, so the ordinary piece wins).
    """
    cached = _PREFERENCE_CACHE.get(id(tok.table))
    if cached is not None and cached[0] is tok.table:
        return cached[1]
    table = tok.table
    rank = np.zeros(table.vocab_size, dtype=np.int64)
    ids = text_ids(table)
    q, r = match_bytes(table, ids, table, ids)
    dup = q != r
    groups: dict[int, list[int]] = {}
    for a, b in zip(q[dup].tolist(), r[dup].tolist()):
        groups.setdefault(min(a, b), []).append(max(a, b))
    member_lists = [sorted({first, *others}) for first, others in sorted(groups.items())]
    for members in member_lists:
        rank[members] = -np.arange(len(members))  # highest id preferred by default
    texts = [table.token_bytes(m[0]).decode("utf-8", "surrogateescape") for m in member_lists]
    ask = [i for i, text in enumerate(texts) if not _SURROGATE.search(text)]
    if ask and (hasattr(tok, "encode_batch") or hasattr(tok, "encode_ids_batch")):
        for i, produced in zip(ask, _encode_strip_phantom(tok, [texts[i] for i in ask])):
            if len(produced) == 1 and produced[0] in member_lists[i]:
                rank[produced[0]] = -len(member_lists[i]) - 1
    _PREFERENCE_CACHE[id(tok.table)] = (tok.table, rank)
    return rank


def _encode_strip_phantom(tok, texts: list[str]) -> list[list[int]]:
    """Teacher ids of each text minus a first token that is nothing but phantom prefix."""
    out = []
    for ids, phantom in _encode_texts(tok, texts):
        if phantom and ids and tok.table.lengths_V[ids[0]] == phantom:
            ids = ids[1:]
        out.append(ids)
    return out


def exact_pairs(student, teacher) -> tuple[np.ndarray, np.ndarray]:
    """One ``(s, t)`` pair per student text token whose bytes equal a teacher token's."""
    s_tab, t_tab = student.table, teacher.table
    q, r = match_bytes(s_tab, text_ids(s_tab), t_tab, text_ids(t_tab))
    return resolve_one_per_row(q, r, teacher_preference(teacher))


def role_pairs(student, teacher) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Student bos/eos/pad/unk tokens -> teacher token(s) of the same role (see module doc)."""
    s_roles, t_roles = student.table.roles_V, teacher.table.roles_V
    designated = {ROLE_BOS: getattr(teacher, "bos_id", None), ROLE_EOS: getattr(teacher, "eos_id", None),
                  ROLE_PAD: getattr(teacher, "pad_id", None), ROLE_UNK: getattr(teacher, "unk_id", None)}
    rows, cols, vals = [], [], []
    for role, tid in designated.items():
        s_ids = np.flatnonzero(s_roles == role)
        if s_ids.size == 0:
            continue
        targets = _role_targets(t_roles, role, tid)
        if targets.size == 0:
            continue
        rows.append(np.repeat(s_ids, targets.size))
        cols.append(np.tile(targets, s_ids.size))
        vals.append(np.full(s_ids.size * targets.size, 1.0 / targets.size))
    if not rows:
        return EMPTY
    return (np.concatenate(rows).astype(np.int64), np.concatenate(cols).astype(np.int64),
            np.concatenate(vals))


def _role_targets(t_roles: np.ndarray, role: int, designated: int | None) -> np.ndarray:
    """Teacher ids for a role: the designated id if its role matches, else every token with the
    role, else (no token has the role, e.g. Qwen2's bos is ``<|endoftext|>``) the designated id."""
    valid = designated is not None and 0 <= designated < t_roles.size
    if valid and t_roles[designated] == role:
        return np.array([designated], dtype=np.int64)
    same = np.flatnonzero(t_roles == role).astype(np.int64)
    if same.size or not valid:
        return same
    return np.array([designated], dtype=np.int64)


def _segments(data: bytes) -> list[str | int]:
    """Split bytes into valid UTF-8 text segments (str) and single invalid bytes (int)."""
    text = data.decode("utf-8", "surrogateescape")
    if not _SURROGATE.search(text):
        return [text]
    out: list[str | int] = []
    for part in _SURROGATE.split(text):
        if not part:
            continue
        if len(part) == 1 and "\udc80" <= part <= "\udcff":
            out.append(ord(part) - 0xDC00)
        else:
            out.append(part)
    return out


def retokenize(src_table: TokenByteTable, src_ids: np.ndarray, dst_tok, *, batch_size: int = 4096,
               progress: bool = False, desc: str = "re-tokenize") -> list[list[int]]:
    """Destination-tokenizer ids for the bytes of each source token (list per source id)."""
    dst_bytes = byte_token_map(dst_tok.table, teacher_preference(dst_tok))
    segs = [_segments(src_table.token_bytes(int(i))) for i in src_ids]
    texts = [seg for row in segs for seg in row if isinstance(seg, str)]
    encoded: list[list[int]] = []
    with tqdm(total=len(texts), desc=desc, unit="tok", disable=not progress, leave=False) as bar:
        for start in range(0, len(texts), batch_size):
            chunk = texts[start:start + batch_size]
            encoded.extend(_encode_clean(dst_tok, chunk))
            bar.update(len(chunk))
    it = iter(encoded)
    out = []
    for row in segs:
        pieces: list[int] = []
        for seg in row:
            if isinstance(seg, str):
                pieces.extend(next(it))
            elif dst_bytes[seg] >= 0:
                pieces.append(int(dst_bytes[seg]))
        out.append(pieces)
    return out


def continuation_pieces(student, teacher, *, batch_size: int = 4096,
                        progress: bool = False) -> list[list[int]]:
    """``pieces[s]``: the teacher ids spelling student token ``s``'s bytes (:func:`retokenize`;
    empty for tokens without text bytes), for every id of the student vocabulary -- the input of
    ``xdistill.losses.ContinuationTrie.from_pieces``."""
    s_ids = text_ids(student.table)
    out: list[list[int]] = [[] for _ in range(student.table.vocab_size)]
    pieces = retokenize(student.table, s_ids, teacher, batch_size=batch_size, progress=progress,
                        desc="continuation pieces")
    for s, p in zip(s_ids.tolist(), pieces):
        out[s] = p
    return out


def piece_weights(n: int, decay: float) -> np.ndarray:
    """Normalised weights ``decay**i / sum_j decay**j`` of ``n`` pieces (float64)."""
    w = np.power(float(decay), np.arange(n, dtype=np.float64))
    return w / w.sum()


def multitoken_triplets(student, teacher, *, decay: float = 0.1, reverse: bool = False,
                        reverse_weight: float = 1.0, batch_size: int = 4096,
                        progress: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Multitoken (and optional reverse) triplets; each forward row sums to 1 before reverse."""
    s_ids = text_ids(student.table)
    pieces = retokenize(student.table, s_ids, teacher, batch_size=batch_size, progress=progress,
                        desc="multitoken")
    n_Vs = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
    rows = np.repeat(s_ids, n_Vs)
    cols = np.fromiter((t for p in pieces for t in p), dtype=np.int64, count=int(n_Vs.sum()))
    pos = np.arange(rows.size, dtype=np.int64) - np.repeat(np.cumsum(n_Vs) - n_Vs, n_Vs)
    # denominator sum_{j<n} decay**j per row, computed per piece count n (exact, order-independent)
    max_n = int(n_Vs.max(initial=0))
    denom_n = np.array([1.0] + [np.power(float(decay), np.arange(n, dtype=np.float64)).sum()
                                for n in range(1, max_n + 1)])
    vals = np.power(float(decay), pos.astype(np.float64)) / np.repeat(denom_n[n_Vs], n_Vs)
    if reverse:
        t_ids = text_ids(teacher.table)
        back = retokenize(teacher.table, t_ids, student, batch_size=batch_size, progress=progress,
                          desc="reverse")
        single = np.array([len(p) == 1 for p in back], dtype=bool)
        r_rows = np.array([p[0] for p, ok in zip(back, single) if ok], dtype=np.int64)
        r_cols = t_ids[single]
        rows = np.concatenate([rows, r_rows])
        cols = np.concatenate([cols, r_cols])
        vals = np.concatenate([vals, np.full(r_rows.size, float(reverse_weight))])
    return rows, cols, vals

