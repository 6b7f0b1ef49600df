"""Byte-prefix map of a teacher vocabulary onto student tokens: the static structure of BPM / ESCD.

Legend: Vs/Vt student/teacher vocabularies, U student coordinates, M coordinate members (student
ids), Ns student text tokens sorted by bytes, G child groups, W group members (teacher ids).

**Root map.** ``phi: Vt -> Vs u {bot}`` sends each teacher text token ``w`` to the *longest*
student text token ``u`` whose bytes are a (non-strict) byte prefix of ``bytes(w)``; ``bot`` (-1)
when no student token is. Teacher stop tokens (role ``eos``: EOS / end-of-turn) map to the
student's stop tokens (the *stop bridge*: a stop on one side is a stop on the other); every other
role token and every zero-byte token maps to ``bot``. The image of ``phi`` is the set of student
*coordinates*. A coordinate is an event, not an id: it pools every student id that spells it,
i.e. all student text tokens with the same bytes (SentencePiece ``▁`` and ``<0x20>``), and all
student stop tokens (EOS and end-of-turn) for the stop coordinate. ``phi_Vt`` itself reports one
representative id per coordinate (the smallest). Student ids in no coordinate form the student's
``bot`` (the complement), see :mod:`xdistill.losses.byteprefix`.

**Child groups (ESCD).** For a student text token ``a``, the teacher events continuing it are
``G(a) = {w text token : bytes(a) is a strict prefix of bytes(w), bytes(w) is no student text
token's bytes}``. Their residuals ``r_w = bytes(w)[len(a):]`` are split into prefix-connected
groups: a group's root ``r_g`` is a residual of which no other residual is a proper prefix, and
each residual joins the (unique) root that is its prefix. In byte-sorted order a group is a
contiguous run starting at its root, which is how it is built. The completion set
``C(r_g) = {u student text token : r_g is a prefix of bytes(u)}`` is a contiguous range
``[lo, hi)`` of the student text tokens sorted by bytes (``sorted_s``), so the loss sums a
cumulative sum. Groups are stored once per distinct ``bytes(a)`` and referenced per student id
(CSR ``a_ptr`` / ``a_groups``); groups with an empty completion set keep ``lo == hi``.

``whitespace_Vs`` marks student text tokens made only of ASCII whitespace (space, tab, newline,
carriage return, vertical tab, form feed: ``bytes.isspace``), for the losses' whitespace mask.

The build is one pass over the teacher tokens' prefixes with a bytes -> ids dictionary
(``O(sum of teacher token lengths)`` lookups), then sorting per student token; a few seconds for a
150k-token teacher. numpy only.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from xdistill.tokenization.table import ROLE_EOS, ROLE_TEXT, TokenByteTable

BOT = -1


@dataclass(frozen=True, eq=False)
class BytePrefixMap:
    """The static byte-prefix structure of one (student, teacher) pair (module doc)."""

    # phi per teacher id: a representative student id of its coordinate, or -1 (bot), int64 [Vt]
    phi_Vt: np.ndarray
    # student coordinate of each teacher id (index into the coordinates), -1 = bot, int64 [Vt]
    coord_Vt: np.ndarray
    # student ids of coordinate k: coord_members[coord_ptr[k]:coord_ptr[k+1]], int64 [U+1] / [M]
    coord_ptr: np.ndarray
    coord_members: np.ndarray
    # index of the stop coordinate, -1 when either side has no stop token
    stop_coord: int
    # student text ids (role text, >= 1 byte) sorted by bytes, int64 [Ns]
    sorted_s: np.ndarray
    # student text tokens made only of ASCII whitespace, bool [Vs]
    whitespace_Vs: np.ndarray
    # child groups of student id a: a_groups[a_ptr[a]:a_ptr[a+1]], int64 [Vs+1] / [.]
    a_ptr: np.ndarray
    a_groups: np.ndarray
    # completion range of group g in sorted_s: [group_lo[g], group_hi[g]), int64 [G] each
    group_lo: np.ndarray
    group_hi: np.ndarray
    # teacher members of group g: member_t[member_ptr[g]:member_ptr[g+1]], int64 [G+1] / [W]
    member_ptr: np.ndarray
    member_t: np.ndarray
    # vocabulary sizes of the two tables
    student_vocab: int
    teacher_vocab: int

    @property
    def num_coords(self) -> int:
        return int(self.coord_ptr.size - 1)

    @property
    def num_groups(self) -> int:
        return int(self.group_lo.size)

    def arrays(self) -> dict:
        """The arrays and sizes the torch container takes (``BytePrefixTables.from_arrays``)."""
        return {"coord_Vt": self.coord_Vt, "coord_ptr": self.coord_ptr,
                "coord_members": self.coord_members, "sorted_s": self.sorted_s,
                "whitespace_Vs": self.whitespace_Vs, "a_ptr": self.a_ptr, "a_groups": self.a_groups,
                "group_lo": self.group_lo, "group_hi": self.group_hi,
                "member_ptr": self.member_ptr, "member_t": self.member_t,
                "student_vocab": self.student_vocab, "teacher_vocab": self.teacher_vocab}

    def summary(self, teacher_table: TokenByteTable | None = None) -> dict:
        """Sizes, and the share of teacher text tokens with ``phi != bot`` when a table is given."""
        out = {"coords": self.num_coords, "coord_members": int(self.coord_members.size),
               "groups": self.num_groups, "group_members": int(self.member_t.size),
               "empty_groups": int((self.group_lo == self.group_hi).sum()),
               "student_tokens_with_groups": int((np.diff(self.a_ptr) > 0).sum())}
        if teacher_table is not None:
            text = (teacher_table.roles_V == ROLE_TEXT) & (teacher_table.lengths_V > 0)
            covered = (self.phi_Vt[text] >= 0).mean() if text.any() else 0.0
            out["teacher_text_coverage"] = float(covered)
        return out


def _table(x) -> TokenByteTable:
    return x if isinstance(x, TokenByteTable) else x.table


def _all_bytes(table: TokenByteTable) -> list[bytes]:
    buf, off = table.data.tobytes(), table.offsets_V1.tolist()
    return [buf[off[i]:off[i + 1]] for i in range(table.vocab_size)]


def _stop_ids(table: TokenByteTable, given, side: str) -> list[int]:
    """Stop ids (given, else every token of role eos); they must carry no text bytes."""
    ids = np.flatnonzero(table.roles_V == ROLE_EOS).tolist() if given is None else \
        sorted({int(i) for i in given})
    for i in ids:
        if not 0 <= i < table.vocab_size:
            raise ValueError(f"{side} stop id {i} outside the vocabulary ({table.vocab_size})")
        if table.roles_V[i] == ROLE_TEXT and table.lengths_V[i] > 0:
            raise ValueError(f"{side} stop id {i} is a text token with bytes "
                             f"{table.token_bytes(i)!r}; stop tokens must carry no text")
    return ids


def _student_index(s_table: TokenByteTable, s_bytes: list[bytes]) -> dict[bytes, list[int]]:
    """bytes -> student text ids spelling them (ids ascending)."""
    out: dict[bytes, list[int]] = {}
    roles, lens = s_table.roles_V, s_table.lengths_V
    for i in np.flatnonzero((roles == ROLE_TEXT) & (lens > 0)).tolist():
        out.setdefault(s_bytes[i], []).append(i)
    return out


def _scan_teacher(t_table, t_bytes, s_index):
    """(longest student prefix bytes per teacher text id, {bytes(a): [(residual, w)]})."""
    longest: dict[int, bytes] = {}
    pairs: dict[bytes, list] = {}
    max_len = max((len(k) for k in s_index), default=0)
    roles, lens = t_table.roles_V, t_table.lengths_V
    for w in np.flatnonzero((roles == ROLE_TEXT) & (lens > 0)).tolist():
        b = t_bytes[w]
        own = b in s_index
        for n in range(min(len(b), max_len), 0, -1):
            head = b[:n]
            if head not in s_index:
                continue
            if w not in longest:
                longest[w] = head
            if own:
                break  # w is spelled by a student token: it is no child event of any a
            if n < len(b):
                pairs.setdefault(head, []).append((b[n:], w))
    return longest, pairs


def _coordinates(longest, s_index, s_stop, t_stop, Vt):
    """coord_Vt, phi_Vt, coord_ptr, coord_members, stop_coord (coordinates by representative)."""
    keys = sorted(set(longest.values()), key=lambda k: s_index[k][0])
    index = {k: i for i, k in enumerate(keys)}
    members = [s_index[k] for k in keys]
    coord_Vt = np.full(Vt, BOT, dtype=np.int64)
    if longest:
        w = np.fromiter(longest.keys(), dtype=np.int64, count=len(longest))
        coord_Vt[w] = np.fromiter((index[k] for k in longest.values()), dtype=np.int64,
                                  count=len(longest))
    stop_coord = BOT
    if s_stop and t_stop:
        stop_coord = len(members)
        members.append(list(s_stop))
        coord_Vt[np.asarray(t_stop, dtype=np.int64)] = stop_coord
    sizes = np.fromiter((len(m) for m in members), dtype=np.int64, count=len(members))
    coord_ptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    flat = np.fromiter((s for m in members for s in m), dtype=np.int64, count=int(sizes.sum()))
    rep = np.array([m[0] for m in members] + [BOT], dtype=np.int64)
    phi_Vt = rep[coord_Vt]  # coord -1 picks the trailing BOT
    return coord_Vt, phi_Vt, coord_ptr, flat, stop_coord


def _successor(r: bytes) -> bytes | None:
    """Smallest byte string greater than every string with prefix ``r`` (None: no such string)."""
    r = r.rstrip(b"\xff")
    return None if not r else r[:-1] + bytes([r[-1] + 1])


def _groups(pairs, sorted_bytes):
    """Per distinct bytes(a): list of group ids; flat (lo, hi, member_ptr, member_t) of groups."""
    by_a: dict[bytes, list[int]] = {}
    lo, hi, sizes, members = [], [], [], []
    n_sorted = len(sorted_bytes)
    for a_bytes, items in pairs.items():
        items.sort()
        ids = by_a.setdefault(a_bytes, [])
        root = None
        for res, w in items:
            if root is None or not res.startswith(root):
                root = res
                ids.append(len(lo))
                lo.append(bisect.bisect_left(sorted_bytes, root))
                nxt = _successor(root)
                hi.append(n_sorted if nxt is None else bisect.bisect_left(sorted_bytes, nxt))
                sizes.append(0)
            sizes[-1] += 1
            members.append(w)
    member_ptr = np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64))])
    return (by_a, np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64),
            member_ptr.astype(np.int64), np.asarray(members, dtype=np.int64))


def _per_student(by_a, s_index, Vs):
    """CSR ``a_ptr`` [Vs+1] / ``a_groups``: the groups of each student id (shared by duplicates)."""
    counts = np.zeros(Vs, dtype=np.int64)
    lists: dict[int, list[int]] = {}
    for a_bytes, gids in by_a.items():
        for s in s_index[a_bytes]:
            lists[s] = gids
            counts[s] = len(gids)
    a_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    flat = np.fromiter((g for s in sorted(lists) for g in lists[s]), dtype=np.int64,
                       count=int(counts.sum()))
    return a_ptr, flat


def build_byteprefix_map(student, teacher, *, student_stop_ids=None,
                         teacher_stop_ids=None) -> BytePrefixMap:
    """The :class:`BytePrefixMap` of a pair (``TokenByteTable`` or anything with ``.table``).

    ``student_stop_ids`` / ``teacher_stop_ids``: the stop tokens of each side (default: every
    token of role ``eos``); they must carry no text bytes. The stop coordinate exists only when
    both sides have one.
    """
    s_table, t_table = _table(student), _table(teacher)
    s_bytes, t_bytes = _all_bytes(s_table), _all_bytes(t_table)
    s_stop = _stop_ids(s_table, student_stop_ids, "student")
    t_stop = _stop_ids(t_table, teacher_stop_ids, "teacher")
    s_index = _student_index(s_table, s_bytes)
    longest, pairs = _scan_teacher(t_table, t_bytes, s_index)
    coord_Vt, phi_Vt, coord_ptr, coord_members, stop_coord = _coordinates(
        longest, s_index, s_stop, t_stop, t_table.vocab_size)
    sorted_keys = sorted(s_index)
    sorted_s = np.fromiter((s for k in sorted_keys for s in s_index[k]), dtype=np.int64,
                           count=sum(len(v) for v in s_index.values()))
    # duplicates (equal bytes) occupy consecutive slots: range bounds are in *id* positions
    key_start = np.concatenate([[0], np.cumsum([len(s_index[k]) for k in sorted_keys])])
    by_a, g_lo, g_hi, member_ptr, member_t = _groups(pairs, sorted_keys)
    a_ptr, a_groups = _per_student(by_a, s_index, s_table.vocab_size)
    whitespace = np.zeros(s_table.vocab_size, dtype=bool)
    for k, ids in s_index.items():
        if k.isspace():
            whitespace[ids] = True
    return BytePrefixMap(phi_Vt, coord_Vt, coord_ptr, coord_members, stop_coord, sorted_s,
                         whitespace, a_ptr, a_groups, key_start[g_lo].astype(np.int64),
                         key_start[g_hi].astype(np.int64), member_ptr, member_t,
                         s_table.vocab_size, t_table.vocab_size)
