"""The .pyi stub of the native module matches the module, and the package exports exist."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import awa
from awa import _awa


def _stub() -> ast.Module:
    path = Path(awa.__file__).with_name("_awa.pyi")
    return ast.parse(path.read_text())


def test_stub_names_match_the_native_module() -> None:
    stub = _stub()
    stubbed: dict[str, set[str]] = {}
    top: set[str] = set()
    for node in stub.body:
        if isinstance(node, ast.ClassDef):
            top.add(node.name)
            stubbed[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("__")}
        elif isinstance(node, ast.FunctionDef):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top.add(node.target.id)
    native = {n for n in dir(_awa) if not n.startswith("_")}
    assert top == native, f"stub-only: {top - native}; module-only: {native - top}"
    for cls, methods in stubbed.items():
        actual = {n for n, _ in inspect.getmembers(getattr(_awa, cls)) if not n.startswith("_")}
        if issubclass(getattr(_awa, cls), BaseException):
            continue
        assert methods == actual, f"{cls}: stub-only {methods - actual}; module-only {actual - methods}"


def test_public_exports_exist_and_errors_are_typed() -> None:
    for name in awa.__all__:
        assert hasattr(awa, name), name
    assert issubclass(awa.StagingError, awa.TerminalError)
    for name in ["UniqueConflict", "SchemaNotMigrated", "UnknownJobKind", "SerializationError",
                 "ValidationError", "TerminalError", "DatabaseError", "CallbackNotFound"]:
        assert issubclass(getattr(awa, name), awa.AwaError)
    assert (Path(awa.__file__).parent / "py.typed").exists()
