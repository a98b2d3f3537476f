"""Which node types each backend implements, read from the one place that declares them: a
backend implements op ``x`` when its ``ops.py`` defines a module-level function ``x``.

The source is read, not imported, so the answer needs no framework: the CNTK backend's ops are
known in an interpreter that cannot import cntk, and a model that uses an op its backend lacks
is refused before anything is built or any worker started.
"""
import ast
import os

from ...errors import UnsupportedOpError
from ...spec import ops as spec_ops

_BACKENDS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DEFINED = {}


def ops_module_path(backend):
    return os.path.join(_BACKENDS_DIR, backend, "ops.py")


def _defined_functions(backend):
    if backend not in _DEFINED:
        with open(ops_module_path(backend), encoding="utf-8") as f:
            tree = ast.parse(f.read(), ops_module_path(backend))
        _DEFINED[backend] = frozenset(node.name for node in tree.body
                                      if isinstance(node, ast.FunctionDef))
    return _DEFINED[backend]


def implemented(backend):
    """The spec's op names (tbdzoo/spec/ops.py ``names()``, in its order) ``backend`` implements."""
    defined = _defined_functions(backend)
    return [op for op in spec_ops.names() if op in defined]


def missing(backend):
    """The spec's op names ``backend`` lacks."""
    defined = _defined_functions(backend)
    return [op for op in spec_ops.names() if op not in defined]


def check(graph, backend):
    """Refuse ``graph`` when ``backend`` lacks one of its ops, naming the op, the node, the
    backend and the file where the op would go."""
    defined = _defined_functions(backend)
    for node in graph.nodes.values():
        if node.op not in defined:
            raise UnsupportedOpError(
                "backend {} does not implement op {!r} (node {!r} of {}); it implements: {}. "
                "Run the model on another backend, or add a function {!r} to {} "
                "(docs/backends.md, 'Adding an op')".format(
                    backend, node.op, node.name, graph.name, ", ".join(implemented(backend)),
                    node.op, os.path.relpath(ops_module_path(backend),
                                             os.path.dirname(os.path.dirname(_BACKENDS_DIR)))))
