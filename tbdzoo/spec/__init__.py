"""The framework-neutral model specification. Imports no framework; valid Python 3.6."""
from . import ops, padding
from .graph import SPEC_VERSION, Graph, Input, Node, ParamSpec
from .init import initial_weights

__all__ = ["Graph", "Input", "Node", "ParamSpec", "SPEC_VERSION", "initial_weights", "ops",
           "padding"]
