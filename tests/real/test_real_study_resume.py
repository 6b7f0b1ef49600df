"""The real study on a new machine (``benchmarks/real/study.py``): the recorded stages come from
the committed records, each finished run is restored from them (and counts only for the same
job), and a lost chosen teacher is rebuilt and must score its recorded figure again. Fast: the
trainer is replaced by stand-ins here; ``test_real_study.py`` (slow) runs the real stages."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from real_helpers import REAL_SCRIPTS, load_real_script


@pytest.fixture(scope="module")
def study():
    """The script, its siblings importable as when it runs (its folder first on the path)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(REAL_SCRIPTS))
        yield load_real_script("study")


def _args(tmp_path: Path) -> SimpleNamespace:
    return SimpleNamespace(out=tmp_path / "runs", records=tmp_path / "records",
                           checks=(60, 120, 240, 480), scheme="blocks")


def test_state_comes_from_the_records_in_a_new_run_folder(study, tmp_path):
    args = _args(tmp_path)
    assert study.load_state(args) == {}
    args.records.mkdir()
    (args.records / "study.json").write_text(json.dumps({"ce_lr": {"chosen": 1e-4}}))
    assert study.load_state(args) == {"ce_lr": {"chosen": 1e-4}}
    args.out.mkdir()
    (args.out / "study.json").write_text(json.dumps({"ce_lr": {"chosen": 3e-4}}))
    assert study.load_state(args) == {"ce_lr": {"chosen": 3e-4}}   # the run folder's own first


def test_finished_runs_are_kept_in_the_records_and_restored(study, tmp_path, monkeypatch):
    args, trained = _args(tmp_path), []

    def fake_run_arm(arm, seed, args_, a, root):
        """run_arm's cache rule: a result.json with the job's digest is reused."""
        result = root / "runs" / arm / f"seed{seed}" / "result.json"
        if result.exists() and json.loads(result.read_text())["digest"] == a["digest"]:
            return json.loads(result.read_text())
        trained.append((arm, seed, a["digest"]))
        result.parent.mkdir(parents=True, exist_ok=True)
        result.write_text(json.dumps({"digest": a["digest"], "bpb": 1.7}))
        return json.loads(result.read_text())

    monkeypatch.setattr(study.distill, "run_arm", fake_run_arm)
    root = args.out / "op_lr" / "lr0.0001"
    assert study.run("op_k1", 0, args, {"digest": "a"}, root)["bpb"] == 1.7
    kept = args.records / "runs" / "op_lr" / "lr0.0001" / "op_k1_seed0.json"
    assert json.loads(kept.read_text())["digest"] == "a"
    # a new machine: the run folder is gone, the records are not
    import shutil

    shutil.rmtree(args.out)
    assert study.run("op_k1", 0, args, {"digest": "a"}, root)["bpb"] == 1.7
    assert trained == [("op_k1", 0, "a")]                       # restored, not trained again
    shutil.rmtree(args.out)
    study.run("op_k1", 0, args, {"digest": "b"}, root)           # another job: trained
    assert trained[-1] == ("op_k1", 0, "b")
    assert json.loads(kept.read_text())["digest"] == "b"


@pytest.mark.parametrize("bpb, ok", [(1.5618355 + 1e-4, True), (1.60, False)])
def test_a_lost_teacher_is_rebuilt_and_checked_against_its_record(study, tmp_path, monkeypatch,
                                                                   bpb, ok):
    args = _args(tmp_path)
    model = str(args.out / "teacher_v2" / "step240")
    state = {"teacher": {"chosen": {"step": 240, "bpb": 1.5618355, "model": model}}}
    calls = []

    def fake_adapt(args_, ev, data, checks, stop_bpb=None, name="adapted", schedule=None,
                   folder="teacher_v2"):
        calls.append((list(checks), stop_bpb, name))
        return [{"step": c, "bpb": bpb if c == 240 else 1.7,
                 "model": str(args.out / "teacher_v2" / f"step{c}")} for c in checks]

    monkeypatch.setattr(study.teachers, "adapt", fake_adapt)
    if ok:
        study.teachers.ensure(args, state, {}, {})
    else:
        with pytest.raises(SystemExit, match=r"scores 1\.600000 .* records say 1\.56183"):
            study.teachers.ensure(args, state, {}, {})
    # the same adaptation up to the chosen step, no early stop, its own result file
    assert calls == [([60, 120, 240], None, "rebuilt")]
    Path(model).mkdir(parents=True)                              # present: nothing to rebuild
    study.teachers.ensure(args, state, {}, {})
    assert len(calls) == 1


def test_a_teacher_recorded_under_another_out_is_a_clear_error(study, tmp_path):
    args = _args(tmp_path)
    state = {"teacher": {"chosen": {"step": 240, "bpb": 1.56,
                                    "model": "/elsewhere/teacher_v2/step240"}}}
    with pytest.raises(SystemExit, match="not under --out"):
        study.teachers.ensure(args, state, {}, {})
    assert (REAL_SCRIPTS / "evidence" / "a2" / "study.json").exists()


def test_the_study_pins_auto_to_the_amendments_dtype(study, monkeypatch):
    """Amendment 2's stages were recorded where dtype auto meant float32; a CPU that now gets
    bfloat16 under auto still runs them in float32 (the runs it starts inherit the pin), and
    amendment 4 runs in bfloat16 on every CPU; an explicit override is kept."""
    from xdistill import precision

    monkeypatch.delenv(precision.ENV_OVERRIDE, raising=False)
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: {"amx": True, "avx512_bf16": True})
    assert precision.resolve_compute_dtype("auto", "cpu", "x") == torch.bfloat16
    assert study.AMENDMENTS["blocks"].auto_dtype == "float32"
    study.pin_auto_dtype("float32")
    assert precision.resolve_compute_dtype("auto", "cpu", "x") == torch.float32
    monkeypatch.setenv(precision.ENV_OVERRIDE, "bfloat16")
    study.pin_auto_dtype("float32")
    assert os.environ[precision.ENV_OVERRIDE] == "bfloat16"
    monkeypatch.delenv(precision.ENV_OVERRIDE)
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: {"amx": False, "avx512_bf16": False})
    assert study.AMENDMENTS["blocks4"].auto_dtype == "bfloat16"
    study.pin_auto_dtype("bfloat16")
    assert precision.resolve_compute_dtype("auto", "cpu", "x") == torch.bfloat16
