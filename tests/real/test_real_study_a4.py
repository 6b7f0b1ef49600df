"""Amendment 4 of the real study (``benchmarks/real/study.py``, ``teachers.py``; PROTOCOL.md):
the amendment's settings, the cosine teacher candidates and their rule, the rebuilt candidate, and
the on-policy rate chosen by the teacher's bits per byte on validation samples with degenerate
rates excluded. Fast: the trainer is replaced by stand-ins (``test_real_study.py``, slow, runs
the real stages)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from real_helpers import REAL_SCRIPTS, load_real_script


@pytest.fixture(scope="module")
def study():
    """The script, its siblings importable as when it runs (its folder first on the path)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(REAL_SCRIPTS))
        yield load_real_script("study")


def test_amendment_4_is_the_default_with_fresh_seeds_and_bfloat16(study):
    a4, a2 = study.parse([]), study.parse(["--scheme", "blocks"])
    assert (a4.scheme, a4.out, a4.records) == ("blocks4", Path("runs/real_a4"),
                                               REAL_SCRIPTS / "evidence" / "a4")
    assert (a2.out, a2.records) == (Path("runs/real_a2"), REAL_SCRIPTS / "evidence" / "a2")
    assert a4.confirm_seeds == (110, 111, 112, 113, 114)
    used = {*a2.confirm_seeds, *a2.tune_seeds, 2}          # dtype_bpb.py ran seeds 0-2
    assert not used & set(a4.confirm_seeds)
    assert a4.amendment.auto_dtype == "bfloat16" and a2.amendment.auto_dtype == "float32"
    assert a4.candidates == ((3e-5, 240), (1e-4, 240), (3e-5, 480), (1e-4, 480))
    assert study.needs(a4, "op_lr") == ("ce_lr", "teacher", "pkl_lr")
    assert study.needs(a2, "op_lr") == ("ce_lr", "teacher")
    smoke = study.parse(["--smoke", "--out", "/tmp/x"])
    assert smoke.confirm_seeds == (110,) and max(s for _, s in smoke.candidates) == 2


def _args(tmp_path: Path, study) -> SimpleNamespace:
    base = study.parse(["--out", str(tmp_path / "runs")])
    base.records = tmp_path / "records"
    return base


def test_each_candidate_is_one_cosine_adaptation_and_the_best_is_the_teacher(study, tmp_path,
                                                                             monkeypatch):
    args, jobs = _args(tmp_path, study), []
    scores = {(3e-5, 240): 1.56, (1e-4, 240): 1.52, (3e-5, 480): 1.53, (1e-4, 480): 1.52}

    def fake_stream(cmd, log, label, steps):
        job = json.loads(Path(cmd[-1]).read_text())
        jobs.append(job)
        lr, (step,) = job["cfg"]["optim"]["lr"], job["checks"]
        out = Path(job["out"])
        (out / "adapted.json").write_text(json.dumps({
            "digest": study.distill._digest(job),
            "checks": [{"step": step, "bpb": scores[(lr, step)], "model": str(out / f"step{step}")}]}))

    monkeypatch.setattr(study.distill, "stream", fake_stream)
    state = {"ce_lr": {"valid_bpb": 1.679}}
    teacher = study.teachers.stage(args, state, {"valid": {"paths": []}}, {"domain": "d"}, "cosine")
    for job, (lr, steps) in zip(jobs, args.candidates):
        assert job["cfg"]["optim"]["lr"] == lr and job["cfg"]["train"]["steps"] == steps
        assert job["cfg"]["scheduler"] == {"kind": "cosine", "warmup_steps": 10,
                                           "min_lr_ratio": 0.0}   # decays to zero at its end
        assert job["checks"] == [steps]
        assert job["out"] == str(args.out / "teacher_a4" / f"lr{lr:g}_s{steps}")
    # 1.52 twice: fewer steps first; the lead 0.159 meets the 0.15 goal
    assert (teacher["chosen"]["lr"], teacher["chosen"]["step"]) == (1e-4, 240)
    assert teacher["met"] and teacher["lead"] == pytest.approx(0.159)
    assert teacher["rule"] == "cosine" and len(teacher["checks"]) == 4
    assert study.teachers.cosine_schedule(1e-4, 1)["warmup_steps"] == 1   # the plumbing check
    jobs.clear()
    study.teachers.stage(args, state, {"valid": {"paths": []}}, {"domain": "d"}, "cosine")
    assert jobs == []                                       # every candidate cached
    pick, met = study.teachers.pick_cosine([{"bpb": 1.6, "step": 240, "lr": 3e-5}], 1.529)
    assert not met and pick["bpb"] == 1.6                   # a shortfall is reported, not fatal


