"""The input pipelines for image classification: each backend's own, in its folder
(``tbdzoo/backends/<fw>/pipeline.py``, the one its BackendInfo names), with the same names in
each (``NAME``, ``loader``, ``as_numpy``, ``feed``), the NumPy reference feed
(:mod:`tbdzoo.pipelines.numpy`), and the augmentation they share
(:mod:`tbdzoo.pipelines.augment`). docs/pipelines.md.

    from tbdzoo.datasets import ImageNetFolder
    from tbdzoo import pipelines
    source = ImageNetFolder("data/imagenet", "train")
    spec = pipelines.augment.AugmentSpec(224)
    for batch in pipelines.for_backend("torch").loader(source, spec, 32, seed=0, workers=2):
        ...   # {"images": float32 (32, 3, 224, 224), "labels": int32 (32,)} as torch tensors

A framework's module is imported only when asked for, so this package imports anywhere.
"""
import importlib

from ..backends.info import BACKEND_NAMES, backend_info
from . import augment, order
from .augment import AugmentSpec, spec_for_model
from .order import batch_plan, epoch_order

__all__ = ["for_backend", "pipeline_of", "augment", "order", "AugmentSpec", "spec_for_model",
           "epoch_order", "batch_plan"]

REFERENCE = "numpy"  # the reference feed, asked for by this name


def pipeline_of(name):
    """The dotted path of the pipeline module that feeds backend ``name`` (its BackendInfo's
    ``pipeline``), or of the NumPy reference feed for "numpy"."""
    if name == REFERENCE:
        return __name__ + "." + REFERENCE
    if name not in BACKEND_NAMES:
        raise ValueError("no input pipeline for {!r}; known: {}".format(
            name, ", ".join(sorted(BACKEND_NAMES + [REFERENCE]))))
    return backend_info(name).module_path("pipeline")


def for_backend(name):
    """The pipeline module of backend ``name`` (or "numpy" for the reference feed)."""
    return importlib.import_module(pipeline_of(name))
