"""TeacherPool bookkeeping with in-process test engines (fast): routing by name, failure of one
teacher releases the others' slots, bad names.

Legend: B batch, Tt teacher tokens.
"""

from __future__ import annotations

import functools

import pytest
import torch

from teacher_fakes import StampEngine
from xdistill.data.batch import DistillBatch, TeacherView
from xdistill.errors import TeacherError
from xdistill.teacher import TeacherConfig, TeacherPool


def _view(name, B=2, Tt=3, fill=1):
    ids = torch.full((B, Tt), fill)
    m = torch.ones(B, Tt, dtype=torch.bool)
    return TeacherView(name=name, input_ids_BTt=ids, attention_mask_BTt=m, loss_mask_BTt=m,
                       s_chunk_BTs=ids, t_chunk_BTt=ids, chunk_valid_BC=m, chunk_exact_BC=m)


def _pool(raise_b_on=-1):
    cfgs = [TeacherConfig(name="a", slots=1), TeacherConfig(name="b", slots=1)]
    factories = {"a": functools.partial(StampEngine, "a", 8, 0.0),
                 "b": functools.partial(StampEngine, "b", 8, 0.0, raise_b_on)}
    return TeacherPool(cfgs, engine_factories=factories)


def test_pool_routes_views_by_name_and_releases_slots():
    with _pool() as pool:
        batch = DistillBatch(input_ids_BTs=torch.zeros(2, 3), attention_mask_BTs=torch.zeros(2, 3),
                             labels_BTs=torch.zeros(2, 3), loss_mask_BTs=torch.zeros(2, 3),
                             teachers=(_view("a", fill=4), _view("b", Tt=5, fill=9)))
        for step in range(3):  # slots=1: works only if every step released its slot
            with pool.forward(batch) as outs:
                assert set(outs) == {"a", "b"}
                assert outs["a"].logits_BTtV.shape == (2, 3, 8)
                assert outs["b"].logits_BTtV.shape == (2, 5, 8)
                assert torch.all(outs["b"].logits_BTtV[..., 0] == 9 + step)
        with pool.forward([_view("b")]) as outs:  # a subset of teachers
            assert list(outs) == ["b"]
        with pytest.raises(TeacherError, match=r"unknown teachers \['c'\]"):
            pool.forward([_view("c")])


def test_one_failing_teacher_releases_the_others():
    with _pool(raise_b_on=1) as pool:
        pool.forward([_view("a"), _view("b")]).release()
        with pytest.raises(TeacherError, match="boom from worker at step 1"):
            pool.forward([_view("a"), _view("b")])
        with pool.forward([_view("a"), _view("b")]) as outs:  # a's only slot is free again
            assert outs["a"].step == 2 and outs["b"].step == 2


def test_duplicate_names_rejected():
    with pytest.raises(TeacherError, match="unique"):
        TeacherPool([TeacherConfig(name="x"), TeacherConfig(name="x")])
