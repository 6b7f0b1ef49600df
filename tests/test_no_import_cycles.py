"""No import cycles inside the ``xdistill`` package, function-local imports included.

Every module is parsed with :mod:`ast`; each ``import xdistill.x`` / ``from xdistill.x import y``
(relative ones too, at any depth of the module: top level, functions, ``TYPE_CHECKING`` blocks)
is an edge to the module it names -- to ``xdistill.x.y`` when that is a module, else to
``xdistill.x``. A cycle in that graph is a circle of modules that can only be imported because
some of the imports are deferred into functions; the test names the modules of each cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "xdistill"

# Cycles known and accepted, each as the sorted tuple of its modules, with the reason. The test
# fails on any cycle not listed here (and on a listed one that no longer exists, so the list
# stays honest).
KNOWN_CYCLES: dict[tuple[str, ...], str] = {}


def module_names() -> dict[str, Path]:
    """``xdistill.a.b`` -> its file, for every module and package of the package."""
    mods = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _base(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def imports_of(module: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The xdistill modules ``module`` imports, anywhere in its body."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, path, node)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in mods else base)
    out = set()
    for name in found:
        while name and name not in mods:          # `import xdistill.a.b.Name` style -> a.b
            name = name.rpartition(".")[0]
        if name.startswith("xdistill") and name != module:
            out.add(name)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = module_names()
    return {m: imports_of(m, p, mods) for m, p in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(tuple(sorted(comp)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_the_graph_sees_function_local_and_relative_imports():
    graph = import_graph()
    assert "xdistill.errors" in graph["xdistill.assets.paths"]
    assert graph["xdistill.assets.paths"] <= {"xdistill.errors"}
    assert "xdistill.assets.paths" in graph["xdistill.tokenization.load"]


def test_no_import_cycles():
    found = cycles(import_graph())
    new = [c for c in found if c not in KNOWN_CYCLES]
    assert not new, "import cycles (modules of each strongly connected set):\n" + "\n".join(
        " <-> ".join(c) for c in new)
    gone = [c for c in KNOWN_CYCLES if c not in found]
    assert not gone, f"KNOWN_CYCLES lists cycles that no longer exist: {gone}"
