"""The package's shape, read from the source: no import circles, stands alone, one version, short files.

Nothing here imports the package's modules: the import graph comes from ``tools/import_graph.py``
(ast only), so a circle shows up even where lazy imports would hide it at run time.
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys

import pytest

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hybridtf"
sys.path.insert(0, str(ROOT / "tools"))
import import_graph  # noqa: E402

MAX_LINES = 600
SOURCE_DIRS = ("hybridtf", "kernels", "benchmarks", "examples", "tests", "tools")
SOURCE_SUFFIXES = (".py", ".cc", ".h", ".cu", ".sh", ".bzl")


def _graph(deferred: bool) -> dict[str, set[str]]:
    if not deferred:
        return import_graph.module_level_graph(PACKAGE)
    names = import_graph.module_names(PACKAGE)
    return {
        name: {target for target, _ in targets if target in names and target != name}
        for name, targets in import_graph.imports(PACKAGE).items()
    }


def test_cycle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_graph.cycles(graph) == [["a", "b", "c"]]
    assert import_graph.cycles({"a": {"b"}, "b": set()}) == []


def test_import_graph_reads_module_level_and_deferred_imports(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n"
        "def f():\n    from . import a\n    return a\n"
    )
    assert import_graph.module_level_graph(pkg) == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": set()}
    assert ("pkg.a", False) in import_graph.imports(pkg)["pkg.b"]


@pytest.mark.parametrize("deferred", [False, True], ids=["module_level", "with_deferred_imports"])
def test_no_import_circles_in_the_package(deferred):
    """No circle among module-level imports; none either counting imports inside functions."""
    found = import_graph.cycles(_graph(deferred))
    assert found == [], "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_package_never_imports_benchmarks_examples_or_tests():
    offenders = [
        f"{name} imports {target}"
        for name, targets in import_graph.imports(PACKAGE).items()
        for target, _ in targets
        if target.split(".")[0] in ("benchmarks", "examples", "tests")
    ]
    assert offenders == []


def test_no_source_file_over_600_lines():
    long_files = []
    for folder in SOURCE_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in SOURCE_SUFFIXES and path.is_file() and "build" not in path.relative_to(ROOT).parts:
                lines = len(path.read_text(errors="replace").splitlines())
                if lines > MAX_LINES:
                    long_files.append(f"{path.relative_to(ROOT)}: {lines}")
    assert long_files == [], f"split these along a real seam (limit {MAX_LINES} lines)"


def _package_version() -> str:
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("hybridtf/__init__.py sets no __version__")


@pytest.mark.skipif(tomllib is None, reason="tomllib needs Python 3.11")
def test_one_version_number_in_one_place():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "hybridtf.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", _package_version())
    import hybridtf

    assert hybridtf.__version__ == _package_version()


def _defined_names(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def test_package_docstrings_name_only_modules_and_names_that_exist():
    """Every ``hybridtf.x.y`` an ``__init__`` docstring (or a public module's) names exists."""
    modules = import_graph.module_names(PACKAGE)
    lazy = {"function", "micro_batch_gradients"}  # the package's lazy attributes
    compiled = {"hybridtf._native", "hybridtf._src.run._hybridtf_ops"}  # extension modules (setup.py)
    missing = []
    docs = [p for p in PACKAGE.rglob("__init__.py")] + sorted(PACKAGE.glob("*.py"))
    for path in docs:
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        for ref in sorted(set(re.findall(r"\bhybridtf(?:\.\w+)+", doc))):
            parts = ref.split(".")
            prefix = max((i for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in modules), default=0)
            rest = parts[prefix:]
            module = ".".join(parts[:prefix])
            if not rest or (module == "hybridtf" and rest[0] in lazy) or ref in compiled:
                continue
            if rest[0] not in _defined_names(modules[module]):
                missing.append(f"{path.relative_to(ROOT)}: {ref}")
    assert missing == []
