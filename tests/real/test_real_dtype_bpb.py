"""The auto-vs-float32 held-out comparison (``benchmarks/real/dtype_bpb.py``): its table is
generated from the raw per-run figures alone, and its summary is right (means, sample sd, the
paired difference, the one-sd verdict, the time ratio), checked against hand-computed values."""

from __future__ import annotations

import json
import statistics

import pytest
from real_helpers import REAL_SCRIPTS, load_real_script


@pytest.fixture(scope="module")
def dtype_bpb():
    """The script, its siblings importable as when it runs (its folder first on the path)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(REAL_SCRIPTS))
        yield load_real_script("dtype_bpb")


def _raw() -> dict:
    f32 = [1.70, 1.72, 1.74]
    auto = [1.705, 1.735, 1.745]        # +0.0083 on average: within the sd 0.02
    masters = [1.69, 1.72, 1.75]
    rows = []
    for s, (a, b, m) in enumerate(zip(f32, auto, masters)):
        rows.append({"arm": "ce", "seed": s, "dtype": "float32", "lr": 1e-4, "bpb": a,
                     "seconds": 200.0, "compute_dtype": "float32"})
        rows.append({"arm": "ce", "seed": s, "dtype": "auto", "lr": 1e-4, "bpb": b,
                     "seconds": 100.0, "compute_dtype": "bfloat16", "masters_bpb": m})
        rows.append({"arm": "pkl", "seed": s, "dtype": "float32", "lr": 1e-4, "bpb": a,
                     "seconds": 300.0, "compute_dtype": "float32"})
        rows.append({"arm": "pkl", "seed": s, "dtype": "auto", "lr": 1e-4, "bpb": a + 0.05,
                     "seconds": 100.0, "compute_dtype": "bfloat16", "masters_bpb": a})
    return {"rows": rows, "hardware": "test CPU", "teacher": "t", "command": "c",
            "records": {"ce": {"0": 1.70, "1": 1.72}}}


def test_summary_rows_are_the_hand_computed_figures(dtype_bpb):
    text = dtype_bpb.table(_raw())
    sd = statistics.stdev([1.70, 1.72, 1.74])
    assert abs(sd - 0.02) < 1e-12
    ce = next(line for line in text.splitlines() if line.startswith("| ce | 1.7200"))
    assert "+0.0083" in ce and "+0.0000" in ce and "yes (sd 0.0200)" in ce and "| 2.00 |" in ce
    pkl = next(line for line in text.splitlines() if line.startswith("| pkl | 1.7200"))
    assert "+0.0500" in pkl and "no (sd 0.0200)" in pkl and "| 3.00 |" in pkl
    assert "| ce | 0 | 1.7000 | 1.7050 | 1.6900 | bfloat16 | 1.7000 | 2.00 |" in text


def test_report_only_regenerates_the_table_and_keeps_the_discussion(dtype_bpb, tmp_path):
    (tmp_path / "evidence").mkdir()
    (tmp_path / "evidence" / "dtype_bpb.json").write_text(json.dumps(_raw()))
    argv = ["--report-only", "--report-dir", str(tmp_path)]
    assert dtype_bpb.main(argv) == 0
    md = tmp_path / "dtype_bpb.md"
    md.write_text(md.read_text() + "\n\nReading: kept.\n")
    assert dtype_bpb.main(argv) == 0
    text = md.read_text()
    assert text.count("| ce | 1.7200") == 1 and text.endswith("Reading: kept.\n")
