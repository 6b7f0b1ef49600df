"""Test modules are imported by basename (pytest's default mode): basenames must be unique."""

from collections import Counter
from pathlib import Path


def test_test_module_basenames_are_unique():
    root = Path(__file__).parent
    names = Counter(p.name for p in root.rglob("*.py") if p.name not in ("conftest.py", "__init__.py"))
    assert not [n for n, c in names.items() if c > 1]
