"""The NumPy feed: Pillow decodes and transforms (the reference of tbdzoo/pipelines/augment.py),
``workers`` threads build the examples of a batch (Pillow releases the GIL while it decodes
and resizes) and a background thread keeps ``prefetch`` batches ready. It feeds CNTK, whose
worker runs in another interpreter (docs/pipelines.md says why), and any backend as the
reference the framework pipelines are tested against."""
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import augment
from .common import check_source
from .order import batch_plan
from .prefetch import Prefetcher

__all__ = ["NAME", "loader", "as_numpy", "feed", "transform"]

NAME = "NumPy feed (Pillow, threads)"


def transform(source, spec, seed, epoch, index):
    """One example: float32 (3, size, size) and its label."""
    image = source.image(index)
    params = augment.draw(spec, seed, epoch, index, image.shape[0], image.shape[1])
    return augment.reference(image, spec, params), int(source.labels[index])


def _batches(source, spec, plan, seed, pool):
    for chunk in plan:
        if pool is None:
            examples = [transform(source, spec, seed, e, i) for e, i in chunk]
        else:
            examples = list(pool.map(lambda p: transform(source, spec, seed, p[0], p[1]), chunk))
        yield {"images": np.stack([x for x, _ in examples]),
               "labels": np.asarray([y for _, y in examples], np.int32)}


def loader(source, spec, batch_size, seed=0, epoch=0, epochs=1, shuffle=True, workers=0,
           prefetch=2, rank=0, world_size=1, drop_last=True, deterministic=True):
    """Batches {"images": float32 (N, 3, S, S), "labels": int32 (N,)} of ``epochs`` epochs
    (None: without end). Always in order, so ``deterministic`` changes nothing here."""
    check_source(source, batch_size, workers, prefetch)
    plan = batch_plan(len(source), batch_size, seed, epoch, epochs, shuffle, rank, world_size,
                      drop_last)
    pool = ThreadPoolExecutor(workers) if workers else None
    return Prefetcher(_batches(source, spec, plan, seed, pool), prefetch)


def as_numpy(batch):
    return batch


def feed(batch):
    """What ``model.prepare_batch`` takes."""
    return batch
