"""Checkpoints on one process: bitwise resume in a fresh process, RNG/dataloader/scheduler state,
atomicity under crashes (injected and a real SIGKILL), pruning, --resume semantics.
(2-rank FSDP2 save/resume is in tests/student/test_fsdp.py.)"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from distributed_helpers import HERE, _env, build_optim, build_tiny, run_python, train
from xdistill.train.checkpoint import (
    COMPLETE,
    CheckpointError,
    checkpoint_dir,
    latest_checkpoint,
    set_aside_newer,
    list_checkpoints,
    load_checkpoint,
    recover_interrupted,
    resolve_resume,
    save_checkpoint,
)


def _tests_env() -> dict[str, str]:
    """The subprocess imports distributed_helpers from tests/ and xdistill from the repo."""
    env = _env()
    env["PYTHONPATH"] = f"{HERE.parent}{os.pathsep}{env['PYTHONPATH']}"
    return env


def _fresh(total_steps=10):
    model, _ = build_tiny()
    opt, sched = build_optim(model, total_steps)
    return model, opt, sched


def test_resume_in_fresh_process_is_bitwise_identical(tmp_path):
    full = train(str(tmp_path / "full.pt"), 6, save_at=3, ckpt=str(tmp_path / "ck"))
    ckpt = checkpoint_dir(tmp_path / "ck", 3)
    run_python(["--job", json.dumps({"out": str(tmp_path / "res.pt"), "steps": 6, "resume": str(ckpt)})])
    a = torch.load(tmp_path / "full.pt", weights_only=False)
    b = torch.load(tmp_path / "res.pt", weights_only=False)
    assert b["losses"] == full[3:] == a["losses"][3:]
    assert sorted(a["state"]) == sorted(b["state"])
    assert all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"])
    assert a["lr"] == b["lr"]


def test_states_round_trip(tmp_path):
    model, opt, sched = _fresh()
    ids = torch.randint(0, 97, (2, 8))
    for _ in range(2):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    path = save_checkpoint(tmp_path, 2, model, opt, sched, dataloader_state={"epoch": 1, "offset": 17},
                           extra={"samples_seen": 64})
    draws = (random.random(), np.random.rand(), torch.rand(2))
    model2, opt2, sched2 = _fresh()
    state = load_checkpoint(path, model2, opt2, sched2)
    assert (state.step, state.path, state.dataloader_state, state.extra) == (
        2, path, {"epoch": 1, "offset": 17}, {"samples_seen": 64})
    again = (random.random(), np.random.rand(), torch.rand(2))  # RNG streams rewound
    assert draws[:2] == again[:2] and torch.equal(draws[2], again[2])
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values()))
    assert sched2.state_dict() == sched.state_dict()
    assert [g["lr"] for g in opt2.param_groups] == [g["lr"] for g in opt.param_groups]
    for p, p2 in zip(opt.param_groups[0]["params"], opt2.param_groups[0]["params"]):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][key], opt2.state[p2][key])
    meta = json.loads((path / "meta.json").read_text())
    assert meta["step"] == 2 and meta["world_size"] == 1


def test_load_errors_are_clear(tmp_path):
    model, opt, sched = _fresh()
    with pytest.raises(CheckpointError, match="incomplete"):
        load_checkpoint(tmp_path / "step_0000005", model)
    path = save_checkpoint(tmp_path, 1, model)  # model only
    with pytest.raises(CheckpointError, match="cannot load model/optimizer"):
        load_checkpoint(path, model, opt)
    trainer = torch.load(path / "trainer_state.pt", weights_only=False)
    torch.save(dict(trainer, world_size=2), path / "trainer_state.pt")
    with pytest.raises(CheckpointError, match="2 rank"):
        load_checkpoint(path, model)
    assert load_checkpoint(path, model, strict_world_size=False).dataloader_state is None


def test_keep_last_prunes_old_checkpoints(tmp_path):
    model, opt, sched = _fresh()
    for step in range(1, 5):
        save_checkpoint(tmp_path, step, model, opt, sched, keep_last=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_0000003", "step_0000004"]
    save_checkpoint(tmp_path, 4, model, opt, sched, keep_last=2)  # re-saving a step replaces it
    assert latest_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 4)


class _Crash(Exception):
    pass


def _crash_between_renames(monkeypatch, tmp_path, model, opt, sched, step):
    """Re-save ``step`` and die after the old copy is moved aside, before the new one is in."""
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise _Crash
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(_Crash):
        save_checkpoint(tmp_path, step, model, opt, sched)
    monkeypatch.setattr(os, "replace", real_replace)
    assert calls[0][1].name == f"step_{step:07d}.old"


def test_a_resave_interrupted_between_its_renames_is_recovered(tmp_path, monkeypatch):
    model, opt, sched = _fresh()
    save_checkpoint(tmp_path, 2, model, opt, sched)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    save_checkpoint(tmp_path, 4, model, opt, sched)
    _crash_between_renames(monkeypatch, tmp_path, model, opt, sched, 4)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2]      # step 4 only as step_4.old
    assert resolve_resume("auto", tmp_path) == checkpoint_dir(tmp_path, 4)  # renamed back
    model2, opt2, sched2 = _fresh()
    assert load_checkpoint(checkpoint_dir(tmp_path, 4), model2, opt2, sched2).step == 4
    assert all(torch.equal(saved[k], v) for k, v in model2.state_dict().items())
    assert recover_interrupted(tmp_path) == [] and recover_interrupted(tmp_path / "none") == []
    # without a resume, the next save restores it instead of deleting it as a crash leftover
    _crash_between_renames(monkeypatch, tmp_path, model, opt, sched, 4)
    save_checkpoint(tmp_path, 5, model, opt, sched)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 4, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step_0000002", "step_0000004", "step_0000005"]


def test_later_checkpoints_are_set_aside_not_deleted(tmp_path):
    model, opt, sched = _fresh()
    for step in (2, 4, 6):
        save_checkpoint(tmp_path, step, model, opt, sched)
    (tmp_path / "step_0000006.abandoned").mkdir()          # set aside by an earlier restart
    moved = set_aside_newer(tmp_path, 2)
    assert [p.name for p in moved] == ["step_0000004.abandoned", "step_0000006.abandoned-2"]
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2]
    assert (tmp_path / "step_0000006.abandoned-2" / COMPLETE).is_file()
    assert set_aside_newer(tmp_path, 2) == [] and set_aside_newer(tmp_path / "none", 0) == []


def test_incomplete_folders_are_skipped_and_resume_semantics(tmp_path):
    assert resolve_resume("auto", tmp_path / "none") is None and resolve_resume(None, tmp_path) is None
    model, _, _ = _fresh()
    good = save_checkpoint(tmp_path, 3, model)
    (tmp_path / "step_0000009.tmp").mkdir()          # crash while writing
    (tmp_path / "step_0000009.tmp" / COMPLETE).write_text("9\n")
    (tmp_path / "step_0000007").mkdir()               # no marker
    (tmp_path / "step_0000002.old").mkdir()           # crash while replacing a re-saved step
    (tmp_path / "notes").mkdir()
    assert latest_checkpoint(tmp_path) == good == resolve_resume("auto", tmp_path)
    assert resolve_resume(str(good), tmp_path) == good
    with pytest.raises(CheckpointError, match="incomplete"):
        resolve_resume(str(tmp_path / "step_0000007"), tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_resume(str(tmp_path / "step_0000008"), tmp_path)
    save_checkpoint(tmp_path, 4, model)               # the next save clears the stale .tmp
    assert not (tmp_path / "step_0000009.tmp").exists() and not (tmp_path / "step_0000002.old").exists()


CRASH = """
import os
from distributed_helpers import build_tiny, build_optim
import xdistill.train.checkpoint as ck
model, _ = build_tiny()
opt, sched = build_optim(model, 10)
ck.save_checkpoint({root!r}, 1, model, opt, sched)
def die(*args, **kwargs):
    os._exit(9)
