"""JAX backend: the spec as a tree of Flax NNX modules (native.py) trained by one jitted XLA
step of Optax transformations (model.py); runs in its own environment (.venv-jax: JAX needs
NumPy 2, which the main environment's MXNet rules out), so the main interpreter reaches it
through a worker, and in process wherever the interpreter imports jax.

This file declares the backend (``BACKEND``) without importing JAX; every module here that
uses it imports framework.py first. That environment has no Pillow, so JAX is fed by the NumPy
pipeline from the calling process."""
from ..info import BackendInfo

BACKEND = BackendInfo(name="jax", framework="jax", environment="jax",
                      imports=("jax", "flax", "optax"),
                      pipeline="tbdzoo.pipelines.numpy",
                      feeds_from_here="its environment has no Pillow to decode the JPEGs")
