"""A backend is one folder: framework imports and backend-name decisions live only in
tbdzoo/backends/<name>/, which declares what the shared code needs to know as ``BACKEND``."""
import ast
import importlib.util
import os
import subprocess
import sys

import pytest

import tbdzoo
from tbdzoo.backends.info import BACKEND_NAMES, backend_info, backend_infos

PACKAGE_ROOT = os.path.dirname(os.path.abspath(tbdzoo.__file__))
SOURCE_ROOT = os.path.dirname(PACKAGE_ROOT)

# Calls that import a module named by their first argument.
_IMPORT_CALLS = ("import_module", "__import__", "find_spec")


def _owner(imported):
    """The backend whose folder alone may import top-level module ``imported``, or None."""
    for info in backend_infos():
        if imported in info.imports:
            return info.name
    return None


def _folder(relpath):
    """The backend whose folder holds ``relpath`` (relative to the source root), or None."""
    parts = relpath.replace(os.sep, "/").split("/")
    if len(parts) > 3 and parts[:2] == ["tbdzoo", "backends"] and parts[2] in BACKEND_NAMES:
        return parts[2]
    return None


def _imported_names(node):
    """The top-level modules an import statement or import call of ``node`` names."""
    if isinstance(node, ast.Import):
        return [a.name.split(".")[0] for a in node.names]
    if isinstance(node, ast.ImportFrom):
        return [node.module.split(".")[0]] if node.level == 0 and node.module else []
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        first = node.args[0]
        if name in _IMPORT_CALLS and isinstance(first, ast.Constant) \
                and isinstance(first.value, str):
            return [first.value.split(".")[0]]
    return []


def _backend_literals(node):
    """The backend names written as string literals among ``node``'s operands (a literal, or
    a tuple, list or set of them)."""
    found = []
    for operand in [node.left] + list(node.comparators):
        items = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
        found += [i.value for i in items
                  if isinstance(i, ast.Constant) and i.value in BACKEND_NAMES]
    return found


def violations(source, relpath):
    """'file:line: problem' for each framework import outside its backend's folder and each
    comparison with a backend name outside a backend folder, in ``source`` (the text of
    ``relpath``)."""
    here = _folder(relpath)
    out = []
    for node in ast.walk(ast.parse(source, relpath)):
        for name in _imported_names(node):
            owner = _owner(name)
            if owner is not None and owner != here:
                out.append("{}:{}: imports {}, which belongs in tbdzoo/backends/{}/".format(
                    relpath, node.lineno, name, owner))
        if isinstance(node, ast.Compare) and here is None:
            for name in _backend_literals(node):
                out.append("{}:{}: compares with the backend name {!r}; declare the fact in "
                           "tbdzoo/backends/{}/__init__.py (BACKEND) and read it from there"
                           .format(relpath, node.lineno, name, name))
    return out


def _package_sources():
    for folder, _, files in os.walk(PACKAGE_ROOT):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                yield os.path.relpath(path, SOURCE_ROOT), path


def test_framework_code_and_backend_decisions_live_in_the_backend_folders():
    found = []
    for relpath, path in _package_sources():
        with open(path, encoding="utf-8") as f:
            found += violations(f.read(), relpath)
    assert found == [], "\n".join(found)


@pytest.mark.parametrize("source, relpath, expected", [
    ("import torch\n", "tbdzoo/pipelines/x.py", ["tbdzoo/pipelines/x.py:1: imports torch"]),
    ("def f():\n    from torchvision.ops import nms\n", "tbdzoo/detection/x.py",
     ["tbdzoo/detection/x.py:2: imports torchvision"]),
    ("import keras\n", "tbdzoo/backends/mxnet/x.py", ["tbdzoo/backends/mxnet/x.py:1: imports keras"]),
    ("import importlib\nm = importlib.import_module('mxnet.nd')\n", "tbdzoo/rl/x.py",
     ["tbdzoo/rl/x.py:2: imports mxnet"]),
    ("if backend == 'cntk':\n    pass\n", "tbdzoo/suite.py", ["tbdzoo/suite.py:1: compares"]),
    ("ok = b not in ('x', 'tensorflow')\n", "tbdzoo/cli.py", ["tbdzoo/cli.py:1: compares"]),
    ("import torch\nok = b == 'torch'\n", "tbdzoo/backends/torch/x.py", []),
    ("import numpy\nok = b == 'numpy'\n", "tbdzoo/pipelines/x.py", []),
])
def test_the_check_names_each_misplaced_import_and_comparison(source, relpath, expected):
    got = violations(source, relpath)
    assert len(got) == len(expected), got
    for line, start in zip(got, expected):
        assert line.startswith(start), line


@pytest.mark.parametrize("backend", BACKEND_NAMES)
def test_each_folder_declares_its_backend_and_the_modules_it_names_exist(backend):
    info = backend_info(backend)
    assert info.name == backend
    for field in ("model", "pipeline", "async_learners", "distributed_engine", "gpu"):
        if getattr(info, field) is not None:
            path = info.module_path(field)
            assert importlib.util.find_spec(path) is not None, (backend, field, path)


def test_reading_every_descriptor_imports_no_framework():
    frameworks = sorted(set(m for info in backend_infos() for m in info.imports))
    code = ("import sys\n"
            "from tbdzoo.backends.info import backend_infos\n"
            "from tbdzoo.backends.registry import list_backends\n"
            "infos = backend_infos(); list_backends()\n"
            "print(' '.join(m for m in {!r} if m in sys.modules))\n").format(frameworks)
    proc = subprocess.run([sys.executable, "-c", code], cwd=SOURCE_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""


def test_an_unknown_backend_is_refused_by_name():
    from tbdzoo.errors import UnknownNameError
    with pytest.raises(UnknownNameError, match="caffe"):
        backend_info("caffe")
