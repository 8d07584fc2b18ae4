"""`_core.pyi` documents the native module exactly: every function and class, with the same parameters,
and a docstring for each (what it returns and raises)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import dflash_batch
from dflash_batch import _core

STUB = Path(dflash_batch.__file__).with_name("_core.pyi")
# Dunder methods the stub documents where the class has them (the rest are object's).
DUNDERS = {"__len__", "__getitem__"}


def stub_tree() -> ast.Module:
    return ast.parse(STUB.read_text())


def parameters(node: ast.FunctionDef) -> list[str]:
    args = node.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    return [n for n in names if n != "self"]


def native_parameters(obj: object) -> list[str]:
    signature = inspect.signature(obj)
    return [n for n in signature.parameters if n not in ("self", "$self", "$type", "args", "kwargs")]


def stub_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def stub_classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def native_names() -> tuple[set[str], set[str], set[str]]:
    public = [n for n in dir(_core) if not n.startswith("_")]
    classes = {n for n in public if inspect.isclass(getattr(_core, n))}
    constants = {n for n in public if not callable(getattr(_core, n))}
    return set(public) - classes - constants, classes, constants


def stub_constants(tree: ast.Module) -> set[str]:
    return {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and not n.target.id.startswith("_")}


def test_every_native_function_and_class_is_in_the_stub_and_nothing_else():
    tree = stub_tree()
    functions, classes, constants = native_names()
    assert set(stub_functions(tree)) == functions
    assert set(stub_classes(tree)) == classes
    assert stub_constants(tree) == constants


def test_functions_have_the_native_parameters_and_a_docstring():
    for name, node in stub_functions(stub_tree()).items():
        assert parameters(node) == native_parameters(getattr(_core, name)), name
        assert ast.get_docstring(node), f"{name} has no docstring in the stub"


def test_classes_have_the_native_members_and_parameters():
    for name, node in stub_classes(stub_tree()).items():
        cls = getattr(_core, name)
        members = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
        native = {m for m in vars(cls) if not m.startswith("_")} | (DUNDERS & set(vars(cls)))
        if issubclass(cls, Exception):  # data attributes only, annotated in the stub here or on a base
            classes = stub_classes(stub_tree())
            annotated = {
                n.target.id
                for base in cls.__mro__
                if base.__name__ in classes
                for n in classes[base.__name__].body
                if isinstance(n, ast.AnnAssign)
            }
            assert native <= annotated and not members, (name, native - annotated)
            continue
        assert set(members) - {"__init__"} == native, name
        if "__init__" in members:
            assert parameters(members["__init__"]) == native_parameters(cls), name
        for member, fn in members.items():
            if member in native and not isinstance(vars(cls)[member], property):
                obj = vars(cls)[member]
                if inspect.ismethoddescriptor(obj) and getattr(obj, "__text_signature__", None):
                    if not member.startswith("__"):
                        assert parameters(fn) == native_parameters(obj), f"{name}.{member}"
        assert ast.get_docstring(node), f"{name} has no docstring in the stub"


def test_the_stub_documents_what_each_entry_point_raises():
    """A native entry point that takes user input says what it raises."""
    tree = stub_tree()
    documented = list(stub_functions(tree).values())
    for cls in stub_classes(tree).values():
        documented += [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in ("__init__", "plan")]
    for node in documented:
        assert "Raises" in (ast.get_docstring(node) or ""), f"{node.name} does not say what it raises"
