"""A data-parallel rank's part of a global batch that every rank draws alike (the NumPy
batches of the translation and speech tasks): its contiguous slice, and the weight of its
gradient, which only the whole batch tells when the loss averages over target tokens
(tbdzoo.distributed.world.gradient_weight; docs/distributed.md, "Loss weighting")."""

from ..distributed.world import gradient_weight, shard

__all__ = ["rank_slice"]


def rank_slice(model, batch, rank, world_size):
    """Rank ``rank``'s rows of ``batch``; sets ``model.world.gradient_weight`` for them."""
    if world_size == 1:
        return batch
    model.world.gradient_weight = gradient_weight(model.spec, batch, rank, world_size)
    return shard(model.spec, batch, rank, world_size)
