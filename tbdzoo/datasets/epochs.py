"""One epoch's batches of row indices, shared by the text and speech readers."""
import numpy as np

__all__ = ["epoch_rows"]


def epoch_rows(order, batch_size, seed=None, drop_last=False):
    """The rows of ``order`` in batches of ``batch_size``: shuffled by ``seed`` (as given when
    None); the last, smaller batch kept unless ``drop_last``."""
    order = np.array(order)
    if seed is not None:
        np.random.RandomState(seed).shuffle(order)
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        if drop_last and len(rows) < batch_size:
            return
        yield rows
