"""The `xdistill` console script: help, unknown commands, one-line errors."""

import os
import subprocess
import sys

import pytest

from xdistill.cli import COMMANDS, main


def test_help_lists_subcommands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("tokenizers", "align", "projection", "data", "train"):
        assert name in out


def test_unknown_command(capsys):
    assert main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown command 'frobnicate'" in err


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "xdistill.cli", "--help"], capture_output=True,
                         text=True, check=True)
    assert "usage: xdistill" in out.stdout


def test_every_command_module_exists():
    import importlib

    for name, (module, _) in COMMANDS.items():
        mod = importlib.import_module(module)
        assert callable(getattr(mod, "main")), name


def test_train_num_threads_sizes_numba_pool_before_numba_starts(monkeypatch):
    import sys

    import numba  # noqa: F401  (present in sys.modules below unless removed)

    from xdistill.commands.train import _limit_numba_pool

    monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)
    _limit_numba_pool(1)  # numba already imported here: too late, leave the env alone
    assert "NUMBA_NUM_THREADS" not in os.environ
    monkeypatch.delitem(sys.modules, "numba")
    _limit_numba_pool(0)  # 0 = defaults
    assert "NUMBA_NUM_THREADS" not in os.environ
    _limit_numba_pool(1)
    assert os.environ["NUMBA_NUM_THREADS"] == "1"
    monkeypatch.setenv("NUMBA_NUM_THREADS", "2")
    _limit_numba_pool(1)  # an explicit user setting wins
    assert os.environ["NUMBA_NUM_THREADS"] == "2"


def test_demo_help_describes_the_demo_it_runs(capsys):
    """`xdistill demo --help` once described an older demo: its text must name what runs today
    (the Makefile's two commands, each arm of `demo distill`, the default tokenizers, defaults)."""
    import re
    from pathlib import Path

    import pytest

    from xdistill.demo.settings import ARMS, HELD_OUT, DemoSettings
    from xdistill.demo.tokenizer_pairs import DEFAULT_NAMES

    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert ":mod:" not in text and "``" not in text       # plain text, no reST markup
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    for cmd in re.findall(r"\$\(VENV\)/bin/(xdistill demo \w+)", makefile):
        assert cmd in text, cmd
    for arm, label in ARMS.items():
        assert f"{label} ({arm})" in text, arm
    assert ", ".join(DEFAULT_NAMES) in text
    s = DemoSettings()
    assert "Gemma-3-270M" in text and "SmolLM2-135M" in text and HELD_OUT in text
    assert f"{s.teacher_steps} steps (--teacher-steps" in text
    assert f"{s.steps} steps each (--steps)" in text
    assert f"({s.eval_batches} batches, --eval-batches)" in text
    assert "$XDISTILL_ASSETS/demo" in text and "--cache" in text
    assert "arithmetic" not in text and "quality" not in text   # the toy demo it replaced


def test_tiny_recipe_without_its_assets_says_how_to_build_them(tmp_path, capsys, monkeypatch):
    """A fresh clone: `xdistill train onpolicy --config configs/onpolicy_tiny_cpu.yaml` said only
    that runs/tiny_assets/teacher_qwen2 does not exist. (Its prompts ship in configs/.)"""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "configs").symlink_to(root / "configs")
    monkeypatch.chdir(tmp_path)
    for kind in ("onpolicy", "offpolicy"):
        assert main(["train", kind, "--config", f"configs/{kind}_tiny_cpu.yaml"]) == 2
        err = capsys.readouterr().err
        assert "runs/tiny_assets" in err and "does not exist" in err and err.count("\n") == 1
        assert "build them once with `python -m xdistill.tiny`" in err, err
    assert (root / "configs" / "prompts_tiny.jsonl").is_file()


def test_command_help_is_plain_text(capsys):
    """``train --help`` once showed its docstring's reST (````x````, ``:func:`a.b```)."""
    import pytest

    for name in COMMANDS:
        with pytest.raises(SystemExit) as exit_:
            main([name, "--help"])
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        for markup in ("``", ":func:", ":class:", ":mod:", ":meth:"):
            assert markup not in out, (name, markup)
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "runs xdistill.train.offpolicy.run_offpolicy." in " ".join(
        capsys.readouterr().out.split())


