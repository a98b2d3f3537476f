"""MXNet 1.9 (Gluon) backend: the spec as a hybridized ``gluon.HybridBlock`` (model.py).

This file declares the backend (``BACKEND``) without importing MXNet; every module here that
uses it imports framework.py first (NumPy shim, quiet import)."""
from ..info import BackendInfo

BACKEND = BackendInfo(name="mxnet", framework="mxnet", environment="main")
