"""Image classification (ResNet-50, Inception-v3): training batches from DIR/train through the
backend's own input pipeline (tbdzoo/pipelines/), top-1 on DIR/val. The held-out images go
through the same pipeline once, with its evaluation transform, and are kept as NumPy arrays:
every evaluation then scores the same pixels with ``model.predict``."""
import os

import numpy as np

from .. import pipelines
from ..datasets.errors import DatasetError
from ..datasets.imagenet import ImageNetFolder
from ..datasets.makers import read_manifest
from .errors import TrainingError

__all__ = ["ImageClassificationTask", "dataset_name"]

LAYOUT = "ImageNet layout: DIR/train/<synset>/*.JPEG and DIR/val/<synset>/*.JPEG"
EVAL_BATCH = 100
# The command that writes the proxy's data in this layout.
DATA_COMMAND = ("tbd data make fashion-mnist-imagenet --out DIR --set size=32 "
                "--set train_per_class=200 --set val_per_class=50")


def dataset_name(data_dir):
    """The name in the folder's tbdzoo-dataset.json (with its options), else the folder's."""
    try:
        manifest = read_manifest(data_dir)
        options = manifest.get("options", {})
        shown = ",".join("{}={}".format(k, options[k]) for k in sorted(options)
                         if k != "source")
        return "{}[{}]".format(manifest["name"], shown) if shown else manifest["name"]
    except (DatasetError, KeyError):
        return os.path.basename(os.path.abspath(data_dir))


def _open(data_dir, split):
    if not os.path.isdir(data_dir):
        raise TrainingError("{}: no such folder; the image models train from a folder in {}; "
                            "make one with: {}".format(data_dir, LAYOUT,
                                                       DATA_COMMAND))
    try:
        return ImageNetFolder(data_dir, split)
    except DatasetError as e:
        raise TrainingError("{}: not a data set the image models train from ({}); expected {}; "
                            "make one with: {}".format(data_dir, e, LAYOUT,
                                                       DATA_COMMAND)) from e


class ImageClassificationTask:
    metric_names = ("top1",)

    layout, data_command = LAYOUT, DATA_COMMAND   # what a missing --data is told

    @staticmethod
    def check_data(data_dir):
        """Open both splits, so that a wrong layout fails before a model is built."""
        _open(data_dir, "train")
        _open(data_dir, "val")

    def __init__(self, model, data_dir, seed=0, workers=0, augment=False, rank=0, world_size=1):
        self.model, self.seed, self.workers = model, seed, workers
        self.rank, self.world_size = rank, world_size   # a data-parallel rank reads its share
        self.train_source = _open(data_dir, "train")
        self.val_source = _open(data_dir, "val")
        classes = len(self.train_source.classes)
        if classes > model.hparams["num_classes"]:
            raise TrainingError("{}: {} classes, but the model has {}; set num_classes={}".format(
                data_dir, classes, model.hparams["num_classes"], classes))
        self.module = pipelines.for_backend(model.backend)
        self.pipeline = self.module.NAME
        self.train_spec = pipelines.spec_for_model(model.name, model.hparams, train=augment)
        self.eval_spec = pipelines.spec_for_model(model.name, model.hparams, train=False)
        self.dataset = dataset_name(data_dir)
        self.examples = {"train": len(self.train_source), "val": len(self.val_source)}
        self._held_out = None

    def batches(self):
        """Training batches without end (epoch after epoch, each in its seeded order), as the
        model's train_step takes them; a data-parallel rank r of W reads positions r, r + W,
        ... of each epoch's order (tbdzoo/pipelines/order.py), so the W ranks' k-th batches
        together hold the examples of one process's k-th batch at W times the batch."""
        loader = self.module.loader(self.train_source, self.train_spec,
                                    self.model.hparams["batch_size"], seed=self.seed,
                                    epochs=None, workers=self.workers, rank=self.rank,
                                    world_size=self.world_size)
        self._loader = loader
        for batch in loader:
            yield self.module.feed(batch)

    def close(self):
        close = getattr(getattr(self, "_loader", None), "close", None)
        if close:
            close()

    def held_out(self):
        if self._held_out is None:
            self._held_out = [self.module.as_numpy(b) for b in self.module.loader(
                self.val_source, self.eval_spec, EVAL_BATCH, seed=self.seed, shuffle=False,
                drop_last=False)]
        return self._held_out

    def evaluate(self, metrics=None):
        """{"top1": fraction of the held-out images whose highest logit is their label};
        ``metrics`` (the names a caller needs) changes nothing: there is one."""
        right = total = 0
        for batch in self.held_out():
            images = np.asarray(batch["images"], np.float32)
            labels = np.asarray(batch["labels"])
            logits = self.model.predict({"images": images, "labels": labels.astype(np.int32)})
            right += int((np.argmax(logits, axis=1) == labels).sum())
            total += len(labels)
        return {"top1": right / float(total)}
