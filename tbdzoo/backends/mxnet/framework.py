"""MXNet imported the way the backend needs it: every module of this folder that uses MXNet
imports this one first.

MXNet is imported with the deprecation warnings its NumPy shims raise about themselves (NEP 32
removals, distutils versions, SciPy's sparse namespace) ignored, and the banners its C++
libraries print as they load filtered out, unless ``tbd --verbose``
(tbdzoo.backends.common.quiet)."""
import numpy as _np

from ..common.quiet import filtered_native_stderr, ignore_framework_warnings

if "bool" not in vars(_np):  # mxnet 1.9.1 reads numpy.bool, which numpy 1.24 removed
    _np.bool = bool

# Lines MXNet's libraries print as they load: storage and library-version notes.
BANNERS = (r"^\[\d\d:\d\d:\d\d\] \.\./src/storage/storage\.cc:\d+: Using Pooled",
           r"^\[\d\d:\d\d:\d\d\] \.\./src/base\.cc:\d+: Upgrade advisory")

ignore_framework_warnings(("mxnet",))
with filtered_native_stderr(BANNERS):
    import mxnet  # noqa: F401  (its banners are written here)
