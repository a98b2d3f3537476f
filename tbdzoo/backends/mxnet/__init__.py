"""MXNet 1.9 (Gluon) backend: the spec as a hybridized ``gluon.HybridBlock``."""
import numpy as _np

if "bool" not in vars(_np):  # mxnet 1.9.1 reads numpy.bool, which numpy 1.24 removed
    _np.bool = bool

from .model import Model, SpecBlock  # noqa: E402  (needs the line above first)

__all__ = ["Model", "SpecBlock"]
