"""The framework-neutral model specification. Imports no framework; valid Python 3.6."""
from .graph import Graph, Input, Node, ParamSpec, SPEC_VERSION
from .init import initial_weights
from . import ops, padding

__all__ = ["Graph", "Input", "Node", "ParamSpec", "SPEC_VERSION", "initial_weights", "ops",
           "padding"]
