"""Ctrl-C and SIGTERM sent to the whole process group (a terminal's Ctrl-C, ``timeout``, a
scheduler) stop a run at a step boundary with a checkpoint, however often they come, and the
resumed legs reproduce the uninterrupted run bitwise.

The loader worker (``data.num_workers: 1``) and the subprocess teacher get every signal too: they
must ignore it (xdistill/child_signals.py) so that the trainer can finish its step, write the
checkpoint and exit with 128 + the signal.

One chained run: start the CLI in its own session, wait for a random step of this leg (plus a
random fraction of a step, so the signal lands anywhere in a step: data, teachers, backward,
logging), ``os.killpg`` the group with SIGINT or SIGTERM, check the exit code, the one-line message
and the checkpoint, resume, signal again, ...; the last leg runs to the end. Its losses must equal
an uninterrupted run's, step by step. ``make test`` runs 2 SIGINT + 2 SIGTERM; the ``slow``
variant runs the issue's 10 + 10.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import train_helpers as helpers
from train_helpers import _env, base_config, write_config
train_records = helpers.train_records
REPO = helpers.REPO
LOSS_KEYS = ("loss", "cross/loss", "same/loss", "ce", "grad_norm", "lr")


def _config(tmp: Path, assets: dict, steps: int) -> Path:
    cfg = base_config(assets, tmp / "run")
    cfg["teachers"][0]["worker"]["placement"] = "subprocess"   # a child that gets the signal too
    cfg["data"]["num_workers"] = 1                              # so does the loader worker
    cfg["train"].update(steps=steps, log_every=1, log_samples=False, num_threads=1)
    return write_config(tmp / "c.yaml", cfg)


def _start(config: Path, out: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "xdistill", "train", "offpolicy", "--config", str(config),
           f"train.out_dir={out}", *extra]
    return subprocess.Popen(cmd, env=_env(), cwd=str(REPO), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _logged_steps(out: Path) -> list[int]:
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    steps = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:   # a line being written
            continue
        if "loss" in rec:
            steps.append(rec["step"])
    return steps


def _signal_leg(config: Path, out: Path, sig: int, target: int, rng: random.Random,
                step_s: float) -> int:
    """Run until step ``target`` is logged, signal the group at a random moment of the next step
    (``step_s``: a typical step's seconds); returns the step the run stopped after."""
    proc = _start(config, out)
    deadline = time.time() + 240
    while proc.poll() is None and time.time() < deadline:
        steps = _logged_steps(out)
        if steps and steps[-1] >= target:
            break
        time.sleep(0.02)
    assert proc.poll() is None, f"the run ended before step {target}:\n{proc.stderr.read()[-3000:]}"
    time.sleep(rng.uniform(0.0, step_s))   # somewhere inside the next step
    os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=240)
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig, f"{name} at step {target}: rc {proc.returncode}\n{err[-4000:]}"
    assert "Traceback" not in err and "killed by signal" not in err, err[-4000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"xdistill: error: stopped by {name} after step "), last
    stopped = int(last.split("after step ")[1].split(";")[0])
    assert stopped >= target
    assert (out / "checkpoints" / f"step_{stopped:07d}" / "COMPLETE").is_file(), err[-3000:]
    assert _logged_steps(out)[-1] == stopped
    return stopped


@pytest.mark.integration
@pytest.mark.parametrize("n_int,n_term", [
    (2, 2), pytest.param(10, 10, marks=pytest.mark.slow, id="10-10")])
def test_group_signals_always_checkpoint_and_resume_bitwise(tmp_path, tiny_assets, n_int,
                                                            n_term):
    rng = random.Random(1234 + n_int)
    signals = [signal.SIGINT] * n_int + [signal.SIGTERM] * n_term
    rng.shuffle(signals)
    steps = 4 * len(signals) + 4   # a tiny step takes ~40 ms: a signal may land a few steps on
    config = _config(tmp_path, tiny_assets, steps)
    ref = tmp_path / "ref"
    done = _start(config, ref)
    _, err = done.communicate(timeout=300)
    assert done.returncode == 0, err[-4000:]
    assert "set_vital" not in err   # torchdata's deprecation warning is silenced
    step_s = sorted(r["step_s"] for r in train_records(ref))[steps // 2]
    out, last = tmp_path / "run", 0
    for sig in signals:   # each leg trains one or two steps past its checkpoint, then is signalled
        last = _signal_leg(config, out, sig, last + rng.randint(1, 2), rng, step_s)
        assert last < steps - 2, "signals landed too late: no room for the next leg"
    final = _start(config, out)
    _, err = final.communicate(timeout=300)
    assert final.returncode == 0, err[-4000:]
    got, want = train_records(out), train_records(ref)
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, steps + 1))
    for a, b in zip(got, want):
        for key in LOSS_KEYS:
            assert a[key] == b[key], (a["step"], key, a[key], b[key])
