"""TensorFlow imported the way the backend needs it: every module of this folder that uses
TensorFlow or Keras imports this one first.

Three things happen as TensorFlow is first imported: its C++ logging is quietened (only when
the user has not chosen a level, and not under ``tbd --verbose``), because its start-up chatter
drowns the benchmark output; the banners it writes before that setting applies (absl's
pre-initialisation note, oneDNN's and the CPU feature guard's) and Python warnings about
TensorFlow and Keras themselves are filtered out (tbdzoo.backends.common.quiet); and triton is
loaded first where it is installed (see ``_load_triton_first``).
"""
import importlib.util
import os
import sys

from ..common.quiet import filtered_native_stderr, ignore_framework_warnings, verbose

if not verbose():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Lines TensorFlow's libraries print while they load, whatever TF_CPP_MIN_LOG_LEVEL says.
BANNERS = (
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    r"\] oneDNN custom operations are on\.",
    r"This TensorFlow binary is optimized to use available CPU instructions",
    r"^To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler",
    r"Unable to register cu(DNN|FFT|BLAS) factory",
    r"computation placer already registered",
    r"TF-TRT Warning: Could not find TensorRT",
)


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
        import triton  # noqa: F401  (loaded for its side effect: before TensorFlow, see above)
    except Exception:  # noqa: BLE001  (a broken triton is PyTorch's problem, not a reason to fail here)
        pass


_load_triton_first()
ignore_framework_warnings(("tensorflow", "keras", "tf_keras", "google.protobuf", "absl"))
with filtered_native_stderr(BANNERS):
    import tensorflow  # noqa: F401  (its banners are written here)
