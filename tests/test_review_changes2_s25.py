"""Review s25, second pass (today's later changes): each test demonstrates a defect and FAILS on
the reviewed code."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from xdistill.config import from_dict
from xdistill.errors import ConfigError


# ------------------------------------------------ 1. byte credit: token units after a phantom
def test_token_unit_prefix_after_a_straddling_teacher_token_counts_its_phantom_bytes():
    """The prompt ends in a space (``"A: "``); the student answers ``2`` ``8`` (two tokens), the
    teacher reads ``" 2"`` ``8`` (its first response token straddles the edge: one phantom
    byte). Under ``loss.byte_units: token`` the unit has two sub-units: the prefix ``2`` and
    the whole ``28``. Commit 7276b90 scores a straddling unit *given* the phantom bytes, and
    applies that denominator to every sub-unit (``dens`` gets ``range(u0, u + 1)``).

    Expected: the teacher's prefix sub-unit is ``P_T(" 2" | "A:") / P_T(" " | "A:")`` = 2/3
    here (after ``"A:"`` the teacher says ``" 2"`` 40 %, ``" 3"`` 20 %, ``"B"`` 40 %).

    Actual: ``_prefix_units`` (xdistill/rollout/bytecredit.py) gives the teacher the student's
    prefix byte count as ``limit`` (1 byte) although the teacher's content starts with the
    phantom byte, so it scores only ``" "``: ``P(" ")/P(" ")`` = 1.0, i.e. every prefix
    sub-unit after a straddling token is short by the phantom bytes (credit of the first
    student token of the answer is always 1 for the teacher)."""
    from bytecredit_reference import p_cover

    from xdistill.losses import ChunkAlignment
    from xdistill.losses.bytecredit import byte_logprob
    from xdistill.losses.onpolicy import input_token_logprobs
    from xdistill.rollout.bytecredit import build_byte_terms
    from xdistill.tokenization.table import ROLE_BOS, ROLE_EOS, ROLE_TEXT, TokenByteTable

    BOS = 0

    class Vocab:
        def __init__(self, pieces):
            self.pieces = [b"", b""] + [p.encode() for p in pieces]
            self.table = TokenByteTable.from_bytes_list(
                self.pieces, [ROLE_BOS, ROLE_EOS] + [ROLE_TEXT] * len(pieces))
            self.V = len(self.pieces)

        def id(self, piece):
            return self.pieces.index(piece.encode())

    sv = Vocab(["A", ":", " ", "2", "8", "B"])
    tv = Vocab(["A", ":", " ", "2", "8", " 2", " 3", "B"])
    a_t, colon_t, sp2_t, eight_t = tv.id("A"), tv.id(":"), tv.id(" 2"), tv.id("8")

    class LM:
        vocab = tv

        def logp(self, prefix):
            z = np.random.default_rng([1, len(prefix), *prefix]).normal(size=tv.V)
            z[BOS] = -np.inf
            if tuple(prefix) == (BOS, a_t, colon_t):
                z[1:] = -60.0
                z[sp2_t], z[tv.id(" 3")], z[tv.id("B")] = np.log([0.4, 0.2, 0.4])
            m = z[np.isfinite(z)].max()
            return z - (m + np.log(np.exp(z - m).sum()))

        def p(self, prefix):
            return np.exp(self.logp(tuple(prefix)))

    lm = LM()
    s_ids = [BOS, sv.id("A"), sv.id(":"), sv.id(" "), sv.id("2"), sv.id("8")]
    t_ids = [BOS, a_t, colon_t, sp2_t, eight_t]
    align = ChunkAlignment(torch.tensor([[-1, -1, -1, -1, 0, 0]]),
                           torch.tensor([[-1, -1, -1, 0, 0]]),
                           torch.tensor([[True]]), torch.tensor([[False]]))
    s_mask = torch.tensor([[False] * 4 + [True, True]])
    t_mask = torch.tensor([[False] * 3 + [True, True]])
    credit = build_byte_terms(sv.table, tv.table, torch.tensor([s_ids]), torch.tensor([t_ids]),
                              align, s_mask, t_mask, None, units="token",
                              t_phantom_BTt=torch.tensor([[0, 0, 0, 1, 0]]))
    z = torch.tensor(np.stack([lm.logp(tuple(t_ids[:t + 1])) for t in range(len(t_ids))]),
                     dtype=torch.float64)[None]
    lb, ub = byte_logprob(z, input_token_logprobs(z, torch.tensor([t_ids])), credit.teacher)
    ctx = (BOS, a_t, colon_t)
    den = p_cover(lm, b" ", ctx)
    ref = [p_cover(lm, b" 2", ctx) / den, p_cover(lm, b" 28", ctx) / den]
    got_lb, got_ub = lb.exp().tolist(), ub.exp().tolist()
    for k in range(2):
        assert got_lb[k] <= ref[k] * (1 + 1e-9) and ref[k] <= got_ub[k] * (1 + 1e-9), \
            (k, got_lb, ref, got_ub)


# ------------------------------------------------ 2. NaN-safe validation: the loss's other floats
@pytest.mark.parametrize("kind,key", [("alm", "alm_temperature"), ("uld", "common_weight"),
                                      ("uld", "uncommon_weight")])
def test_nan_cross_tokenizer_loss_parameters_are_refused(tmp_path, kind, key):
    """Expected: a NaN ``teachers.N.loss.alm_temperature`` / ``common_weight`` /
    ``uncommon_weight`` is a ConfigError naming the key before any compute, as today's commit
    f5e279d now does for the same section's ``weight`` and ``temperature`` (``check_loss_scale``)
    and for every on-policy float.

    Actual: ``validate_offpolicy`` / ``_validate_teacher`` (xdistill/train/config.py) never
    look at these fields (0 or negative values pass too), so the config is accepted and the
    ALM/ULD term -- hence every step -- is NaN, stopping the run after
    ``train.max_nonfinite_steps`` with a message blaming non-finite steps."""
    from xdistill.train.config import OffPolicyConfig, validate_offpolicy

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello world\n")
    model = tmp_path / "teacher-model"
    model.mkdir()
    cfg = from_dict(OffPolicyConfig, {
        "student_tokenizer": "gpt2", "data": {"paths": [str(corpus)]},
        "loss": {"ce_weight": 1.0}, "train": {"out_dir": str(tmp_path / "run")},
        "checkpoint": {"export_hf": False}, "eval": {"every": -1},
        "teachers": [{"name": "t", "worker": {"model": str(model)},
                      "loss": {"kind": kind, key: math.nan}}]})
    with pytest.raises(ConfigError, match=rf"teachers\.0\.loss.*{key}|{key}"):
        validate_offpolicy(cfg)


# ------------------------------------------------ 3. save_projection: a failed replace
def test_save_projection_onto_a_folder_is_one_projection_error_and_leaves_no_temp_files(tmp_path):
    """Expected (commit 8b7b694: ``save_projection`` "says so in one ProjectionError"): saving
    to a path that cannot be replaced (here an existing folder ``p.npz/``) is one
    ProjectionError naming the path, and the temporary ``p.npz.tmp`` / ``p.json.tmp`` written
    beside it are removed.

    Actual: only the writes of the temporary files sit in the ``try`` of
    ``save_projection`` (xdistill/projection/artifact.py); ``os.replace(tmp, path)`` raises a
    raw ``IsADirectoryError`` and both ``.tmp`` files are left behind (the same gap lets a
    failed second ``os.replace`` leave a new matrix beside the old sidecar, the state the fix
    set out to prevent)."""
    import scipy.sparse as sp

    from xdistill.errors import ProjectionError
    from xdistill.projection.artifact import Projection, save_projection

    proj = Projection(sp.csr_matrix(np.eye(2, dtype=np.float32)), np.zeros(2, np.int8), {})
    target = tmp_path / "p.npz"
    target.mkdir()
    with pytest.raises(ProjectionError, match="p.npz"):
        save_projection(proj, target)
    left = sorted(p.name for p in Path(tmp_path).iterdir() if p.name.endswith(".tmp"))
    assert not left, left
