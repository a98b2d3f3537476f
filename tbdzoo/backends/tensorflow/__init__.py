"""TensorFlow 2 / Keras 3 backend: the spec as a ``keras.Model`` computing in NHWC.

Two things happen before TensorFlow is first imported: its C++ logging is quietened (only when
the user has not chosen a level), because its start-up chatter drowns the benchmark output;
and triton is loaded first where it is installed (see ``_load_triton_first``).
"""
import importlib.util
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _load_triton_first():
    """TensorFlow >= 2.20 wheels load their core library with RTLD_GLOBAL, exporting their
    statically linked LLVM; a triton loaded afterwards binds to it and segfaults inside dlopen
    (tensorflow/tensorflow#124205; repro: ``import tensorflow; import triton``). PyTorch imports
    triton lazily, on its first optimizer, so any process that builds a TensorFlow model and
    then a PyTorch one (the test-suite, in-process comparisons) crashes. Loaded in this order
    the two coexist."""
    if "tensorflow" in sys.modules or importlib.util.find_spec("triton") is None:
        return
    try:
        import triton  # noqa: F401
    except Exception:  # a broken triton is PyTorch's problem, not a reason to fail here
        pass


_load_triton_first()

from .model import Model, SpecModel  # noqa: E402  (the two steps above must come first)

__all__ = ["Model", "SpecModel"]