if {point!r} == "rank_state":
    ck._write_rank_state = die      # model/optimizer shards are on disk, the rest is not
else:
    ck.os.replace = die             # everything written and marked, not yet renamed
ck.save_checkpoint({root!r}, 2, model, opt, sched)
"""


@pytest.mark.parametrize("point", ["rank_state", "rename"])
def test_crash_mid_write_keeps_previous_checkpoint(tmp_path, point):
    code = CRASH.format(root=str(tmp_path), point=point)
    proc = subprocess.run([sys.executable, "-c", code], env=_tests_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 9, proc.stderr[-3000:]
    assert (tmp_path / "step_0000002.tmp").is_dir()
    assert latest_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 1)
    model, opt, sched = _fresh()
    assert load_checkpoint(latest_checkpoint(tmp_path), model, opt, sched).step == 1


LOOP = """
from distributed_helpers import build_tiny, build_optim
from xdistill.train.checkpoint import save_checkpoint
model, _ = build_tiny()
opt, sched = build_optim(model, 10)
step = 0
while True:
    step += 1
    save_checkpoint({root!r}, step, model, opt, sched, keep_last=2)
    print(step, flush=True)
"""


def test_sigkill_during_saves_leaves_a_loadable_latest(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", LOOP.format(root=str(tmp_path))],
                            env=_tests_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(3):  # let a few saves complete, then kill at an arbitrary point
            assert proc.stdout.readline(), proc.stderr.read()[-3000:]
        time.sleep(0.013)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and int(latest.name.split("_")[1]) >= 3
    model, opt, sched = _fresh()
    assert load_checkpoint(latest, model, opt, sched).step == int(latest.name.split("_")[1])


def test_write_error_unwraps_dcp_and_names_the_folder(tmp_path):
    """DCP wraps a rank's failure in CheckpointException (a BaseException); the one-line error
    names the folder, the reason and the intact previous checkpoint. (The real full disk is in
    tests/train/test_lifecycle.py.)"""
    import errno

    from torch.distributed.checkpoint.api import CheckpointException

    from xdistill.train.checkpoint import write_error

    model, opt, sched = _fresh()
    save_checkpoint(tmp_path, 1, model, opt, sched)
    full = CheckpointException("ranks", {0: (OSError(errno.ENOSPC, "No space left on device"), None)})
    err = write_error(full, checkpoint_dir(tmp_path, 2))
    assert "\n" not in str(err)
    assert str(err).startswith(f"writing checkpoint {checkpoint_dir(tmp_path, 2)} failed: no space "
                               "left on the device; the previous checkpoint ")
    assert str(checkpoint_dir(tmp_path, 1)) in str(err)
    pos = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    assert "is the disk full?" in str(write_error(pos, checkpoint_dir(tmp_path, 2)))
    assert write_error(RuntimeError("shape mismatch"), checkpoint_dir(tmp_path, 2)) is None
    assert write_error(CheckpointException("x", {0: (KeyError("k"), None)}), tmp_path) is None
