"""`xdistill plot` writes a PNG from metrics.jsonl and rejects unknown keys."""

from xdistill.cli import main
from xdistill.metrics import MetricsWriter


def make_run(path, n=5):
    with MetricsWriter(path, echo=False) as w:
        for step in range(1, n + 1):
            w.write(step, {"loss": 3.0 / step, "lr": 1e-3, "note": "x"})


def test_plot_writes_png(tmp_path, capsys):
    make_run(tmp_path / "a" / "metrics.jsonl")
    make_run(tmp_path / "b" / "metrics.jsonl", n=3)
    out = tmp_path / "curves.png"
    assert main(["plot", str(tmp_path / "a/metrics.jsonl"), str(tmp_path / "b/metrics.jsonl"),
                 "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "loss" in capsys.readouterr().out


def test_plot_unknown_key(tmp_path, capsys):
    make_run(tmp_path / "metrics.jsonl")
    assert main(["plot", str(tmp_path / "metrics.jsonl"), "-o", str(tmp_path / "x.png"),
                 "--keys", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_plot_takes_run_folders(tmp_path, capsys):
    """A run folder stands for its metrics.jsonl; a folder without one is a one-line error."""
    make_run(tmp_path / "a" / "metrics.jsonl")
    out = tmp_path / "c.png"
    assert main(["plot", str(tmp_path / "a"), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "empty").mkdir()
    assert main(["plot", str(tmp_path / "empty"), "-o", str(out)]) == 2
    assert "without a metrics.jsonl" in capsys.readouterr().err
