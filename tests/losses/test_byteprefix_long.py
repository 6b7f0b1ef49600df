"""BPM/ESCD's rule for student tokens longer than the teacher's (the digit case).

Student vocabulary with ``23``, a digit-splitting teacher whose answer is ``23``. Plain BPM maps
the teacher's ``2`` (every number starting with 2) to the student's ``2`` and leaves ``23`` in the
residual: its gradient pushes ``23`` down, the student re-spells the answer digit by digit. With
the rule the teacher mass of "``2`` then ``3``" is the target of ``23``: float64 reference from the
definition, the gradient's sign on ``23``, gradcheck, and a teacher with the student's own
vocabulary (no entries: the self-teacher stays at zero).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from xdistill.losses import BytePrefixTables, ChunkAlignment, bpm, escd
from xdistill.projection.byteprefix import build_byteprefix_map
from xdistill.rollout.bytecredit import build_long_token_tables
from xdistill.tokenization.table import ROLE_EOS, ROLE_TEXT, TokenByteTable

S_PIECES = [b"Q", b"2", b"3", b"23", b"24", b".", b"x", b""]   # 'x': in the residual
T_PIECES = [b"Q", b"2", b"3", b"4", b".", b""]


def _table(pieces):
    roles = [ROLE_TEXT] * (len(pieces) - 1) + [ROLE_EOS]
    return TokenByteTable.from_bytes_list(pieces, roles)


S_TAB, T_TAB = _table(S_PIECES), _table(T_PIECES)
TABLES = BytePrefixTables.from_map(build_byteprefix_map(S_TAB, T_TAB))
LONG = build_long_token_tables(S_TAB, T_TAB)
s_id = {p: i for i, p in enumerate(S_PIECES)}
t_id = {p: i for i, p in enumerate(T_PIECES)}


def _case(student_root, seed=0):
    """Text 'Q' + '23.': student Q|23|. , teacher Q|2|3|. ; chunks 23 <-> 2 3 and . <-> ."""
    s_ids = torch.tensor([[s_id[b"Q"], s_id[b"23"], s_id[b"."]]])
    t_ids = torch.tensor([[t_id[b"Q"], t_id[b"2"], t_id[b"3"], t_id[b"."]]])
    align = ChunkAlignment(torch.tensor([[-1, 0, 1]]), torch.tensor([[-1, 0, 0, 1]]),
                           torch.ones(1, 2, dtype=torch.bool), torch.tensor([[False, True]]))
    g = torch.Generator().manual_seed(seed)
    zt = torch.randn(1, 4, len(T_PIECES), generator=g, dtype=torch.float64)
    zt[0, 0, t_id[b"2"]] = 6.0                   # the answer starts with 2 ...
    zt[0, 1, t_id[b"3"]] = 5.0                   # ... and continues with 3
    zs = torch.randn(1, 3, len(S_PIECES), generator=g, dtype=torch.float64)
    for piece, val in student_root.items():
        zs[0, 0, s_id[piece]] = val
    return zs, zt, align, s_ids, t_ids


def _ref_root(zs, zt, rule: bool) -> float:
    """tau = 1 root KL at the first unit from the definition (coordinates by hand)."""
    p0 = torch.softmax(zt[0, 0], -1).numpy()
    p1 = torch.softmax(zt[0, 1], -1).numpy()
    q = torch.softmax(zs[0, 0], -1).numpy()
    # BPM's map: teacher 2 -> student 2, 3 -> 3, . -> ., Q -> Q, EOS -> the student's EOS (the
    # stop coordinate), 4 -> bot (no student token is a prefix of '4')
    pbar = {"Q": p0[t_id[b"Q"]], "2": p0[t_id[b"2"]], "3": p0[t_id[b"3"]], ".": p0[t_id[b"."]],
            "stop": p0[t_id[b""]], "bot": p0[t_id[b"4"]]}
    qbar = {"Q": q[s_id[b"Q"]], "2": q[s_id[b"2"]], "3": q[s_id[b"3"]], ".": q[s_id[b"."]],
            "stop": q[s_id[b""]]}
    extra = []
    if rule:   # "2" followed by "3" -> 23, by "4" -> 24 (both longer than any teacher token)
        for piece, nxt in ((b"23", b"3"), (b"24", b"4")):
            m = p0[t_id[b"2"]] * p1[t_id[nxt]]
            pbar["2"] -= m
            extra.append((m, q[s_id[piece]]))
        qbar["bot"] = q[s_id[b"x"]]
    else:
        qbar["bot"] = q[s_id[b"23"]] + q[s_id[b"24"]] + q[s_id[b"x"]]
    kl = sum(pbar[k] * math.log(pbar[k] / qbar[k]) for k in pbar if pbar[k] > 0)
    return kl + sum(m * math.log(m / qq) for m, qq in extra)


def _root_loss(zs, zt, align, s_ids, t_ids, rule: bool):
    mask = torch.tensor([[True, True, False]])        # the first unit only
    kw = dict(long=LONG, teacher_ids_BTt=t_ids) if rule else {}
    return bpm(zs, zt, align, TABLES, s_ids, s_loss_mask_BTs=mask, **kw)[0]


def test_tables_hold_the_long_student_tokens():
    w = t_id[b"2"]
    lo, hi = int(LONG.w_ptr[w]), int(LONG.w_ptr[w + 1])
    assert sorted(S_PIECES[int(v)] for v in LONG.v_X[lo:hi]) == [b"23", b"24"]
    assert int(LONG.w_ptr[-1]) == 2                   # only the teacher's '2' has entries


@pytest.mark.parametrize("rule", [False, True])
def test_root_matches_the_definition(rule):
    zs, zt, align, s_ids, t_ids = _case({b"2": 2.0, b"23": 2.0})
    got = float(_root_loss(zs, zt, align, s_ids, t_ids, rule))
    assert got == pytest.approx(_ref_root(zs, zt, rule), rel=1e-10)


def test_digit_case_the_rule_pulls_23_up_plain_bpm_pushes_it_down():
    zs, zt, align, s_ids, t_ids = _case({b"2": 3.0, b"23": 3.0})
    for rule, sign in ((False, 1.0), (True, -1.0)):
        z = zs.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(_root_loss(z, zt, align, s_ids, t_ids, rule), z)
        assert sign * float(g[0, 0, s_id[b"23"]]) > 0, rule
    # and the loss prefers a student answering 23 over one re-spelling 2 | 3 only with the rule
    two = _case({b"2": 6.0, b"23": 0.0})
    twenty3 = _case({b"2": 0.0, b"23": 6.0})
    assert float(_root_loss(*twenty3, True)) < float(_root_loss(*two, True))
    assert float(_root_loss(*twenty3, False)) > float(_root_loss(*two, False))


def test_gradcheck_with_the_rule_bpm_and_escd():
    zs, zt, align, s_ids, t_ids = _case({b"2": 1.0, b"23": 1.0}, seed=3)
    mask = torch.ones(1, 3, dtype=torch.bool)
    for fn in (bpm, escd):
        def f(z, fn=fn):
            return fn(z, zt, align, TABLES, s_ids, s_loss_mask_BTs=mask, long=LONG,
                      teacher_ids_BTt=t_ids, temperature=1.3)[0]
        assert torch.autograd.gradcheck(f, (zs.clone().requires_grad_(True),))


def test_same_vocabulary_gets_no_entries():
    tables = build_long_token_tables(S_TAB, S_TAB)
    assert tables.v_X.numel() == 0 and int(tables.w_ptr[-1]) == 0
    assert np.all(tables.w_ptr.numpy() == 0)
