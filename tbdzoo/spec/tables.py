"""Constant tables some node types add to their inputs, in NumPy, so every backend adds the
same numbers (computed in float64, stored as float32)."""
import numpy as np


def sinusoid_table(length, dim):
    """positional_encoding: PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(p / 10000^(2i/D))."""
    position = np.arange(length, dtype=np.float64)[:, None]
    rate = np.power(10000.0, -np.arange(0, dim, 2, dtype=np.float64) / dim)
    table = np.zeros((length, dim), np.float64)
    table[:, 0::2] = np.sin(position * rate)
    table[:, 1::2] = np.cos(position * rate[: dim // 2])
    return table.astype(np.float32)
