"""The static byte-prefix map of BPM / ESCD: brute force from the definitions on random synthetic
tables (every (teacher, student) pair), and real tokenizer pairs (hand-picked tokens, sampled
brute force, coverage, build time).

Legend: Vs/Vt vocabularies.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from projection_helpers import random_table

from xdistill.projection import build_byteprefix_map
from xdistill.tokenization.table import ROLE_CHAT, ROLE_EOS, ROLE_TEXT, TokenByteTable


_CACHE: dict = {}


def _bytes(table: TokenByteTable) -> list[bytes]:
    key = ("bytes", id(table))
    if key not in _CACHE:
        buf, off = table.data.tobytes(), table.offsets_V1.tolist()
        _CACHE[key] = (table, [buf[off[i]:off[i + 1]] for i in range(table.vocab_size)])
    return _CACHE[key][1]


def _text_ids(table: TokenByteTable) -> list[int]:
    """Ordinary tokens with at least one byte (the definition's 'text token')."""
    return np.flatnonzero((table.roles_V == ROLE_TEXT) & (table.lengths_V > 0)).tolist()


def _text(table: TokenByteTable, i: int) -> bool:
    return table.roles_V[i] == ROLE_TEXT and table.lengths_V[i] > 0


def _groups_brute(s_tab, t_tab, a) -> dict[bytes, set[int]]:
    """{root residual: teacher members} of student token a, from the definition."""
    sb, tb = _bytes(s_tab), _bytes(t_tab)
    if not _text(s_tab, a):
        return {}
    student_text = {sb[u] for u in _text_ids(s_tab)}
    res = {w: tb[w][len(sb[a]):] for w in _text_ids(t_tab)
           if tb[w].startswith(sb[a]) and len(tb[w]) > len(sb[a]) and tb[w] not in student_text}
    roots = {r for r in res.values() if not any(o != r and r.startswith(o) for o in res.values())}
    out = {r: set() for r in roots}
    for w, r in res.items():
        (owner,) = [g for g in roots if r.startswith(g)]
        out[owner].add(w)
    return out


def _check_against_brute_force(m, s_tab, t_tab, s_stop, t_stop):
    sb, tb = _bytes(s_tab), _bytes(t_tab)
    members = [set(m.coord_members[m.coord_ptr[k]:m.coord_ptr[k + 1]].tolist())
               for k in range(m.num_coords)]
    for w in range(t_tab.vocab_size):
        cands = [u for u in range(s_tab.vocab_size) if _text(s_tab, u) and _text(t_tab, w)
                 and tb[w].startswith(sb[u])]                       # every (w, u) pair
        if w in t_stop and s_stop:
            assert m.coord_Vt[w] == m.stop_coord and members[m.stop_coord] == set(s_stop)
            assert m.phi_Vt[w] == min(s_stop)
        elif not cands:
            assert m.phi_Vt[w] == -1 and m.coord_Vt[w] == -1, w
        else:
            longest = max(len(sb[u]) for u in cands)
            want = {u for u in cands if len(sb[u]) == longest}
            assert members[m.coord_Vt[w]] == want and m.phi_Vt[w] == min(want), w
    assert set(m.coord_Vt[m.coord_Vt >= 0].tolist()) == set(range(m.num_coords))  # U = image
    order = m.sorted_s.tolist()
    assert sorted(order) == [u for u in range(s_tab.vocab_size) if _text(s_tab, u)]
    assert [sb[u] for u in order] == sorted(sb[u] for u in order)
    for a in range(s_tab.vocab_size):
        assert m.whitespace_Vs[a] == (_text(s_tab, a) and sb[a].isspace())
        want = _groups_brute(s_tab, t_tab, a)
        got = {}
        for g in m.a_groups[m.a_ptr[a]:m.a_ptr[a + 1]].tolist():
            ws = set(m.member_t[m.member_ptr[g]:m.member_ptr[g + 1]].tolist())
            root = min((tb[w][len(sb[a]):] for w in ws), key=len)
            got[root] = ws
            completion = {u for u in range(s_tab.vocab_size) if _text(s_tab, u)
                          and sb[u].startswith(root)}
            assert set(order[m.group_lo[g]:m.group_hi[g]]) == completion, (a, root)
        assert got == want, a


@pytest.mark.parametrize("seed", range(6))
def test_random_tables_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    Vs, Vt = 40, 60
    s_roles = np.where(rng.random(Vs) < 0.1, ROLE_EOS, ROLE_TEXT).astype(np.int8)
    t_roles = rng.choice([ROLE_TEXT] * 8 + [ROLE_EOS, ROLE_CHAT], size=Vt).astype(np.int8)
    s_tab = random_table(rng, Vs, alphabet=b"ab \n\x00\xff", max_len=3, roles=s_roles)
    t_tab = random_table(rng, Vt, alphabet=b"ab \n\x00\xffc", max_len=6, roles=t_roles)
    s_tab, t_tab = _roles_have_no_bytes(s_tab), _roles_have_no_bytes(t_tab)
    m = build_byteprefix_map(s_tab, t_tab)
    s_stop = np.flatnonzero(s_tab.roles_V == ROLE_EOS).tolist()
    t_stop = np.flatnonzero(t_tab.roles_V == ROLE_EOS).tolist()
    _check_against_brute_force(m, s_tab, t_tab, s_stop, t_stop)
    assert m.num_groups > 0 and (m.group_lo == m.group_hi).any()    # the cases are exercised
    # explicit stop ids (one per side) instead of every eos-role token
    if s_stop and t_stop:
        m2 = build_byteprefix_map(s_tab, t_tab, student_stop_ids=s_stop[-1:],
                                  teacher_stop_ids=t_stop[:1])
        _check_against_brute_force(m2, s_tab, t_tab, s_stop[-1:], t_stop[:1])


def _roles_have_no_bytes(table):
    pieces = [b"" if table.roles_V[i] != ROLE_TEXT else table.token_bytes(i)
              for i in range(table.vocab_size)]
    return TokenByteTable.from_bytes_list(pieces, roles=table.roles_V)


def test_no_stop_on_one_side_and_bad_stop_ids():
    s = TokenByteTable.from_bytes_list([b"a", b"ab"])
    t = TokenByteTable.from_bytes_list([b"abc", b""], roles=[ROLE_TEXT, ROLE_EOS])
    m = build_byteprefix_map(s, t)
    assert m.stop_coord == -1 and m.phi_Vt.tolist() == [1, -1]
    with pytest.raises(ValueError, match="text token"):
        build_byteprefix_map(s, t, student_stop_ids=[0])
    with pytest.raises(ValueError, match="outside"):
        build_byteprefix_map(s, t, teacher_stop_ids=[7])


PAIRS = [("gpt2", "qwen2"), ("qwen2", "gpt2"), ("gpt2", "mistral"), ("mistral", "gpt2")]
_MAPS: dict = {}


@pytest.fixture(scope="module", params=PAIRS, ids=lambda p: f"{p[0]}<-{p[1]}")
def real(request, get_tokenizer):
    s, t = (get_tokenizer(n) for n in request.param)
    if request.param not in _MAPS:
        t0 = time.perf_counter()
        m = build_byteprefix_map(s, t)
        _MAPS[request.param] = (m, time.perf_counter() - t0)
    m, seconds = _MAPS[request.param]
    return s, t, m, seconds


def _id(tok, data: bytes) -> int:
    b = _bytes(tok.table)
    return max(i for i in _text_ids(tok.table) if b[i] == data)


def test_real_pair_structure(real):
    s, t, m, seconds = real
    summary = m.summary(t.table)
    print(f"{s.name} <- {t.name}: {seconds:.2f} s, {summary}")
    assert seconds < 30
    assert summary["teacher_text_coverage"] >= 0.999   # byte tokens on every student side here
    rng = np.random.default_rng(0)
    sb, tb = _bytes(s.table), _bytes(t.table)
    s_text = [sb[u] for u in _text_ids(s.table)]
    for w in rng.choice(np.flatnonzero((t.table.roles_V == ROLE_TEXT) & (t.table.lengths_V > 0)),
                        size=30, replace=False).tolist():
        longest = max((len(u) for u in s_text if tb[w].startswith(u)), default=0)
        assert len(sb[m.phi_Vt[w]]) == longest and tb[w].startswith(sb[m.phi_Vt[w]])
    for name in ("eos_id",):
        tid = getattr(t, name)
        assert m.coord_Vt[tid] == m.stop_coord >= 0
    a = _id(s, b" the")
    got = {frozenset(m.member_t[m.member_ptr[g]:m.member_ptr[g + 1]].tolist())
           for g in m.a_groups[m.a_ptr[a]:m.a_ptr[a + 1]].tolist()}
    assert got == {frozenset(v) for v in _groups_brute(s.table, t.table, a).values()}


def test_hand_picked_tokens(get_tokenizer):
    gpt2, qwen2, mistral = (get_tokenizer(n) for n in ("gpt2", "qwen2", "mistral"))
    m = _MAPS.get(("gpt2", "qwen2"), (None,))[0] or build_byteprefix_map(gpt2, qwen2)
    assert m.phi_Vt[_id(qwen2, b" the")] == 262                      # " the" -> " the"
    assert m.phi_Vt[_id(qwen2, b"7")] == _id(gpt2, b"7")               # qwen2 splits digits
    assert m.phi_Vt[151643] == m.phi_Vt[151645] == 50256              # EOS, <|im_end|> -> EOS
    assert m.phi_Vt[151644] == -1                                      # <|im_start|>: bot
    m = _MAPS.get(("qwen2", "gpt2"), (None,))[0] or build_byteprefix_map(qwen2, gpt2)
    assert m.phi_Vt[13130] == _id(qwen2, b" ")                         # gpt2 " 2019" -> " "
    assert m.phi_Vt[_id(gpt2, b"2019")] == _id(qwen2, b"2")            # multi-digit -> "2"
    stop = m.coord_members[m.coord_ptr[m.stop_coord]:m.coord_ptr[m.stop_coord + 1]]
    assert m.phi_Vt[50256] == 151643 and set(stop.tolist()) == {151643, 151645}
    m = _MAPS.get(("gpt2", "mistral"), (None,))[0] or build_byteprefix_map(gpt2, mistral)
    assert m.phi_Vt[272] == 262                                        # "▁the" -> " the"
    assert m.phi_Vt[13] == _id(gpt2, b"\n")                            # <0x0A> -> "\n"
    assert m.phi_Vt[2] == 50256 and m.phi_Vt[1] == -1 and m.phi_Vt[0] == -1  # </s>, <s>, <unk>
    m = _MAPS.get(("mistral", "gpt2"), (None,))[0] or build_byteprefix_map(mistral, gpt2)
    k = m.coord_Vt[_id(gpt2, b" ")]                                    # "▁" and <0x20> pooled
    assert set(m.coord_members[m.coord_ptr[k]:m.coord_ptr[k + 1]].tolist()) == {35, 28705}
    assert m.phi_Vt[262] == 272 and m.whitespace_Vs[28705] and not m.whitespace_Vs[272]
