"""One subpackage per framework, imported only when first used, plus the worker machinery."""
from .info import BACKEND_NAMES
from .registry import build, build_native, list_backends

__all__ = ["BACKEND_NAMES", "build", "build_native", "list_backends"]
