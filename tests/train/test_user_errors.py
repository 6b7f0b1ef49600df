"""One-line errors of a training run (the CLI's stderr), where they were 17-32-line DataLoader
worker tracebacks: a shard damaged in place, unknown (ShareGPT) chat roles, a resume on other
data, a hung subprocess teacher. Also: another ``data.seq_len`` on resume is allowed and logged,
and the start-up log says what the loader reads."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

_here = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("train_conftest_helpers_errors", _here / "conftest.py")
helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helpers)
_vspec = importlib.util.spec_from_file_location("data_verify_helpers",
                                                _here.parent / "data" / "test_verify.py")
verify_helpers = importlib.util.module_from_spec(_vspec)
_vspec.loader.exec_module(verify_helpers)
base_config, run_cli, write_config = helpers.base_config, helpers.run_cli, helpers.write_config


def _train(tmp: Path, cfg: dict, name: str = "c", *extra: str):
    path = write_config(tmp / f"{name}.yaml", cfg)
    return run_cli(["train", "offpolicy", "--config", str(path), *extra])


def _one_error_line(proc) -> str:
    """The error: one line, the last of stderr, after no traceback (worker or main)."""
    err = proc.stderr
    assert proc.returncode == 2, f"rc {proc.returncode}\n{err[-4000:]}"
    assert "Traceback" not in err and "DataLoader worker" not in err, err[-4000:]
    lines = err.strip().splitlines()
    assert [line for line in lines if line.startswith("xdistill: error:")] == lines[-1:], err[-3000:]
    return lines[-1]


def test_a_damaged_shard_is_one_line_naming_file_and_row(tmp_path, tiny_assets):
    data = tmp_path / "data"
    shutil.copytree(tiny_assets["train"], data)
    verify_helpers.damage(data / "shard-00000.arrow", "all_offsets")   # every row
    cfg = base_config(tiny_assets, tmp_path / "run")
    cfg["data"].update(paths=[str(data)], num_workers=1)   # the error is raised in the worker
    proc = _train(tmp_path, cfg)
    last = _one_error_line(proc)
    assert last.startswith(f"xdistill: error: {data / 'shard-00000.arrow'} row "), last
    assert last.endswith("text offsets out of range; the shard is corrupt: prepare the data again "
                         "(`xdistill data info --verify` reports the first bad row)"), last
    assert f"data: 60 documents in 1 file(s) under {data}, batches of 2 x 48 tokens, 1 worker " \
           "process(es) (fork)" in proc.stderr   # the start-up log says what is read


def test_unknown_chat_roles_are_one_line_naming_file_and_row(tmp_path, tiny_assets):
    """ShareGPT's human/gpt roles (the check is raised in the loader worker)."""
    from xdistill.data.prepare import prepare

    raw = tmp_path / "sharegpt.jsonl"
    raw.write_text("".join(json.dumps({"messages": [{"role": "human", "content": f"q{i}?"},
                                                    {"role": "gpt", "content": f"a{i}."}]}) + "\n"
                           for i in range(8)))
    prepare([raw], tmp_path / "chat", progress=False)
    cfg = base_config(tiny_assets, tmp_path / "run")
    cfg["data"].update(paths=[str(tmp_path / "chat")], num_workers=1)
    last = _one_error_line(_train(tmp_path, cfg))
    assert last.startswith(f"xdistill: error: {tmp_path / 'chat' / 'shard-00000.arrow'} row "), last
    assert ": message 0 has the unknown chat role 'human'; accepted roles: " in last, last
    assert "human -> user and gpt -> assistant" in last, last


def test_resume_on_other_data_is_one_line_and_another_seq_len_is_logged(tmp_path, tiny_assets):
    cfg = base_config(tiny_assets, tmp_path / "run")
    cfg["train"].update(steps=2, log_samples=False)
    cfg["data"]["num_workers"] = 1
    assert _train(tmp_path, cfg).returncode == 0
    other = json.loads(json.dumps(cfg))
    other["data"]["paths"] = [tiny_assets["eval"]]
    other["train"]["steps"] = 3
    last = _one_error_line(_train(tmp_path, other, "other"))
    ckpt = tmp_path / "run" / "checkpoints" / "step_0000002"
    assert last == (f"xdistill: error: {ckpt} was written while training on 60 documents, "
                    f"data.paths ['{tiny_assets['eval']}'] now hold 12: its data position means "
                    "nothing in other data; resume with the same data.paths, or start afresh "
                    "(--resume none, or another train.out_dir)")
    proc = _train(tmp_path, cfg, "c", "train.steps=3", "data.seq_len=40")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming step_0000002 (data.seq_len 48) with data.seq_len 40: the data continues at " \
           "the next unread token" in proc.stderr


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append((int(entry.name), cmdline))
    return found


def test_a_hung_subprocess_teacher_names_the_training_step(tmp_path, tiny_assets):
    """A real hang: the teacher process is stopped (SIGSTOP) after step 2. The teacher counts its
    own requests (two per step here); the message said "step 4" where the trainer was at step 3."""
    cfg = base_config(tiny_assets, tmp_path / "run")
    cfg["teachers"][0]["worker"].update(placement="subprocess", timeout_s=2.0)
    cfg["train"].update(steps=200, log_every=1)
    path = write_config(tmp_path / "c.yaml", cfg)
    proc = subprocess.Popen([sys.executable, "-m", "xdistill", "train", "offpolicy", "--config",
                             str(path)], env=helpers._env(), cwd=str(helpers.REPO),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        metrics, deadline = tmp_path / "run" / "metrics.jsonl", time.time() + 240
        while proc.poll() is None and time.time() < deadline and not (
                metrics.is_file() and '"step": 2,' in metrics.read_text()):
            time.sleep(0.02)
        teacher = [pid for pid, cmd in _children(proc.pid)
                   if "multiprocessing" in cmd and "resource_tracker" not in cmd]
        assert len(teacher) == 1, _children(proc.pid)
        os.kill(teacher[0], signal.SIGSTOP)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    proc.stderr = err
    last = _one_error_line(proc)
    step = int(last.split("error: step ")[1].split(":")[0])
    assert step >= 3 and last.startswith(f"xdistill: error: step {step}: teacher 'cross' "
                                         "(subprocess pid "), last
    request = int(last.split("did not answer request ")[1].split()[0])
    assert request >= 2 * (step - 1), last   # 2 micro-batches a step from 0 (+ pipelined ones)
    assert last.endswith(" within 2 s (hung?); the worker was killed"), last
