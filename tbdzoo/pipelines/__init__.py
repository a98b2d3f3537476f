"""Each framework's own input pipeline for image classification, one module per framework with
the same names in each (``NAME``, ``loader``, ``as_numpy``, ``feed``), and the augmentation
they share (:mod:`tbdzoo.pipelines.augment`). docs/pipelines.md.

    from tbdzoo.datasets import ImageNetFolder
    from tbdzoo import pipelines
    source = ImageNetFolder("data/imagenet", "train")
    spec = pipelines.augment.AugmentSpec(224)
    for batch in pipelines.for_backend("torch").loader(source, spec, 32, seed=0, workers=2):
        ...   # {"images": float32 (32, 3, 224, 224), "labels": int32 (32,)} as torch tensors

A framework's module is imported only when asked for, so this package imports anywhere.
"""
import importlib

from . import augment, order
from .augment import AugmentSpec, spec_for_model
from .order import batch_plan, epoch_order

__all__ = ["for_backend", "PIPELINE_OF", "augment", "order", "AugmentSpec", "spec_for_model",
           "epoch_order", "batch_plan"]

# The pipeline module each backend is fed by. CNTK's model runs in a Python 3.6 worker without
# Pillow, so the NumPy feed builds its batches in the calling process (docs/pipelines.md).
PIPELINE_OF = {"torch": "torch", "tensorflow": "tensorflow", "mxnet": "mxnet", "cntk": "numpy",
               "numpy": "numpy"}


def for_backend(name):
    """The pipeline module of backend ``name`` (or "numpy" for the reference feed)."""
    if name not in PIPELINE_OF:
        raise ValueError("no input pipeline for {!r}; known: {}".format(
            name, ", ".join(sorted(PIPELINE_OF))))
    return importlib.import_module("." + PIPELINE_OF[name], __name__)
