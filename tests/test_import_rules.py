"""Import rules of CONTRIBUTING.md: each stage imports only what it may (checked on the AST)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "xdistill"
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
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


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
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


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
