"""The README stays true: its first commands are `make test` / `make demo`, and its file tree
matches the package (regenerate with `python tools/readme_tree.py --write`)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first_block = text.split("```")[1]
    assert "make test" in first_block and "make demo" in first_block


def test_readme_tree_is_current():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "readme_tree.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def test_architecture_stage_picture_is_current():
    """docs/architecture.md's stages picture is generated from the imports (tools/stage_graph.py)
    and must match the code; it draws every data-flow stage."""
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "stage_graph.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    picture = doc.split("<!-- GENERATED:stages:BEGIN -->")[1].split("<!-- GENERATED:stages:END")[0]
    for stage in ("align", "projection", "data", "teacher", "losses", "student", "train"):
        assert f"  {stage}[{stage}/]" in picture
    assert "  train --> teacher" in picture  # an edge every version of the trainer has


def test_makefile_targets_do_their_own_setup():
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "test: assets" in make and "demo: assets" in make and "assets: $(STAMP)" in make
