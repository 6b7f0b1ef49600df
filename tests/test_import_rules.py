"""Import rules of CONTRIBUTING.md: each stage imports only what it may (checked on the AST, read
by ``tools/import_graph.py``, the repository's one import scanner)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "xdistill"
_spec = importlib.util.spec_from_file_location("import_graph",
                                               PKG.parent / "tools" / "import_graph.py")
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)
STDLIB_OK = set(sys.stdlib_module_names) - {"multiprocessing", "socket", "subprocess"}

# stage -> allowed top-level modules (besides STDLIB_OK); xdistill-internal imports listed fully
RULES = {
    "align": {"numpy", "numba", "xdistill.tokenization.table", "xdistill.errors", "xdistill.align"},
    "losses": {"torch", "xdistill.losses"},
    # numpy + scipy; tqdm for progress; pyarrow (corpus files) and matplotlib (--plot) lazily
    "projection": {"numpy", "scipy", "tqdm", "pyarrow", "matplotlib", "xdistill.tokenization.table",
                   "xdistill.align", "xdistill.errors", "xdistill.projection", "xdistill"},
}


def imports_of(path: Path) -> list[str]:
    """The absolute modules a file's imports name (``from a import b``: ``a``), at any depth."""
    return import_graph.imported_names(path)


def allowed(name: str, rule: set[str]) -> bool:
    top = name.split(".")[0]
    if top in STDLIB_OK:
        return True
    if top == "xdistill":
        # "xdistill" itself (for __version__) allows only the bare package, not its submodules
        return any(name == r or (r != "xdistill" and name.startswith(r + "."))
                   for r in rule if r.startswith("xdistill"))
    return top in rule


@pytest.mark.parametrize("stage", sorted(RULES))
def test_stage_imports(stage):
    files = sorted((PKG / stage).rglob("*.py"))
    bad = [f"{p.relative_to(PKG.parent)}: {name}" for p in files for name in imports_of(p)
           if not allowed(name, RULES[stage])]
    assert not bad, "forbidden imports:\n" + "\n".join(bad)


def test_losses_have_no_distributed_or_io():
    for path in (PKG / "losses").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for word in ("torch.distributed", "open(", "multiprocessing"):
            assert word not in text, f"{path.name} uses {word}"


def test_fully_shard_only_in_parallelize_student():
    users = [p for p in PKG.rglob("*.py")
             if "fully_shard(" in p.read_text(encoding="utf-8")]
    assert all(p.parent.name == "student" for p in users), users


def test_projection_imports_no_torch():
    for path in (PKG / "projection").rglob("*.py"):
        assert not any(n.split(".")[0] == "torch" for n in imports_of(path)), path


REPO = PKG.parent
# every Python file of the repository (the venv and git internals aside)
REPO_PY = sorted(p for p in REPO.rglob("*.py")
                 if not any(part.startswith(".") for part in p.relative_to(REPO).parts))


def test_package_imports_nothing_from_the_repository_scripts():
    """The installed package must work outside a checkout: no imports of benchmarks/, tests/
    or tools/, and no sys.path manipulation."""
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        for name in imports_of(path):
            if name.split(".")[0] in ("benchmarks", "tests", "tools", "conftest"):
                bad.append(f"{path.relative_to(REPO)}: imports {name}")
    assert not bad, "\n".join(bad)


def _script_module_names() -> set[str]:
    """Top-level names of the modules and packages under benchmarks/, tests/ and tools/: what a
    script there (its own folder on sys.path) or a test (pytest's ``pythonpath``, the test
    folders) can import without the ``benchmarks.`` / ``tests.`` prefix."""
    names = set()
    for top in ("benchmarks", "tests", "tools"):
        for path in (REPO / top).rglob("*.py"):
            names.add(path.stem if path.name != "__init__.py" else path.parent.name)
    return names - {"__init__"}


def test_package_imports_no_module_of_the_repository_scripts():
    """Nor by the bare name a script's folder (or pytest's ``pythonpath``) makes importable:
    ``align_reference`` (benchmarks/), the test helpers."""
    local = _script_module_names()
    assert {"align_reference", "conftest"} <= local
    bad = [f"{path.relative_to(REPO)}: imports {name}" for path in sorted(PKG.rglob("*.py"))
           for name in imports_of(path) if name.split(".")[0] in local]
    assert not bad, "\n".join(bad)


def test_no_sys_path_manipulation_anywhere():
    """Scripts import the installed package; tests get their folders from pytest (rootdir
    import); subprocesses get PYTHONPATH. Inserting into sys.path is never needed."""
    words = ["sys.path." + verb for verb in ("insert", "append")]
    bad = [str(p.relative_to(REPO)) for p in REPO_PY
           if any(w in p.read_text(encoding="utf-8") for w in words)]
    assert not bad, "sys.path manipulation in: " + ", ".join(bad)