def test_a_lost_cosine_teacher_is_its_candidate_run_again(study, tmp_path, monkeypatch):
    args, calls = _args(tmp_path, study), []
    model = str(args.out / "teacher_a4" / "lr0.0001_s240" / "step240")
    state = {"teacher": {"rule": "cosine", "chosen": {"step": 240, "lr": 1e-4, "bpb": 1.52,
                                                      "model": model}}}

    def fake_adapt(args_, ev, data, checks, stop_bpb=None, name="adapted", schedule=None,
                   folder="teacher_v2"):
        calls.append((list(checks), name, schedule, folder))
        return [{"step": 240, "bpb": 1.5205, "model": str(args.out / folder / "step240")}]

    monkeypatch.setattr(study.teachers, "adapt", fake_adapt)
    study.teachers.ensure(args, state, {}, {})
    assert calls == [([240], "rebuilt", study.teachers.cosine_schedule(1e-4, 240),
                      "teacher_a4/lr0.0001_s240")]
    state["teacher"]["chosen"]["bpb"] = 1.50                # the rebuilt one scores otherwise
    with pytest.raises(SystemExit, match="not the same teacher"):
        study.teachers.ensure(args, state, {}, {})


def _table(rows: dict) -> dict:
    return {f"{lr:g}": {"teacher_bpb_on_samples": t, "repetition": r, "mean": 2.0}
            for lr, (t, r) in rows.items()}


def test_the_on_policy_rate_is_the_teachers_best_among_rates_that_do_not_degenerate(study):
    assert study.degeneration_line(0.004) == study.REPETITION_FLOOR == 0.02
    assert study.degeneration_line(0.03) == pytest.approx(0.06)
    table = _table({3e-5: (1.95, 0.01), 1e-4: (1.90, 0.015), 3e-4: (1.40, 0.30)})
    assert study.best_on_samples(table, 0.02) == 1e-4       # 3e-4 scores best but loops
    assert study.best_on_samples(table, 0.5) == 3e-4
    tie = _table({3e-5: (1.9, 0.0), 1e-4: (1.9, 0.0)})
    assert study.best_on_samples(tie, 0.02) == 3e-5         # ties: the smaller rate
    assert study.best_on_samples(_table({1e-4: (1.9, 0.5), 3e-5: (2.0, 0.4)}), 0.02) == 3e-5


def test_amendment_4_tuning_runs_sample_validation_prompts_and_the_grid_keeps_them(
        study, tmp_path, monkeypatch):
    args, seen = _args(tmp_path, study), []
    args.lr_grid, args.tune_seeds = (3e-5, 1e-4), (0, 1)

    def fake_run(arm, seed, args_, a, root):
        seen.append(a)
        rep = 0.5 if a["lr"] == 1e-4 else 0.0               # the faster rate loops
        return {"curve": [{"bpb": 1.9}], "samples": {"teacher_bpb_on_samples": 1.5 + seed,
                                                     "repetition": rep}}

    monkeypatch.setattr(study, "run", fake_run)
    state = {"teacher": {"chosen": {"model": "/t"}},
             "pkl_lr": {"chosen": 1e-4, "grid": {"0.0001": {"repetition": 0.01}}}}
    data = {"valid_texts": ["To be, or not to be, that is the question: whether 'tis nobler"] * 3,
            "slice_texts": ["Now is the winter of our discontent made glorious summer"] * 3}
    study.stage_op_lr(args, state, {}, {"valid": {"paths": []}}, data)
    spec = seen[0]["samples"]
    assert spec["teacher"] == "/t" and spec["prompts"][0].startswith("To be, or not")
    assert state["op_lr"]["chosen"] == 3e-5 and state["op_lr"]["degeneration_line"] == 0.02
    assert state["op_lr"]["grid"]["3e-05"]["teacher_bpb_on_samples"] == 2.0   # mean of seeds
    assert json.loads((args.records / "op_lr_rule.json").read_text())["line"] == 0.02
    a2 = study.parse(["--scheme", "blocks", "--out", str(tmp_path / "a2")])
    assert study.tuning_samples(a2, state, data) == {}      # amendment 2 ran without samples
