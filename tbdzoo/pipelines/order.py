"""Which examples an epoch visits, in which order, on which rank: one seeded NumPy permutation
per epoch, shared by every pipeline and framework, then split across data-parallel ranks."""
import numpy as np

__all__ = ["epoch_order", "batch_plan"]


def epoch_order(n, seed=0, epoch=0, shuffle=True, rank=0, world_size=1):
    """Dataset indices of ``rank``'s share of ``epoch``. The permutation is
    ``default_rng([seed, epoch]).permutation(n)``; with ``world_size`` ranks it is first padded
    by wrapping to a multiple of ``world_size`` (as PyTorch's DistributedSampler does: every
    rank gets the same count, a few examples twice), then rank r takes positions r, r + W, ..."""
    if not 0 <= rank < world_size:
        raise ValueError("rank {} is outside 0..{} (world size {})".format(
            rank, world_size - 1, world_size))
    if n < 1:
        raise ValueError("an empty data set has no order")
    order = np.random.default_rng([int(seed), int(epoch)]).permutation(n) if shuffle \
        else np.arange(n)
    padded = -(-n // world_size) * world_size
    order = np.concatenate([order, order[:padded - n]]) if padded > n else order
    return order[rank::world_size]


def batch_plan(n, batch_size, seed=0, epoch=0, epochs=1, shuffle=True, rank=0, world_size=1,
               drop_last=True):
    """Lists of (epoch, index) pairs, one list a batch, for ``epochs`` epochs from ``epoch``
    (``epochs=None``: without end). ``drop_last`` leaves out an epoch's last partial batch
    (fixed shapes for static graphs); a share smaller than one batch is an error."""
    e = int(epoch)
    while epochs is None or e < epoch + epochs:
        order = epoch_order(n, seed, e, shuffle, rank, world_size)
        if drop_last and len(order) < batch_size:
            raise ValueError("a batch of {} needs at least that many examples per rank; this "
                             "share has {} (of {} examples, {} rank(s))".format(
                                 batch_size, len(order), n, world_size))
        stop = len(order) - len(order) % batch_size if drop_last else len(order)
        for start in range(0, stop, batch_size):
            yield [(e, int(i)) for i in order[start:start + batch_size]]
        e += 1
