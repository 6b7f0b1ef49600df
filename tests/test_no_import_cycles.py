"""No import cycles inside the ``xdistill`` package, function-local imports included.

The imports are read by ``tools/import_graph.py`` (the scanner ``tools/stage_graph.py`` draws
with too): every module is parsed with :mod:`ast`; each ``import xdistill.x`` / ``from
xdistill.x import y`` (relative ones too, at any depth of the module: top level, functions,
``TYPE_CHECKING`` blocks) is an edge to the module it names -- to ``xdistill.x.y`` when that is a
module, else to ``xdistill.x``. A cycle in that graph is a circle of modules that can only be
imported because some of the imports are deferred into functions; the test names the modules of
each cycle.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("import_graph", REPO / "tools" / "import_graph.py")
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)

# Cycles known and accepted, each as the sorted tuple of its modules, with the reason. The test
# fails on any cycle not listed here (and on a listed one that no longer exists, so the list
# stays honest).
KNOWN_CYCLES: dict[tuple[str, ...], str] = {}


def graph(pkg: Path = import_graph.PKG) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in its body."""
    return {m: set(edges) for m, edges in import_graph.package_graph(pkg).items()}


def test_the_graph_sees_function_local_and_relative_imports(tmp_path):
    found = graph()
    assert "xdistill.errors" in found["xdistill.assets.paths"]
    assert found["xdistill.assets.paths"] <= {"xdistill.errors"}
    assert "xdistill.assets.paths" in found["xdistill.tokenization.load"]
    pkg = tmp_path / "xdistill"   # the package has no relative imports: a made-up one has
    for rel, src in {"__init__.py": "from . import a\n",
                     "a/__init__.py": "from .b import f\nfrom .. import c\n",
                     "a/b.py": "def f():\n    from ..c import g\n    import xdistill.c.d.Name\n",
                     "c/__init__.py": "from ..a import b\n",
                     "c/d.py": "from . import e\nfrom xdistill import a, zz\n",
                     "c/e.py": "import os\n"}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(src)
    assert import_graph.package_graph(pkg) == {
        "xdistill": {"xdistill.a": True},
        "xdistill.a": {"xdistill.a.b": True, "xdistill.c": True},
        "xdistill.a.b": {"xdistill.c": False, "xdistill.c.d": False},
        "xdistill.c": {"xdistill.a.b": True},
        "xdistill.c.d": {"xdistill.c.e": True, "xdistill.a": True, "xdistill": True},
        "xdistill.c.e": {}}
    assert import_graph.cycles(graph(pkg)) == [("xdistill", "xdistill.a", "xdistill.a.b",
                                                "xdistill.c", "xdistill.c.d")]


def test_no_import_cycles():
    found = import_graph.cycles(graph())
    new = [c for c in found if c not in KNOWN_CYCLES]
    assert not new, "import cycles (modules of each strongly connected set):\n" + "\n".join(
        " <-> ".join(c) for c in new)
    gone = [c for c in KNOWN_CYCLES if c not in found]
    assert not gone, f"KNOWN_CYCLES lists cycles that no longer exist: {gone}"
