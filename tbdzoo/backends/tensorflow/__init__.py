"""TensorFlow 2 / Keras 3 backend: the spec as a ``keras.Model`` computing in NHWC (model.py).

This file declares the backend (``BACKEND``) without importing TensorFlow; every module here
that uses it imports framework.py first, which imports TensorFlow quietly."""
from ..info import BackendInfo

BACKEND = BackendInfo(name="tensorflow", framework="tensorflow", environment="main",
                      imports=("tensorflow", "keras"))
