"""CNTK imported the way the backend needs it: every module of this folder that uses CNTK
imports this one first.

OpenMP teams are left as CNTK asks for them. Capping them (``OMP_THREAD_LIMIT``) deadlocks
MKL-ML's 1x1 weight-gradient kernel on AVX-512 CPUs: its reduction waits for team members the
limit never starts (docs/benchmarks.md, "CNTK proxy steps").

CNTK is imported without its start-up warnings (an unsupported Linux distribution, missing
optional GPU libraries) unless ``tbd --verbose`` (tbdzoo.backends.common.quiet)."""
import warnings

from ..common.quiet import filtered_native_stderr, verbose

# The line CNTK prints the first time it resolves its default device; for whoever filters a
# CNTK process's stderr.
BANNERS = (r"^Selected (CPU|GPU\[\d+\].*) as the process wide default device\.",)

if not verbose():
    warnings.filterwarnings("ignore", category=UserWarning, module=r"cntk\.cntk_py_init$")
with filtered_native_stderr(BANNERS):
    import cntk  # noqa: F401  (its warnings are raised here)
