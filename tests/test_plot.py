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
