"""The continuation protocol (toyq/continued.py): every on-policy kind and the two
off-policy continuations start from the CE run of the same seed, run through the real trainers
and are reported against continued CE."""

from __future__ import annotations

import pytest

import json
import shutil
from dataclasses import replace

from quality_helpers import TINY_ARMS

from toyq.continued import (BUDGET_BASE, BYTE_CLIP, CONT_ARMS, ONPOLICY_KIND, SAME_ARMS,
                            SAME_BUDGET_BASE, TEACHER_SUFFIXES, TWIN_ARMS, budget_arm,
                            ce_checkpoint, cont_config, k1_teacher, teacher_suffix, twin_path)


pytestmark = pytest.mark.integration  # starts processes

def test_every_continuation_arm_config_is_valid(assets, tmp_path):
    from xdistill.config import load_config
    from toyq.arms import arm_command
    from toyq.runner import write_config
    from xdistill.train.config import OffPolicyConfig, validate_offpolicy
    from xdistill.train.onpolicy_config import OnPolicyConfig, validate_onpolicy

    ce = tmp_path / "runs" / "ce" / "seed0" / "export"
    ce.mkdir(parents=True)   # the path only has to exist for validation
    # the control teachers are not prepared here: any model over the right tokenizer validates;
    # the second teachers are copies in other folders, so that the arms' choice shows
    def copy(name: str) -> dict:
        dst = tmp_path / f"{name}_copy{len(list(tmp_path.glob(f'{name}_copy*')))}"
        shutil.copytree(assets[name]["model"], dst)
        return {**assets[name], "model": str(dst)}

    assets = {**assets, "teacher_same_big": assets["teacher_weak"],
              **{f"teacher_same_big{t}": copy("teacher_weak") for t in TEACHER_SUFFIXES},
              **{f"teacher_big{t}": copy("teacher_big") for t in TEACHER_SUFFIXES},
              **{f"teacher_big_s750{t}": copy("teacher_big") for t in ("", "_t3")},
              "teacher_same_big_s750_t2": copy("teacher_weak")}
    budget = (budget_arm(750), budget_arm(750, "_t3"),      # teachers of another budget
              budget_arm(750, "_t2", SAME_BUDGET_BASE))
    for arm in (*CONT_ARMS, *budget):
        out = tmp_path / "runs" / arm / "seed0"
        d = cont_config(arm, 0, assets, TINY_ARMS, str(out))
        assert d["student"] == {"path": str(ce), "param_dtype": "float32"}
        assert ce_checkpoint(str(out), 0) == ce
        path = write_config(d, tmp_path / f"{arm}.yaml")
        if arm_command(arm) == "onpolicy":
            cfg = validate_onpolicy(load_config(OnPolicyConfig, str(path)))
            assert cfg.teachers[0].loss.kind == ONPOLICY_KIND[BUDGET_BASE if arm in budget
                                                              else arm]
            flags = arm.split("_")[2:]
            assert cfg.loss.advantage_baseline == ("token_mean" if "tmean" in flags else
                                                   "clipped_mean" if "cmean" in flags else
                                                   "mean" if "mean" in flags else "none")
            assert cfg.loss.credit == ("byte" if "byte" in flags else "token")
            assert cfg.loss.byte_units == ("token" if "tok" in flags else "chunk")
            assert cfg.loss.loss_max == (BYTE_CLIP if "clip" in flags else 10.0)
            assert cfg.loss.logp_min is None       # no log-prob floor (issue 24)
            same = arm in SAME_ARMS or arm == budget[2]
            assert (cfg.teachers[0].tokenizer == assets["tok_student"]) == same
            teacher = "teacher_same_big" if arm in TWIN_ARMS else k1_teacher(arm)
            assert arm not in budget or teacher == (
                f"teacher_{'same_' if same else ''}big_s750{teacher_suffix(arm)}")
            assert cfg.teachers[0].worker.model == assets[teacher]["model"], arm
            if arm in TWIN_ARMS:
                assert cfg.teachers[0].tokenizer == twin_path(assets)
        else:
            cfg = validate_offpolicy(load_config(OffPolicyConfig, str(path)))
            # the headroom check reads every training answer: the teachers' corpus
            corpus = assets["corpus"]["teacher" if arm == "cont_ce_oracle" else "student"]
            assert list(cfg.data.paths) == [corpus], arm
        assert cfg.train.steps == TINY_ARMS.cont_steps


