"""The `xdistill` console script: help, unknown commands, one-line errors."""

import subprocess
import sys

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
