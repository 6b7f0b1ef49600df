"""Run bookkeeping (xdistill/train/lifecycle.py): no replayed steps in the logs after a resume,
one live run per out_dir, a full disk (a real one) or an unwritable out_dir is one line. Stop
signals (SIGTERM, Ctrl-C, to the process or its group): tests/train/test_stop_signals.py."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from xdistill.cli import main as cli_main
from xdistill.errors import ConfigError
from xdistill.metrics import drop_records_after, read_metrics
from xdistill.train.lifecycle import acquire_run_lock

import train_helpers as helpers
from train_helpers import _env, base_config, write_config


def _steps(path: Path) -> list[int]:
    return [r["step"] for r in read_metrics(path) if "loss" in r]


def test_drop_records_after_keeps_earlier_steps_and_drops_a_torn_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (1, 2, 3, 4))
                    + '{"step": 5, "lo')
    assert drop_records_after(path, 2) == 3
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]
    assert drop_records_after(path, 2) == 0 and drop_records_after(tmp_path / "none", 1) == 0
    # the dropped complete records are kept aside (a resume from an older checkpoint by
    # mistake loses none), the torn line is not
    aside = (tmp_path / "m.jsonl.abandoned").read_text().splitlines()
    assert [json.loads(line)["step"] for line in aside] == [3, 4]


def test_resume_replays_steps_without_duplicate_records(tmp_path, tiny_assets, capsys):
    cfg = base_config(tiny_assets, tmp_path / "run")
    cfg["train"].update(steps=4, num_threads=2)
    cfg["data"]["num_workers"] = 1
    cfg["checkpoint"]["every"] = 2
    path = write_config(tmp_path / "c.yaml", cfg)
    assert cli_main(["train", "offpolicy", "--config", str(path)]) == 0
    run = tmp_path / "run"
    shutil.rmtree(run / "checkpoints" / "step_0000004")   # as if killed after step 4 was logged
    assert cli_main(["train", "offpolicy", "--config", str(path)]) == 0   # resumes from step 2
    assert _steps(run / "metrics.jsonl") == [1, 2, 3, 4]
    samples = [json.loads(line)["step"] for line in (run / "samples_rank0.jsonl").open()]
    assert samples == [1, 2, 3, 4]


HOLD = """
import sys, time
from xdistill.train.lifecycle import acquire_run_lock
lock = acquire_run_lock(sys.argv[1])
print("locked", flush=True)
time.sleep(60)
"""


def test_second_live_run_on_one_out_dir_is_refused_and_a_dead_holder_is_not(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], env=_env(),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(ConfigError, match=rf"in use by another live run \(pid {proc.pid}\)"):
            acquire_run_lock(out)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    acquire_run_lock(out).close()   # the killed holder's lock went with its process


def test_unwritable_out_dir_is_one_line(tmp_path, tiny_assets, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    cfg = base_config(tiny_assets, blocker / "run")
    rc = cli_main(["train", "offpolicy", "--config", str(write_config(tmp_path / "c.yaml", cfg))])
    err = capsys.readouterr().err
    assert rc == 2 and "train.out_dir" in err and "not writable" in err and err.count("\n") == 1


# A real size-limited file system, not a mock. In order of preference (we are not root on every
# machine): a tmpfs of 1000 KiB mounted in a private user + mount namespace (`unshare -rm`: works
# here and on most Linux machines; the disk really fills up, ENOSPC, exactly as in the issue);
# else RLIMIT_FSIZE on the training process (a real kernel limit: writes past it fail with EFBIG;
# SIGXFSZ ignored). A checkpoint of the tiny run is ~600 KB, so the second one cannot fit.
TMPFS_SCRIPT = """
set -e
mount -t tmpfs -o size=1000k tmpfs "$MNT"
set +e
"$PY" -m xdistill train offpolicy --config "$CFG" train.out_dir="$MNT/run" 2> "$T/a.err"
echo $? > "$T/a.rc"
cp -a "$MNT/run" "$T/after"
mount -o remount,size=16m "$MNT"
"$PY" -m xdistill train offpolicy --config "$CFG" train.out_dir="$MNT/run" 2> "$T/b.err"
echo $? > "$T/b.rc"
"""


def _can_mount_tmpfs(where: Path) -> bool:
    where.mkdir()
    try:
        return subprocess.run(["unshare", "-rm", "mount", "-t", "tmpfs", "-o", "size=64k",
                               "tmpfs", str(where)], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _full_disk_runs(tmp: Path, cfg: Path) -> tuple[int, str, int, str, Path]:
    """(rc, stderr) of a run whose second checkpoint does not fit, the same of the rerun with
    room again, and the run folder as the failed run left it."""
    mnt = tmp / "mnt"
    if _can_mount_tmpfs(mnt):
        env = _env({"MNT": str(mnt), "PY": sys.executable, "CFG": str(cfg), "T": str(tmp)})
        subprocess.run(["unshare", "-rm", "sh", "-c", TMPFS_SCRIPT], env=env, timeout=600,
                       check=True)
        read = lambda name: (tmp / name).read_text()  # noqa: E731
        return int(read("a.rc")), read("a.err"), int(read("b.rc")), read("b.err"), tmp / "after"
    import resource

    def limited():   # runs in the child before exec
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))

    cmd = [sys.executable, "-m", "xdistill", "train", "offpolicy", "--config", str(cfg)]
    first = subprocess.run(cmd + ["train.steps=2"], env=_env(), capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    a = subprocess.run(cmd, env=_env(), capture_output=True, text=True, preexec_fn=limited)
    shutil.copytree(tmp / "run", tmp / "after")
    b = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
    return a.returncode, a.stderr, b.returncode, b.stderr, tmp / "after"


@pytest.mark.integration
def test_full_disk_while_checkpointing_is_one_line_and_keeps_the_last_checkpoint(tmp_path,
                                                                                 tiny_assets):
    cfg = base_config(tiny_assets, tmp_path / "run")
    cfg["train"].update(steps=4, log_samples=False)
    cfg["checkpoint"]["every"] = 2
    rc, err, rc2, err2, after = _full_disk_runs(tmp_path, write_config(tmp_path / "c.yaml", cfg))
    assert rc == 2, err[-4000:]
    assert "Traceback" not in err, err[-4000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("xdistill: error: writing checkpoint ") and "step_0000004 failed: " in last
    assert "disk full" in last or "no space left" in last or "file-size limit" in last, last
    assert "step_0000002 is intact" in last, last
    # the atomic write kept the previous checkpoint and left nothing of the failed one
    assert [p.name for p in sorted((after / "checkpoints").iterdir())] == ["step_0000002"]
    assert (after / "checkpoints" / "step_0000002" / "COMPLETE").is_file()
    assert rc2 == 0, err2[-4000:]   # with room again the same command resumes from it
    assert "resumed from" in err2 and "step_0000002 at step 2" in err2, err2[-3000:]