def test_benchmarks_and_tests_do_not_import_each_other():
    bad = []
    for path in REPO_PY:
        top = path.relative_to(REPO).parts[0]
        other = {"benchmarks": "tests", "tests": "benchmarks"}.get(top)
        if other and any(n.split(".")[0] == other for n in imports_of(path)):
            bad.append(str(path.relative_to(REPO)))
    assert not bad, "\n".join(bad)


def test_tests_import_benchmark_support_packages_not_scripts(pytestconfig):
    """Tests may import the support packages of the folders pytest's ``pythonpath`` adds
    (``benchmarks/align_reference``), never a benchmark script by its bare name."""
    folders = [Path(f) for f in pytestconfig.getini("pythonpath")]
    scripts = {p.stem for f in folders for p in f.glob("*.py")}
    packages = {p.parent.name for f in folders for p in f.glob("*/__init__.py")}
    assert "align_reference" in packages and not scripts & packages
    bad = [f"{p.relative_to(REPO)}: imports {n}" for p in REPO_PY
           if p.relative_to(REPO).parts[0] == "tests"
           for n in imports_of(p) if n.split(".")[0] in scripts]
    assert not bad, "\n".join(bad)


def test_tokenizer_patterns_live_in_tokenization():
    """Pre-tokenizer regex patterns (GPT-2, Llama-3, ...) are defined once, in tokenization/."""
    marker = r"\p{L}+"  # a piece every byte-level BPE pattern has
    users = [str(p.relative_to(REPO)) for p in PKG.rglob("*.py")
             if marker in p.read_text(encoding="utf-8")]
    assert users and all(u.startswith("xdistill/tokenization/") for u in users), users


def _imported_modules(path: Path) -> list[str]:
    """Like :func:`imports_of`, but ``from a import b`` also yields ``a.b`` (``b`` may be a
    module: ``from xdistill.train import setup``)."""
    return import_graph.imported_names(path, candidates=True)


def test_trainer_core_imports_no_mode():
    """The trainer core and the mode contract import no mode-specific module (TYPE_CHECKING and
    function-local imports included): the off- and on-policy modes import the core."""
    modes = {f"xdistill.train.{m}" for m in ("offpolicy", "onpolicy", "onpolicy_step",
                                             "onpolicy_config", "config", "setup", "step",
                                             "evaluate", "pipeline")}
    bad = [f"{name}: {imp}" for name in ("core", "mode", "run_config")
           for imp in _imported_modules(PKG / "train" / f"{name}.py")
           if imp in modes or any(imp.startswith(m + ".") for m in modes)]
    assert not bad, "\n".join(bad)


# Function-local imports (CONTRIBUTING.md, "Import rules"): an import inside a function is allowed
# only where it defers something, and says what and why in a marker comment on its line or the
# line above (one comment may head a run of adjacent imports):
#     # deferred: torch (keeps `xdistill --help` fast)
DEFERRED_MARK = "# deferred: "


# every Import/ImportFrom node (relative ones too) anywhere under a (async) function, in source
# order: the imports the cycle test and the stages picture count as deferred
function_local_imports = import_graph.function_local_imports


def _uncovered(lines: list[str], nodes: list) -> list:
    """The nodes without a marker on their first line or the line above; an import whose previous
    non-blank line ends a covered function-local import shares that import's marker."""
    ends = {n.end_lineno: n for n in nodes}
    covered: set[int] = set()
    bad = []
    for n in nodes:  # in line order, so a block's head is decided first
        above = n.lineno - 2
        while above >= 0 and not lines[above].strip():
            above -= 1
        if (DEFERRED_MARK in lines[n.lineno - 1]
                or (above == n.lineno - 2 and lines[above].strip().startswith(DEFERRED_MARK))
                or (ends.get(above + 1) is not None and id(ends[above + 1]) in covered)):
            covered.add(id(n))
        else:
            bad.append(n)
    return bad


def test_function_local_imports_say_what_they_defer():
    total, bad = 0, []
    for path in sorted(PKG.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        nodes = function_local_imports(ast.parse(text))
        total += len(nodes)
        bad += [f"{path.relative_to(REPO)}:{n.lineno}: {ast.unparse(n)}"
                for n in _uncovered(text.splitlines(), nodes)]
    assert not bad, (f"{len(bad)} of the {total} function-local imports in xdistill/ have no "
                     f"'{DEFERRED_MARK.strip()} <what> (<why>)' comment; move each to the "
                     "module's top, or say what it defers:\n"
                     + "\n".join(bad))
    assert total > 0, "no function-local imports found: the scan is broken"


def test_the_deferred_marker_check_sees_nested_and_relative_imports():
    src = ("import os\n"
           "def f():\n"
           "    # deferred: torch (test)\n"
           "    import torch\n"
           "\n"
           "    from . import x\n"
           "    def g():\n"
           "        from .y import z  # deferred: y (test)\n"
           "    class C:\n"
           "        def m(self):\n"
           "            import json\n")
    nodes = function_local_imports(ast.parse(src))
    assert [n.lineno for n in nodes] == [4, 6, 8, 11]
    assert [n.lineno for n in _uncovered(src.splitlines(), nodes)] == [11]