def test_entry_exits_with_mains_code_without_a_process_group(monkeypatch):
    import pytest

    from xdistill import cli, distributed

    monkeypatch.setattr(cli, "main", lambda argv=None: 3)
    monkeypatch.setattr(distributed, "_STARTED_GROUP", False)
    monkeypatch.setattr(os, "_exit", lambda code: pytest.fail("os._exit without a process group"))
    with pytest.raises(SystemExit) as exc:
        cli.entry()
    assert exc.value.code == 3


def test_entry_leaves_a_rank_through_os_exit_after_flushing(monkeypatch):
    """A process that ran a process group ends by os._exit (no interpreter teardown beside gloo's
    threads), after the logging handlers and standard streams are flushed."""
    import logging

    import pytest

    from xdistill import cli, distributed

    class Left(Exception):
        pass

    events = []

    class Handler(logging.Handler):
        def emit(self, record):
            events.append("emit")

        def flush(self):
            events.append("flush")

    def fake_exit(code):
        events.append(("exit", code))
        raise Left

    handler = Handler()
    logging.getLogger("xdistill-test-entry").addHandler(handler)
    real_shutdown = logging.shutdown
    # logging's own shutdown, on our handler only (the real call would close pytest's handlers)
    monkeypatch.setattr(logging, "shutdown", lambda: real_shutdown([lambda: handler]))
    monkeypatch.setattr(cli, "main", lambda argv=None: 0)
    monkeypatch.setattr(distributed, "_STARTED_GROUP", True)
    monkeypatch.setattr(os, "_exit", fake_exit)
    try:
        with pytest.raises(Left):
            cli.entry()
    finally:
        logging.getLogger("xdistill-test-entry").removeHandler(handler)
    assert "flush" in events and events[-1] == ("exit", 0)
    assert events.index("flush") < events.index(("exit", 0))


def test_an_error_under_several_ranks_names_the_rank(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "missing.yaml"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert main(["train", "offpolicy", "--config", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("xdistill: error: [rank 1/2] ") and str(missing) in err and err.count("\n") == 1
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    assert main(["train", "offpolicy", "--config", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("xdistill: error: ") and "[rank" not in err


def test_torchrun_ranks_each_print_one_labelled_error_line(tmp_path):
    """Both ranks of a real torchrun launch fail on the same bad override: two lines, one per rank,
    each saying which rank printed it (they were two identical lines)."""
    from distributed_helpers import REPO, run_torchrun   # deferred: test-only helper module

    proc = run_torchrun(["train", "offpolicy", "--config", str(REPO / "configs/offpolicy_tiny_cpu.yaml"),
                         f"train.out_dir={tmp_path / 'run'}", "optim.lr=-1"],
                        script=REPO / "xdistill" / "cli.py", check=False, timeout=180)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if "xdistill: error:" in line]
    assert sorted(line[line.index("xdistill: error:"):] for line in lines) == [
        f"xdistill: error: [rank {r}/2] optim.lr: must be > 0, got -1.0 (set by command-line override 'optim.lr=-1')"
        for r in (0, 1)], proc.stderr[-3000:]


@pytest.mark.parametrize("reader", ["true", "head -2"])
def test_output_piped_into_a_reader_that_stops_ends_without_a_traceback(reader):
    """``xdistill tokenizers inspect qwen2 | head -2``: a reader that closes the pipe early
    (``true`` reads nothing: the write always fails; ``head`` may or may not have taken it all)
    ends the command quietly, exit 1 when its output was cut, with nothing on stderr instead
    of a BrokenPipeError traceback or Python's "Exception ignored" at exit."""
    cmd = (f"{sys.executable} -m xdistill.cli tokenizers inspect qwen2 | {reader}; "
           "echo rc=${PIPESTATUS[0]} >&2")
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.stderr.strip() in (("rc=1",) if reader == "true" else ("rc=0", "rc=1")), \
        proc.stderr
