"""PyTorch's own input pipeline: a map-style ``Dataset`` and a ``DataLoader`` with worker
processes. torchvision decodes the JPEG (``torchvision.io.decode_jpeg``, libjpeg-turbo) and
``torchvision.transforms.v2.functional`` crops, resizes (bilinear, antialiased), flips and
normalises, with the crop windows of tbdzoo/pipelines/augment.py. The batch sampler yields
(epoch, index) pairs, so one loader spans several epochs without restarting its workers."""
import torch
import torchvision
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms.v2 import functional as F

from ...pipelines import augment
from ...pipelines.common import check_source, decoder_failure
from ...pipelines.order import batch_plan
from ...pipelines.prefetch import Prefetcher

__all__ = ["NAME", "loader", "as_numpy", "feed", "ImageDataset"]

NAME = "torch.utils.data.DataLoader (torchvision {})".format(torchvision.__version__)


class ImageDataset(torch.utils.data.Dataset):
    """Item (epoch, index) -> (float32 (3, S, S) tensor, label)."""

    def __init__(self, source, spec, seed):
        self.source, self.spec, self.seed = source, spec, seed

    def __len__(self):
        return len(self.source)

    def __getitem__(self, item):
        epoch, index = item
        data = self.source.read_bytes(index)
        try:
            image = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8),
                                mode=ImageReadMode.RGB)
        except RuntimeError as e:
            raise decoder_failure(self.source, index, e) from e
        spec = self.spec
        height, width = image.shape[-2:]
        if spec.train:
            p = augment.draw(spec, self.seed, epoch, index, height, width)
            image = F.resized_crop(image, p.top, p.left, p.height, p.width, [spec.size, spec.size],
                                   antialias=True)
            if p.flip:
                image = F.horizontal_flip(image)
        else:
            (rh, rw), (top, left, h, w) = augment.eval_geometry(spec, height, width)
            image = F.crop(F.resize(image, [rh, rw], antialias=True), top, left, h, w)
        image = F.normalize(image.float().div_(255.0), spec.mean, spec.std)
        return image, int(self.source.labels[index])


def _collate(examples):
    return {"images": torch.stack([x for x, _ in examples]),
            "labels": torch.tensor([y for _, y in examples], dtype=torch.int32)}


def loader(source, spec, batch_size, seed=0, epoch=0, epochs=1, shuffle=True, workers=0,
           prefetch=2, rank=0, world_size=1, drop_last=True, deterministic=True):
    """Batches {"images": float32 (N, 3, S, S), "labels": int32 (N,)} as CPU tensors. With
    ``workers`` processes the DataLoader prefetches ``prefetch`` batches per worker; without,
    a background thread does. The DataLoader returns batches in order either way."""
    check_source(source, batch_size, workers, prefetch)
    plan = batch_plan(len(source), batch_size, seed, epoch, epochs, shuffle, rank, world_size,
                      drop_last)
    dataset = ImageDataset(source, spec, seed)
    if not workers:
        return Prefetcher((_collate([dataset[item] for item in chunk]) for chunk in plan), prefetch)
    return iter(torch.utils.data.DataLoader(
        dataset, batch_sampler=_Plan(plan), num_workers=workers, collate_fn=_collate,
        prefetch_factor=prefetch, persistent_workers=False, multiprocessing_context="fork"))


class _Plan:
    """The batch plan as the DataLoader's batch sampler (an iterable of index lists)."""

    def __init__(self, plan):
        self.plan = plan

    def __iter__(self):
        return iter(self.plan)


def as_numpy(batch):
    return {k: v.numpy() for k, v in batch.items()}


def feed(batch):
    """CPU tensors: the backend's prepare_batch reads them without a copy (NumPy's view)."""
    return batch
