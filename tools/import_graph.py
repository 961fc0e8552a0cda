"""The package's import graph from the source alone (ast, nothing imported): module-level imports and cycles.

An edge ``a -> b`` means that importing module ``a`` imports module ``b`` while ``a`` runs its module
body: ``import b`` / ``from b import x`` at module level (also under ``if`` / ``try`` / ``with`` and in
class bodies), not inside functions, and not under ``if TYPE_CHECKING:``. ``from pkg import name``
points at ``pkg.name`` when that is a module, else at ``pkg``. ``tests/unit/test_package_shape.py``
asserts that the graph has no cycle; run this file to print the graph's cycles::

    python tools/import_graph.py [package_dir]
"""

from __future__ import annotations

import ast
import pathlib
import sys


def module_names(package_dir: pathlib.Path) -> dict[str, pathlib.Path]:
    """``{dotted module name: path}`` of every ``.py`` file under ``package_dir`` (a package)."""
    root = package_dir.parent
    names = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level_imports(body, in_function: bool = False):
    """(node, runs_at_import) for every import statement in ``body``, recursively."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, not in_function
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _module_level_imports(node.body, True)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _module_level_imports(node.body, True)
            yield from _module_level_imports(node.orelse, in_function)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                yield from _module_level_imports(getattr(node, field, []) or [], in_function)


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(package_dir: pathlib.Path) -> dict[str, list[tuple[str, bool]]]:
    """``{module: [(imported module, runs at import time)]}`` over the package's modules (all imports)."""
    names = module_names(package_dir)
    graph = {}
    for name, path in names.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        out = []
        for node, at_import in _module_level_imports(tree.body):
            if isinstance(node, ast.Import):
                out += [(alias.name, at_import) for alias in node.names]
                continue
            base = _resolve(node, name, is_package)
            for alias in node.names:
                target = f"{base}.{alias.name}"
                out.append((target if target in names else base, at_import))
        graph[name] = out
    return graph


def module_level_graph(package_dir: pathlib.Path) -> dict[str, set[str]]:
    """Edges among the package's own modules that run at import time."""
    names = module_names(package_dir)
    return {
        name: {target for target, at_import in targets if at_import and target in names and target != name}
        for name, targets in imports(package_dir).items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


if __name__ == "__main__":
    pkg = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[1] / "hybridtf")
    found = cycles(module_level_graph(pkg))
    for component in found:
        print("cycle:", " <-> ".join(component))
    print(f"{len(found)} import cycle(s) among {len(module_names(pkg))} modules")
    raise SystemExit(1 if found else 0)
