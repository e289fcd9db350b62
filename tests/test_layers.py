"""The packages' layers point one way: every import, at module level or inside a function, is read
from the source (``ast``) and checked against what its package may import."""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: package -> the project packages it must never import (whatever it does not list, it may)
FORBIDDEN = {
    "core": ("tasks", "strategies", "client_app", "server_app"),
    "tasks": ("strategies", "client_app", "server_app"),
    "strategies": ("client_app", "server_app"),
    "client_app": ("server_app",),
}


def imported_packages(path: str) -> set[tuple[str, int]]:
    """The top-level package of every ``import``/``from ... import`` in the file, with its line."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {(alias.name.split(".")[0], node.lineno) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.module.split(".")[0], node.lineno))
    return found


def modules_of(package: str) -> list[str]:
    out = []
    for folder, _, files in os.walk(os.path.join(ROOT, package)):
        out += [os.path.join(folder, f) for f in files if f.endswith(".py")]
    return sorted(out)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_nothing_from_the_layers_above_it(package):
    modules = modules_of(package)
    assert modules, f"no modules found under {package}/"
    wrong = [f"{os.path.relpath(path, ROOT)}:{line} imports {name}"
             for path in modules for name, line in sorted(imported_packages(path)) if name in FORBIDDEN[package]]
    assert wrong == []


def test_the_import_reader_sees_imports_inside_functions(tmp_path):
    source = tmp_path / "lazy.py"
    source.write_text("def f():\n    from server_app.report import write\n    import strategies.registry\n")
    assert {name for name, _ in imported_packages(str(source))} == {"server_app", "strategies"}
