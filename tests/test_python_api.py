"""The Python API: ``import xdistill`` is cheap and lists its public names, each documented; the
example of ``docs/python_api.md`` runs as written (its ```python blocks, in order, as one script,
in a scratch copy of the repository root -- the mechanism of ``tests/test_readme_commands.py``)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from test_readme_commands import ROOT, fenced_blocks, scratch_root


def test_import_is_cheap_and_the_names_are_public_and_documented():
    code = ("import sys, xdistill; heavy = [m for m in ('torch', 'transformers', 'numba') "
            "if m in sys.modules]; print(heavy); print(sorted(n for n in dir(xdistill) "
            "if not n.startswith('_')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=scratch_root_env(), check=True).stdout.splitlines()
    assert out[0] == "[]"                                   # nothing heavy on import
    import xdistill

    names = eval(out[1])  # noqa: S307 - our own printed list
    for must in ("load_config", "run_offpolicy", "run_onpolicy", "model_bits_per_byte",
                 "build_projection", "align_pair", "projected_kl", "MultiTeacherLoss"):
        assert must in names and must in xdistill.__all__
    undocumented = [n for n in names if n != "__version__" and not getattr(xdistill, n).__doc__]
    assert not undocumented
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        xdistill.nope  # noqa: B018


def scratch_root_env() -> dict:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


@pytest.mark.integration
def test_docs_python_api_example_runs(tmp_path):
    blocks = fenced_blocks(ROOT / "docs" / "python_api.md", "python")
    assert len(blocks) >= 3
    env = scratch_root(tmp_path)
    (tmp_path / "example.py").write_text("\n".join(blocks), encoding="utf-8")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    print(f"docs/python_api.md example: {time.perf_counter() - t0:.1f} s")
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout
    for line in ("off-policy:", "on-policy:", "bits/byte:", "P-KL:"):
        assert line in out, out
    assert "BOS first: False" in out                         # GPT-2 adds no BOS by default
    assert (tmp_path / "runs" / "python_api" / "gpt2_to_qwen2.npz").is_file()
