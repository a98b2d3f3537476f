"""JAX imported the way the backend needs it: every module of this folder that uses JAX
imports this one first.

float32 throughout (64-bit types stay off, JAX's default), and float32 matrix products and
convolutions at full precision: on a GPU JAX's default precision rounds their inputs to
TF32/bfloat16, which the float64 reference would see as an error of 1e-3. The notes XLA's
libraries print as they load are filtered out unless ``tbd --verbose``
(tbdzoo.backends.common.quiet)."""
from ..common.quiet import filtered_native_stderr, ignore_framework_warnings

# Lines JAX's and XLA's libraries print as they load: the missing-GPU notice and absl's
# preamble.
BANNERS = (r"An NVIDIA GPU may be present on this machine, but a CUDA-enabled jaxlib",
           r"^WARNING: All log messages before absl::InitializeLog",
           r"^I0000 ", r"^W0000 ")

ignore_framework_warnings(("jax", "flax", "optax", "orbax"))
with filtered_native_stderr(BANNERS):
    import jax
    import optax  # noqa: F401  (imported here, quietly, with what it imports)
    from flax import nnx  # noqa: F401

jax.config.update("jax_enable_x64", False)
jax.config.update("jax_default_matmul_precision", "highest")
