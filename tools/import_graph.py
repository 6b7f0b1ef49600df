"""The one reader of Python imports for the repository's checks, on the AST (nothing is imported).

Used by ``tools/stage_graph.py`` (the stages picture of ``docs/architecture.md``) and by the
tests ``tests/test_no_import_cycles.py`` and ``tests/test_import_rules.py`` (which load this file
by its path, :func:`importlib.util.spec_from_file_location`).

:func:`import_sites` lists every ``import`` / ``from ... import`` statement of a parsed file at
any depth (top level, functions, classes, ``TYPE_CHECKING`` blocks), each with whether it is
*deferred* (inside a function, nested ones included), the modules it names and the names it may
name as modules (``from a import b``: ``a.b``). :func:`package_graph` resolves them against the
modules of a package (relative imports too) into a module graph, each edge marked eager when at
least one of its imports runs at import time; :func:`cycles` finds its cycles.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "xdistill"


class ImportSite(NamedTuple):
    """One import statement of a file."""

    node: ast.Import | ast.ImportFrom
    # inside a (async) function, at any depth
    deferred: bool
    # the modules it certainly names, absolute: ``import a.b, c`` -> (a.b, c); ``from a import
    # b`` -> (a,); a relative ``from`` with no package to resolve it against -> ()
    modules: tuple[str, ...]
    # ``from a import b, c`` -> (a.b, a.c): names that are modules when ``b`` / ``c`` are
    candidates: tuple[str, ...]

    @property
    def absolute(self) -> bool:
        """Not a relative ``from . import x``."""
        return isinstance(self.node, ast.Import) or self.node.level == 0


def _from_base(node: ast.ImportFrom, package: str | None) -> str | None:
    """The absolute module a ``from`` import reads from (relative ones resolved against
    ``package``, the package of the importing module; None when that is unknown)."""
    if node.level == 0:
        return node.module or ""
    if package is None:
        return None
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def import_sites(tree: ast.AST, package: str | None = None) -> list[ImportSite]:
    """Every import statement under ``tree`` in source order (see :class:`ImportSite`);
    ``package``: the package relative imports are resolved against."""
    deferred = {id(n) for f in ast.walk(tree)
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(f)}
    sites = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            sites.append(ImportSite(node, id(node) in deferred,
                                    tuple(a.name for a in node.names), ()))
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, package)
            modules = () if base is None else (base,)
            candidates = () if base is None else tuple(f"{base}.{a.name}" for a in node.names)
            sites.append(ImportSite(node, id(node) in deferred, modules, candidates))
    return sorted(sites, key=lambda s: (s.node.lineno, s.node.col_offset))


def file_sites(path: Path, package: str | None = None) -> list[ImportSite]:
    return import_sites(ast.parse(path.read_text(encoding="utf-8")), package)


def imported_names(path: Path, *, candidates: bool = False) -> list[str]:
    """The absolute module names a file's imports name, in source order (relative imports left
    out); ``candidates``: also ``a.b`` for each ``from a import b`` (``b`` may be a module)."""
    return [name for s in file_sites(path) if s.absolute
            for name in s.modules + (s.candidates if candidates else ())]


def function_local_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The import nodes inside functions (nested functions, classes and blocks in them
    included), relative ones too, in source order."""
    return [s.node for s in import_sites(tree) if s.deferred]


def module_names(pkg: Path = PKG) -> dict[str, Path]:
    """``xdistill.a.b`` -> its file, for every module and package under ``pkg``."""
    mods = {}
    for path in sorted(pkg.rglob("*.py")):
        parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def package_of(module: str, path: Path) -> str:
    """The package a module's relative imports start from (itself for an ``__init__.py``)."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def modules_imported(site: ImportSite, mods: dict[str, Path]) -> set[str]:
    """The modules of ``mods`` an import names: ``from a import b`` names ``a.b`` when that is a
    module, else ``a``; a name that is no module (``import a.b.Name``) names its longest prefix
    that is one. Names outside ``mods`` give nothing."""
    if isinstance(site.node, ast.Import):
        found = set(site.modules)
    else:
        found = {c if c in mods else site.modules[0] for c in site.candidates}
    out = set()
    for name in found:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        if name:
            out.add(name)
    return out


def package_graph(pkg: Path = PKG) -> dict[str, dict[str, bool]]:
    """module -> {module of ``pkg`` it imports (itself left out): True when at least one of
    those imports is eager (not deferred)}."""
    mods = module_names(pkg)
    graph: dict[str, dict[str, bool]] = {}
    for module, path in mods.items():
        edges = graph[module] = {}
        for site in file_sites(path, package_of(module, path)):
            for dst in modules_imported(site, mods) - {module}:
                edges[dst] = edges.get(dst, False) or not site.deferred
    return graph


def cycles(graph) -> list[tuple[str, ...]]:
    """The strongly connected components with more than one node (Tarjan), each sorted;
    ``graph``: node -> the nodes it points to."""
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
