"""The per-teacher plan both training modes share (xdistill.train.teacher_plan): errors name the
config key, the same-tokenizer flag, projections refused for another tokenizer pair, the shared
vocabulary; the on-policy run's mixed-in off-policy loss planned like an off-policy run's; the
off-policy micro-batch stream hands out the micro-batch it is given."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import onpolicy_helpers as H  # pytest puts this test's folder on sys.path
import pytest
import torch

from xdistill.errors import ConfigError
from xdistill.tokenization import load_tokenizer
from xdistill.train.teacher_plan import (DistillPlan, load_student_tokenizer, load_tokenizer_for,
                                         plan_teacher, with_projection, with_shared)


def _teacher(name="t", tokenizer="", model="", max_len=None, add_bos=None):
    return SimpleNamespace(name=name, tokenizer=tokenizer, max_len=max_len, add_bos=add_bos,
                           worker=SimpleNamespace(model=model))


def test_tokenizer_errors_name_the_config_key(tmp_path, tiny_assets):
    student = load_tokenizer(tiny_assets["tok_s"])
    with pytest.raises(ConfigError, match=r"^teachers\.2\.tokenizer: no tokenizer given"):
        load_tokenizer_for("", "", "teachers.2.tokenizer")
    with pytest.raises(ConfigError, match=r"^student_tokenizer: no tokenizer given"):
        load_student_tokenizer(SimpleNamespace(student_tokenizer="",
                                               student=SimpleNamespace(path="")))
    empty = tmp_path / "no_tokenizer_here"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"^teachers\.1\.tokenizer: cannot load tokenizer "
                                          r"'.*no_tokenizer_here'"):
        plan_teacher(_teacher(tokenizer=str(empty)), 1, student)
    # no tokenizer given: the worker's model folder supplies it
    assert plan_teacher(_teacher(model=tiny_assets["same"]), 0, student).same_tokenizer


def test_same_tokenizer_flag_and_tokenizations(tiny_assets):
    student = load_tokenizer(tiny_assets["tok_s"])
    same = plan_teacher(_teacher("same", tiny_assets["tok_s"], max_len=7), 0, student)
    cross = plan_teacher(_teacher("cross", tiny_assets["tok_t"]), 1, student)
    assert same.same_tokenizer and not cross.same_tokenizer
    assert (same.key, cross.key) == ("teachers.0", "teachers.1")
    assert same.projection is None and same.shared is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        same.add_bos = True
    plan = DistillPlan(student, {"same": same, "cross": cross})
    assert plan.tokenizer_keys() == {"same": "teachers.0.tokenizer",
                                     "cross": "teachers.1.tokenizer"}
    assert plan.tokenizers() == {"same": same.tokenizer, "cross": cross.tokenizer}
    views = plan.tokenizations()
    assert [v.name for v in views] == ["same", "cross"]
    assert (views[0].max_len, views[0].add_bos, views[0].tokenizer) == (7, same.add_bos,
                                                                        same.tokenizer)


def test_projection_loaded_for_its_pair_and_refused_for_another(tiny_assets):
    s, t = load_tokenizer(tiny_assets["tok_s"]), load_tokenizer(tiny_assets["tok_t"])
    tp = plan_teacher(_teacher("cross", tiny_assets["tok_t"]), 0, s)
    with pytest.raises(ConfigError, match=r"^teachers\.0\.loss\.projection: needed by X$"):
        with_projection(tp, "", s, "needed by X")
    got = with_projection(tp, tiny_assets["proj"], s, "needed by X")
    assert tp.projection is None and got.projection.layout == torch.sparse_csr
    assert got.projection.shape[0] >= s.vocab_size and got.projection.shape[1] >= t.vocab_size
    assert with_projection(got, "", s, "needed by X") is got      # planned once, then reused
    swapped = plan_teacher(_teacher("swapped", tiny_assets["tok_s"]), 3, t)
    with pytest.raises(ConfigError, match=r"^teachers\.3\.loss\.projection: .*was built for"):
        with_projection(swapped, tiny_assets["proj"], t, "needed by X")


def test_shared_vocabulary_and_its_error(tiny_assets, monkeypatch):
    s, t = load_tokenizer(tiny_assets["tok_s"]), load_tokenizer(tiny_assets["tok_t"])
    tp = plan_teacher(_teacher("cross", tiny_assets["tok_t"]), 0, s)
    s_N, t_N = with_shared(tp, s, "loss 'exact_kl' works on the shared vocabulary").shared
    assert 0 < s_N.numel() == t_N.numel() and len(set(t_N.tolist())) == t_N.numel()
    assert all(s.table.token_bytes(int(a)) == t.table.token_bytes(int(b))
               for a, b in zip(s_N.tolist(), t_N.tolist()))
    import xdistill.train.teacher_plan as tpm

    empty = torch.zeros(0, dtype=torch.int64)
    monkeypatch.setattr(tpm, "shared_vocab", lambda student, teacher: (empty, empty))
    with pytest.raises(ConfigError, match=r"^teachers\.0: loss 'jsd' needs it, but no token has "
                                          r"identical bytes in .*; use loss.cross = projection$"):
        with_shared(tp, s, "loss 'jsd' needs it", "use loss.cross = projection")


def _mix_config(assets, tmp_path, **cross_loss):
    from xdistill.config import from_dict
    from xdistill.train.onpolicy_config import OnPolicyConfig

    teachers = [H.teacher("same", assets["tok_s"], assets["same"], "k3"),
                H.teacher("cross", assets["tok_t"], assets["cross"], "reverse_kl",
                          projection=assets["proj"], **cross_loss)]
    d = H.onpolicy_dict(assets["tok_s"], teachers, H.write_prompts(tmp_path / "p.jsonl"),
                        tmp_path / "out")
    d["loss"]["offpolicy_lambda"] = 0.5
    d["offpolicy"] = {"data": {"paths": [assets["train"]], "seq_len": 32, "batch_size": 2,
                               "num_workers": 0}, "ce_weight": 0.1}
    return from_dict(OnPolicyConfig, d)


def test_mixed_in_loss_is_planned_like_an_offpolicy_run(tiny_assets, tmp_path):
    """The on-policy plan carries the mixed-in batches' off-policy specs (derived kinds, the
    on-policy plan's projection reused); a bad pairing fails at plan time, naming the key."""
    from xdistill.train.onpolicy_step import build_onpolicy_plan

    cfg = _mix_config(tiny_assets, tmp_path)
    plan = build_onpolicy_plan(cfg)
    same, cross = plan.mix_specs
    assert (same.name, same.loss, cross.name, cross.loss) == ("same", "forward_kl", "cross", "pkl")
    assert cross.direction == "reverse" and cross.projection is plan.teachers["cross"].projection
    assert isinstance(cfg.offpolicy.data.add_bos, bool)
    cfg.loss.offpolicy_lambda = 0.0
    assert build_onpolicy_plan(cfg).mix_specs == []
    bad = _mix_config(tiny_assets, tmp_path, offpolicy_kind="forward_kl")
    with pytest.raises(ConfigError, match=r"^teachers\.1\.loss\.kind: 'forward_kl' needs the "
                                          "student's tokenizer"):
        build_onpolicy_plan(bad)


def test_stream_consumes_the_micro_batch_it_is_given():
    from xdistill.train.pipeline import MicroBatchStream

    class Loader:
        def state_dict(self):
            return {}

    stream = MicroBatchStream([iter(range(100))], [Loader()], accum=2)
    first, second = stream.peek_step(1)
    assert (first.batch, second.batch) == (0, 1)
    with pytest.raises(RuntimeError, match="out of order"):
        stream.consume(second)
    assert stream.consume(first) is first and stream.consume(second) is second
    assert [m.batch for m in stream.peek_step(2)] == [2, 3]
