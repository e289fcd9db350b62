"""The GPU-only tests still call the project as it is.

``tests/test_gpu_4bit.py`` is skipped wherever bitsandbytes or CUDA is missing, which is every CI run,
so a renamed or removed argument there goes unnoticed until a GPU is lent (on 2026-12-04 two of its
tests failed on the H200 that way: ``local_update`` had lost its ``objective`` keyword). This test
reads that file without running it and binds every call of a function it imports from the project to
that function's signature.
"""
from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

GPU_TESTS = Path(__file__).with_name("test_gpu_4bit.py")
PROJECT_PACKAGES = ("tasks", "strategies", "client_app", "server_app")


def _project_imports(tree: ast.Module) -> dict:
    """name -> the project function or class it is bound to by a top-level ``from ... import``."""
    imported = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PROJECT_PACKAGES:
            module = importlib.import_module(node.module)
            for alias in node.names:
                imported[alias.asname or alias.name] = getattr(module, alias.name)
    return imported


def _calls(tree: ast.Module, names: set[str]):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
            yield node


def _bind(target, call: ast.Call) -> None:
    """Bind placeholders for the call's positional and keyword arguments (``*x`` / ``**x`` skip the check)."""
    if any(isinstance(arg, ast.Starred) for arg in call.args) or any(kw.arg is None for kw in call.keywords):
        return
    signature = inspect.signature(target)
    signature.bind(*[None] * len(call.args), **{kw.arg: None for kw in call.keywords})


def test_every_project_call_in_the_gpu_tests_binds_to_the_current_signature():
    tree = ast.parse(GPU_TESTS.read_text())
    imported = {name: obj for name, obj in _project_imports(tree).items() if callable(obj)}
    calls = list(_calls(tree, set(imported)))
    assert len(calls) >= 10, "the GPU tests call the project's functions; the parse found too few"
    wrong = []
    for call in calls:
        try:
            _bind(imported[call.func.id], call)
        except TypeError as error:
            wrong.append(f"line {call.lineno}: {call.func.id}: {error}")
    assert not wrong, "calls that no longer match the project's signatures:\n" + "\n".join(wrong)


def test_the_check_catches_a_keyword_the_function_does_not_take():
    from tasks.llm.federation_model import local_update

    call = ast.parse("local_update(m, t, r, objective='ce', cfg=c, epochs=1, lr=1.0, seed=0)").body[0].value
    try:
        _bind(local_update, call)
    except TypeError as error:
        assert "objective" in str(error)
    else:
        raise AssertionError("an unknown keyword was bound")
