"""One subpackage per framework, imported only when first used, plus the worker machinery."""
from .registry import BACKEND_NAMES, build, build_native, list_backends

__all__ = ["BACKEND_NAMES", "build", "build_native", "list_backends"]
