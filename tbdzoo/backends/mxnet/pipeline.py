"""MXNet's own input pipeline: a ``gluon.data.Dataset`` and Gluon's ``DataLoader`` with worker
processes. ``mx.image.imdecode`` decodes (OpenCV inside MXNet), ``mx.image.fixed_crop`` crops
and resizes (bilinear, OpenCV's INTER_LINEAR: no antialiasing when shrinking, the one
difference from the other pipelines, docs/pipelines.md), ``nd.flip`` flips and
``nd.image.to_tensor`` / ``normalize`` scale and normalise, with the crop windows of
tbdzoo/pipelines/augment.py."""
from . import framework  # noqa: F401  (first: numpy.bool for mxnet 1.9.1, quiet import)

# isort: split
import mxnet as mx
from mxnet import gluon, nd

from ...pipelines import augment
from ...pipelines.common import check_source, decoder_failure
from ...pipelines.order import batch_plan
from ...pipelines.prefetch import Prefetcher

__all__ = ["NAME", "loader", "as_numpy", "feed", "ImageDataset"]

NAME = "gluon.data.DataLoader (MXNet {})".format(mx.__version__)
BILINEAR = 1  # OpenCV's INTER_LINEAR in mx.image's interp codes


class ImageDataset(gluon.data.Dataset):
    """Item (epoch, index) -> (float32 (3, S, S) NDArray, label)."""

    def __init__(self, source, spec, seed):
        self.source, self.spec, self.seed = source, spec, seed

    def __len__(self):
        return len(self.source)

    def __getitem__(self, item):
        epoch, index = item
        data = self.source.read_bytes(index)
        try:
            image = mx.image.imdecode(data, flag=1, to_rgb=True)
        except mx.base.MXNetError as e:
            raise decoder_failure(self.source, index, e) from e
        spec = self.spec
        height, width = image.shape[:2]
        if spec.train:
            p = augment.draw(spec, self.seed, epoch, index, height, width)
            image = mx.image.fixed_crop(image, p.left, p.top, p.width, p.height,
                                        size=(spec.size, spec.size), interp=BILINEAR)
            if p.flip:
                image = nd.flip(image, axis=1)
        else:
            (rh, rw), (top, left, h, w) = augment.eval_geometry(spec, height, width)
            image = mx.image.imresize(image, rw, rh, interp=BILINEAR)
            image = mx.image.fixed_crop(image, left, top, w, h)
        image = nd.image.normalize(nd.image.to_tensor(image), mean=spec.mean, std=spec.std)
        return image, int(self.source.labels[index])


def _batchify(examples):
    return {"images": nd.stack(*[x for x, _ in examples]),
            "labels": nd.array([y for _, y in examples], dtype="int32")}


class _Plan(gluon.data.Sampler):
    """The batch plan as Gluon's batch sampler."""

    def __init__(self, plan):
        self.plan = plan

    def __iter__(self):
        return iter(self.plan)

    def __len__(self):
        raise TypeError("a batch plan may have no end")


def loader(source, spec, batch_size, seed=0, epoch=0, epochs=1, shuffle=True, workers=0,
           prefetch=2, rank=0, world_size=1, drop_last=True, deterministic=True):
    """Batches {"images": float32 (N, 3, S, S), "labels": int32 (N,)} as NDArrays. With
    ``workers`` processes Gluon's DataLoader keeps ``prefetch`` batches per worker in flight
    (in order); without, a background thread prefetches."""
    check_source(source, batch_size, workers, prefetch)
    plan = batch_plan(len(source), batch_size, seed, epoch, epochs, shuffle, rank, world_size,
                      drop_last)
    dataset = ImageDataset(source, spec, seed)
    if not workers:
        return Prefetcher((_batchify([dataset[item] for item in chunk]) for chunk in plan),
                          prefetch)
    return iter(gluon.data.DataLoader(dataset, batch_sampler=_Plan(plan), num_workers=workers,
                                      batchify_fn=_batchify, prefetch=prefetch * workers))


def as_numpy(batch):
    return {k: v.asnumpy() for k, v in batch.items()}


def feed(batch):
    """NumPy: the backend's prepare_batch makes its NDArrays from NumPy arrays."""
    return as_numpy(batch)
