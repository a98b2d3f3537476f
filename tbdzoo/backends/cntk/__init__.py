"""CNTK 2.7 backend: the spec as a ``cntk.Function`` (model.py); runs only in the Python 3.6
environment (.venv-cntk), so the main interpreter reaches it through a worker.

This file declares the backend (``BACKEND``) without importing CNTK; every module here that
uses it imports framework.py first. That environment has no Pillow, so CNTK is fed by the
NumPy pipeline from the calling process, and its data-parallel ranks read no image data sets;
its Python API has no broadcast, so its ranks cannot share rank 0's stop decision."""
from ..info import BackendInfo

BACKEND = BackendInfo(name="cntk", framework="cntk", environment="cntk",
                      pipeline="tbdzoo.pipelines.numpy", broadcasts=False,
                      feeds_from_here="its Python 3.6 environment has no Pillow to decode the "
                                      "JPEGs")