def test_continuation_protocol_end_to_end(assets, tmp_path):
    from toyq.report import render
    from toyq.run import run_phases
    from toyq.runner import Watch

    s = replace(TINY_ARMS, cont_steps=2, eval_every=0)
    arms = ["cont_ce", "op_dpca", "op_escd", "op_k1_byte", "op_k1_same",
            "op_k1_twin_byte_mean_clip", "op_k1_byte_tok_mean_clip"]
    # the control teacher stands in as the prepared weak one (any model over the student's
    # tokenizer; prepare_all trains the real one when an arm asks for it)
    assets = {**assets, "teacher_same_big": assets["teacher_weak"]}
    result = run_phases(assets, arms, [0], s, tmp_path, 2, Watch())
    assert not result["failed"] and set(result["summary"]) == set(arms)  # ce ran, not reported
    assert (tmp_path / "runs" / "ce" / "seed0" / "score.json").exists()
    for arm in arms:
        cfg = (tmp_path / "runs" / arm / "seed0" / "config.yaml").read_text()
        assert str(tmp_path / "runs" / "ce" / "seed0" / "export") in cfg
        lines = (tmp_path / "runs" / arm / "seed0" / "metrics.jsonl").read_text().splitlines()
        last = [json.loads(x) for x in lines if '"loss"' in x][-1]
        assert last["step"] == 2 and last["forward_tokens"] > 0
        # byte credit ran where asked across tokenizers (the twin included), never otherwise
        assert ("credit_gap" in " ".join(last)) == (arm in (
            "op_k1_byte", "op_k1_twin_byte_mean_clip", "op_k1_byte_tok_mean_clip")), arm
    text = render(result, {})
    assert "On-policy kinds by held-out accuracy" in text and "vs cont_ce" in text


def test_the_twin_tokenizer_tokenizes_alike_and_is_another_tokenizer(assets, tmp_path):
    """The ninth protocol's twin: every task text and more encode to the same ids and byte spans
    as with the student's tokenizer, decoding agrees, the fingerprint differs, so a teacher
    presented with it is planned as a cross-tokenizer teacher (the byte credit applies)."""
    from pathlib import Path

    from toyq import task
    from toyq.toks import twin_tokenizer
    from xdistill.tokenization import load_tokenizer
    from xdistill.train.teacher_plan import plan_teacher

    src = Path(assets["tok_student"])
    twin = twin_tokenizer(src, tmp_path / "twin")
    assert twin_tokenizer(src, tmp_path / "twin") == twin           # written once
    # runs started together write it at the same time (the harness runs two jobs at once)
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(4) as pool:
        made = list(pool.map(lambda _: twin_tokenizer(src, tmp_path / "race"), range(8)))
    assert set(made) == {tmp_path / "race"} and sorted(p.name for p in tmp_path.iterdir()) == [
        "race", "twin"]
    assert (tmp_path / "race" / "tokenizer.json").read_bytes() == \
        (twin / "tokenizer.json").read_bytes()
    a, b = load_tokenizer(str(src)), load_tokenizer(str(twin))
    assert a.fingerprint != b.fingerprint and a.vocab_size == b.vocab_size
    texts = [task.problem(x, y) + f" {x + y}.\n" for x, y in [(1, 2), (12, 7), (99, 1), (5, 500)]]
    texts += [" hello  world\n\n", "ünïcode ☃ 42", "Q: 3+4=? A: 7.<|eos|>", ""]
    for text in texts:
        ea, eb = a.encode(text), b.encode(text)
        assert (ea.ids == eb.ids).all() and (ea.starts == eb.starts).all()
        assert (ea.ends == eb.ends).all() and a.decode(ea.ids) == b.decode(eb.ids)

    class T:   # the fields plan_teacher reads of a teacher config
        name, tokenizer, max_len, add_bos = "twin", str(twin), 0, False

        class worker:
            model = assets["teacher_weak"]["model"]

    assert plan_teacher(T, 0, a).same_tokenizer is False

