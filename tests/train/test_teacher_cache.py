"""Teacher output cache in a real multi-epoch off-policy run (the CLI, 2 threads): with
``data.shuffle: false`` every epoch packs the same windows, later epochs copy the teachers'
outputs instead of recomputing them, and the run's losses equal those of an uncached run.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from xdistill.metrics import read_metrics

_here = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("train_conftest_cache", _here / "conftest.py")
helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helpers)


def _small_corpus(tmp: Path) -> Path:
    """Three short passages: a handful of windows per epoch."""
    import xdistill.tiny as mk
    from xdistill.data.prepare import prepare

    raw = tmp / "small.jsonl"
    docs = mk.passages(300, limit=3)
    raw.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    prepare([raw], tmp / "small", progress=False)
    return tmp / "small"


def _run(tmp: Path, assets: dict, name: str, cache_mb: float, shuffle: bool = False,
         steps: int = 6):
    corpus = tmp / "small" if (tmp / "small").exists() else _small_corpus(tmp)
    cfg = helpers.base_config(assets, tmp / name)
    cfg["data"].update(paths=[str(corpus)], shuffle=shuffle)
    cfg["train"].update(steps=steps, num_threads=2)
    for t in cfg["teachers"]:
        t["worker"]["cache_mb"] = cache_mb
    path = helpers.write_config(tmp / f"{name}.yaml", cfg)
    proc = helpers.run_cli(["train", "offpolicy", "--config", str(path)],
                           env={"OMP_NUM_THREADS": "2"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [r for r in read_metrics(tmp / name / "metrics.jsonl") if "loss" in r]
    return proc, records


@pytest.mark.integration
def test_cached_epochs_train_like_uncached_ones(tmp_path, tiny_assets):
    plain_proc, plain = _run(tmp_path, tiny_assets, "plain", 0)
    cached_proc, cached = _run(tmp_path, tiny_assets, "cached", 64)
    samples = (tmp_path / "plain" / "samples_rank0.jsonl").read_text().splitlines()
    hashes = [h for line in samples for h in json.loads(line)["hashes"]]
    assert len(set(hashes)) < len(hashes), "the corpus must repeat within 6 steps"
    assert [r["step"] for r in cached] == [r["step"] for r in plain] == list(range(1, 7))
    for a, b in zip(cached, plain):
        for key in ("loss", "cross/loss", "same/loss", "ce", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (a["step"], key)
    for teacher in ("cross", "same"):
        m = re.search(rf"teacher '{teacher}' output cache: (\d+) hits / (\d+) rows",
                      cached_proc.stderr)
        assert m, cached_proc.stderr[-3000:]
        hits, rows = int(m.group(1)), int(m.group(2))
        # every window after the first epoch is a hit
        assert rows == len(hashes) and hits == len(hashes) - len(set(hashes))
    assert "output cache" not in plain_proc.stderr
    assert "cache will rarely hit" not in cached_proc.stderr


@pytest.mark.integration
def test_cache_with_shuffled_data_warns(tmp_path, tiny_assets):
    proc, _ = _run(tmp_path, tiny_assets, "shuffled", 8, shuffle=True, steps=1)
    assert "teachers.0.worker.cache_mb: data.shuffle is true" in proc.stderr
