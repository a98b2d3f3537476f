"""Data for training steps: synthetic batches now, real-format readers later. NumPy out."""
from . import synthetic

__all__ = ["synthetic"]
