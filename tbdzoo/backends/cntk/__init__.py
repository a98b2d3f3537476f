"""CNTK 2.7 backend: the spec as a ``cntk.Function``; runs only in the Python 3.6 environment
(.venv-cntk), so the main interpreter reaches it through a worker."""
import os


def _cap_openmp_teams():
    """Make CNTK keep to OMP_NUM_THREADS. Some of CNTK's parallel regions ask OpenMP for a team
    of every core whatever OMP_NUM_THREADS says, and the extra thread spins after each region:
    on a busy 2-core host a one-thread Inception-v3 proxy step took 0.5-1.4 s instead of
    0.25 s. OMP_THREAD_LIMIT caps every team; it must be set before CNTK loads OpenMP."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0 and "OMP_THREAD_LIMIT" not in os.environ:
        os.environ["OMP_THREAD_LIMIT"] = threads


_cap_openmp_teams()

from .model import Model  # noqa: E402  (after the cap: importing it loads OpenMP)

__all__ = ["Model"]
