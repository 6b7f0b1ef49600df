"""``xdistill demo distill`` (the real pair: Gemma-3-270M -> SmolLM2-135M), through ``main(argv)``
of the CLI command: the whole demo at a tiny budget, twice in one temporary cache (the second run
reuses the adapted teacher), and the cheap parts (stage errors, progress lines, the cache key)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace

import pytest

from xdistill.commands.demo import main
from xdistill.demo import real_pair as rp
from xdistill.demo.progress import DemoFailed, Progress
from xdistill.demo.settings import DemoSettings

TINY = ["--teacher-steps", "2", "--steps", "2", "--eval-batches", "1"]


def _run(tmp_path, capsys, out: str) -> tuple[dict, str]:
    code = main(["distill", "--out", str(tmp_path / out), "--cache", str(tmp_path / "cache"),
                 *TINY])
    printed = capsys.readouterr()
    assert code == 0, printed.err[-3000:]
    return json.loads((tmp_path / out / "summary.json").read_text()), printed.out


def _first_run(tmp_path, capsys) -> dict:
    """The tiny demo from an empty cache: the teacher adapted here, both arms reported."""
    first, out1 = _run(tmp_path, capsys, "out1")
    assert set(first["arms"]) == {"ce", "pkl"} and first["teacher"]["cached"] is False
    figures = [first["before"]["bpb"], first["teacher"]["stock"], first["teacher"]["adapted"],
               *(a["bpb"] for a in first["arms"].values())]
    assert all(math.isfinite(x) and 0.5 < x < 5 for x in figures), figures
    assert "[teacher] adapting Gemma: 2 steps" in out1
    for arm, res in first["arms"].items():
        assert len(res["losses"]) == 2 and all(math.isfinite(x) for x in res["losses"])
        assert res["sample"].strip() and f"  after {arm}:" in out1
        assert f"  {arm:<6}{first['before']['bpb']:>9.4f}{res['bpb']:>9.4f}" in out1
    assert "P-KL vs CE-only:" in out1 and first["prompt"].splitlines()[0] in out1
    folders = [p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith("teacher-")]
    assert len(folders) == 1 and not folders[0].endswith(".partial"), folders
    assert (tmp_path / "cache" / folders[0] / "export" / "config.json").is_file()
    return first


@pytest.mark.real
def test_tiny_demo_runs_as_a_user_runs_it(tmp_path, capsys):
    """About a minute on 2 cores (real models, 2 teacher steps, 2 steps per arm, 1 eval batch):
    the demo `make demo` runs, end to end, in `make test`."""
    _first_run(tmp_path, capsys)


@pytest.mark.real
@pytest.mark.slow
def test_tiny_demo_adapts_the_teacher_once_and_reports_both_arms(tmp_path, capsys):
    """Minutes on 2 loaded cores: the tiny demo twice in one cache; the second run reuses the
    adapted teacher and repeats the arms."""
    first = _first_run(tmp_path, capsys)
    second, out2 = _run(tmp_path, capsys, "out2")
    assert second["teacher"]["cached"] is True
    assert "[teacher] adapted teacher cached" in out2 and "adapting Gemma" not in out2
    assert "[projection] cached" in out2
    assert second["teacher"]["adapted"] == first["teacher"]["adapted"]
    # same seed, same data, same weights: the arms repeat (CPU, same thread count)
    for arm in ("ce", "pkl"):
        assert second["arms"][arm]["bpb"] == pytest.approx(first["arms"][arm]["bpb"], rel=1e-5)


@pytest.mark.real
def test_a_failing_stage_is_one_error_naming_it(tmp_path, capsys, monkeypatch):
    """A stage that raises ends the demo with one ``xdistill: error:`` line naming the stage and
    the cause (exit 2, no traceback on the console; the traceback goes to <out>/error.log)."""
    def boom(*_args, **_kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(rp.core, "build", boom)
    code = main(["distill", "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache"),
                 *TINY])
    err = capsys.readouterr().err
    assert code == 2
    errors = [x for x in err.splitlines() if x.startswith("xdistill: error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert "demo stage 'teacher load' failed: RuntimeError: boom" in errors[0]
    assert "boom" in (tmp_path / "out" / "error.log").read_text()
    assert not list((tmp_path / "cache").rglob("done.json"))   # nothing cached as adapted


def test_missing_assets_say_how_to_fetch_them(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDISTILL_ASSETS", str(tmp_path / "empty"))
    assert main(["distill", "--out", str(tmp_path / "out"), *TINY]) == 2
    err = capsys.readouterr().err
    assert "demo stage 'texts' failed: missing assets:" in err and "make assets" in err


def test_progress_lines_come_while_a_stage_is_busy():
    """A line with rate and ETA at least every ``every`` seconds, even inside one long step."""
    lines = []
    progress = Progress(lines.append, every=0.2)
    with progress.stage("work", 3, "step", "three steps") as stage:
        for _ in range(3):
            time.sleep(0.3)
            stage.advance()
    busy = [x for x in lines if x.startswith("[work] step ")]
    assert lines[0] == "[work] three steps" and lines[-1].startswith("[work] done in ")
    assert len(busy) >= 3 and any("s/step | ETA " in x for x in busy), lines
    assert progress.times["work"] >= 0.9
    with pytest.raises(DemoFailed, match="demo stage 'bad' failed: ValueError: no"):
        with progress.stage("bad"):
            raise ValueError("no")


def test_the_teacher_cache_key_follows_what_the_weights_depend_on():
    data = {"domain_sha": "abc"}
    base = DemoSettings()
    key = rp.teacher_key(base, data)
    assert rp.teacher_key(replace(base, steps=7, eval_batches=9, lr=1.0), data) == key
    assert rp.teacher_key(replace(base, teacher_steps=base.teacher_steps + 1), data) != key
    assert rp.teacher_key(replace(base, teacher_lr=1e-3), data) != key
    assert rp.teacher_key(base, {"domain_sha": "other"}) != key
