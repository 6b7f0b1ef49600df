"""`xdistill data info --verify` (xdistill/data/verify.py) and the row checks of DocumentSource:
a shard whose bytes were damaged in place passes `data info` (sizes and row counts agree) but not
`--verify`, which names the first bad file and row in one line, as training then does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from xdistill.cli import main as cli_main
from xdistill.data.prepare import prepare

REPO = Path(__file__).resolve().parents[2]


def _prepared(tmp: Path, lines: list[dict]) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    src = tmp / "in.jsonl"
    src.write_text("".join(json.dumps(d) + "\n" for d in lines))
    prepare([src], tmp / "out", progress=False)
    return tmp / "out"


def damage(shard: Path, what: str) -> None:
    """Flip bytes of a real arrow shard in place (same size): ``offsets`` three high bytes of
    the text column's offset 2 (rows 1 and 2 point far outside the data), ``all_offsets`` those
    of every offset but the first and last (every row), ``text`` bytes inside row 3's text."""
    data = bytearray(shard.read_bytes())
    with pa.memory_map(str(shard)) as mm:
        column = pa.ipc.open_file(mm).get_batch(0).column(0)
        offsets, text = bytes(column.buffers()[1]), bytes(column.buffers()[2])
    if what in ("offsets", "all_offsets"):
        at = data.find(offsets) + 2 * 8 + 3   # int64 offsets, little-endian: bytes 3..5
        span = 3
        if what == "all_offsets":
            base = data.find(offsets)
            for k in range(1, len(offsets) // 8 - 1):
                data[base + 8 * k + 4] ^= 0xFF
            shard.write_bytes(bytes(data))
            return
    else:
        at = data.find(text) + int.from_bytes(offsets[24:32], "little") + 2   # row 3, byte 2
        span = 2
    assert at > 16
    for i in range(at, at + span):
        data[i] ^= 0xFF
    shard.write_bytes(bytes(data))


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                                     os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "xdistill", *args], env=env, cwd=str(REPO),
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("what,message", [
    ("offsets", "row 1: text offsets out of range; the shard is corrupt"),
    ("text", "row 3: invalid UTF-8 at byte 2 (the shard is corrupt")])
def test_verify_names_the_first_damaged_row(tmp_path, what, message):
    """In a subprocess: before the row checks, reading a damaged offset aborted the process."""
    out = _prepared(tmp_path, [{"text": f"document {i} " * 30} for i in range(20)])
    damage(out / "shard-00000.arrow", what)
    assert _cli("data", "info", str(out)).returncode == 0   # sizes and row counts still agree
    proc = _cli("data", "info", str(out), "--verify", "-q")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"xdistill: error: {out / 'shard-00000.arrow'} {message}")


def test_verify_passes_a_healthy_directory_and_any_data_path(tmp_path, capsys):
    out = _prepared(tmp_path, [{"text": "one"}, {"messages": [{"role": "user", "content": "hi"},
                                                              {"role": "assistant", "content": "yo"}]}])
    assert cli_main(["data", "info", str(out), "--verify", "-q"]) == 0
    assert "verified 2 documents (1 text, 1 chat, 0 empty)" in capsys.readouterr().out
    shutil.copy(out / "shard-00000.arrow", tmp_path / "plain.arrow")   # no index.json: still read
    assert cli_main(["data", "info", str(tmp_path / "plain.arrow"), "--verify", "-q"]) == 0


def test_verify_names_unknown_roles_and_conversations_without_a_trained_role(tmp_path, capsys):
    """ShareGPT's human/gpt roles are unknown to training; a conversation of user turns only
    carries no loss under data.loss_roles [assistant]. Both fail as training would fail."""
    sharegpt = {"messages": [{"role": "human", "content": "hi"}, {"role": "gpt", "content": "yo"}]}
    out = _prepared(tmp_path / "a", [{"text": "plain"}, sharegpt])
    assert cli_main(["data", "info", str(out), "--verify", "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"{out / 'shard-00000.arrow'} row 1: message 0 has the unknown chat role 'human'" in err
    user_only = {"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "?"}]}
    out = _prepared(tmp_path / "b", [user_only])
    assert cli_main(["data", "info", str(out), "--verify", "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out / 'shard-00000.arrow'} row 0: chat roles ['user'] " \
        "include none of data.loss_roles ['assistant'], so it would carry no loss" in err, err
    assert cli_main(["data", "info", str(out), "--verify", "-q", "--loss-roles", "user"]) == 0
