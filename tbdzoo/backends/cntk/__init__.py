"""CNTK 2.7 backend: the spec as a ``cntk.Function``; runs only in the Python 3.6 environment
(.venv-cntk), so the main interpreter reaches it through a worker."""
from .model import Model

__all__ = ["Model"]
