"""The layout shows the architecture (docs/architecture.md), and these tests keep it so.

- Every package of the runtime has an ``__init__`` whose ``__all__`` is its whole
  surface, and every name there resolves.
- A private module (``_name``) is private to its package: only modules inside that
  package (or below it) import it. Another package goes through the surface.
- Imports run down the layers, never up; module-level imports form no circle.
"""

from __future__ import annotations

import ast
import functools
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAME = {"runtime": "warmstart.runtime", "app": "warmstart.app"}

# Lowest first. A package may import its own layer and the layers below it. The shared
# vocabulary (errors, types, settings and runtime's own private helpers) is the base.
LAYERS = [
    {"base"},
    {"hardware"},
    {"policy", "kvstore"},
    {"models", "engine"},
    {"serving"},
    {"api", "bench"},
    {"cli"},
]
RUNTIME_PACKAGES = [name for layer in LAYERS[1:] for name in layer]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@functools.cache
def _sources() -> tuple[tuple[str, str, ast.Module], ...]:
    """(module, its package, its tree) for every module of runtime/ and app/ (the app's
    imports of the runtime too: the private-module rule covers them)."""
    found = []
    for top in NAME:
        for path in sorted((ROOT / top).rglob("*.py")):
            module = _module_name(path)
            package = module if path.name == "__init__.py" else module.rpartition(".")[0]
            found.append((module, package, ast.parse(path.read_text("utf-8"))))
    return tuple(found)


def _targets(package: str, nodes: Iterator[ast.AST]) -> Iterator[tuple[int, str, list[str]]]:
    """(line, absolute module, names) for each relative import among ``nodes``."""
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level:
            parts = package.split(".")
            base = parts[: len(parts) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
            yield node.lineno, module, [a.name for a in node.names]


def _all_imports() -> Iterator[tuple[str, int, str]]:
    """(importer, line, imported module) for every relative import, function bodies too;
    ``from . import _x`` counts as an import of the module ``_x``."""
    for module, package, tree in _sources():
        for line, target, names in _targets(package, ast.walk(tree)):
            yield module, line, target
            for name in names:
                if (
                    name.startswith("_")
                    and (ROOT / target.replace(".", "/") / f"{name}.py").exists()
                ):
                    yield module, line, f"{target}.{name}"


def _private_owner(module: str) -> str | None:
    """The package a private module belongs to; None for a public one."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def test_no_module_imports_another_packages_private_module() -> None:
    wrong = []
    for importer, line, target in _all_imports():
        owner = _private_owner(target)
        if owner is not None and not (importer == owner or importer.startswith(owner + ".")):
            wrong.append(f"{importer}:{line} imports {target}")
    assert wrong == []


def _layer(module: str) -> int | None:
    """The layer of a runtime module; None outside the runtime and for its surface."""
    parts = module.split(".")
    if parts[0] != "runtime" or module == "runtime":
        return None
    name = parts[1] if len(parts) > 1 else ""
    for i, layer in enumerate(LAYERS):
        if name in layer:
            return i
    return 0  # errors, types, settings, _private, sqlite, _progress, _embed_queue


def test_imports_run_down_the_layers() -> None:
    up = []
    for importer, line, target in _all_imports():
        a, b = _layer(importer), _layer(target)
        if a is not None and b is not None and b > a:
            up.append(f"{importer}:{line} imports {target} (layer {b} above {a})")
    assert up == []


def _module_level_graph() -> dict[str, set[str]]:
    """Imports run when a module loads (not those in functions or under TYPE_CHECKING)."""
    modules = {module for module, _, _ in _sources()}
    graph: dict[str, set[str]] = {}
    for module, package, tree in _sources():
        nodes = [n for n in tree.body if isinstance(n, ast.ImportFrom)]
        for _, target, names in _targets(package, iter(nodes)):
            for name in names:
                if f"{target}.{name}" in modules:
                    graph.setdefault(module, set()).add(f"{target}.{name}")
            if target in modules and target != module:
                graph.setdefault(module, set()).add(target)
    return graph


def test_no_import_circle_between_modules() -> None:
    graph = _module_level_graph()
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> None:
        if module in path:
            pytest.fail(" -> ".join([*path[path.index(module) :], module]))
        if module in done:
            return
        path.append(module)
        for target in sorted(graph.get(module, ())):
            # a module's own package is loaded before it: ``from . import _x`` is no circle
            if not module.startswith(target + "."):
                visit(target)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


@pytest.mark.parametrize("package", ["", *RUNTIME_PACKAGES])
def test_each_package_surface_is_its_all(package: str) -> None:
    name = f"{NAME['runtime']}.{package}".rstrip(".")
    module = importlib.import_module(name)
    assert sorted(module.__all__) == sorted(set(module.__all__)), "a name twice"
    for attr in module.__all__:
        assert getattr(module, attr) is not None, f"{name}.{attr}"
    public = {
        n
        for n, v in vars(module).items()
        if not n.startswith("_")
        and type(v).__name__ != "module"
        and n not in ("Any", "TYPE_CHECKING")
    }
    assert public <= set(module.__all__), f"{name} shows more than its __all__"


def test_every_runtime_package_is_in_a_layer() -> None:
    found = {p.parent.name for p in (ROOT / "runtime").glob("*/__init__.py")}
    assert found == set(RUNTIME_PACKAGES)
