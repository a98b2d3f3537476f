"""CNTK 2.7 backend: the spec as a ``cntk.Function``; runs only in the Python 3.6 environment
(.venv-cntk), so the main interpreter reaches it through a worker.

OpenMP teams are left as CNTK asks for them. Capping them (``OMP_THREAD_LIMIT``) deadlocks
MKL-ML's 1x1 weight-gradient kernel on AVX-512 CPUs: its reduction waits for team members the
limit never starts (docs/benchmarks.md, "CNTK proxy steps")."""
from .model import Model

__all__ = ["Model"]
