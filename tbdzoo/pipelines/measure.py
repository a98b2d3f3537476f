"""Data-fed training throughput: the measuring protocol of tbdzoo/profiling/timing.py, but each
step trains on the next batch of a real input pipeline, so the time a step waits for its batch
counts. Beside the throughput it records that wait and the CPU the whole process tree used
(a DataLoader's worker processes included), which is what shows an input-bound run.
docs/pipelines.md, docs/records.md ("data")."""
import os
import time
from collections import OrderedDict

from ..datasets.errors import DatasetError
from ..datasets.imagenet import ImageNetFolder
from ..models import get_model, list_models
from ..profiling.cpu import CpuMeter
from ..profiling.timing import summarize, time_repeats
from . import augment as augment_mod
from . import for_backend
from .order import epoch_order

__all__ = ["data_fed", "time_data_fed", "open_source", "image_models", "INPUT_BOUND_WAIT"]


def image_models():
    """The models whose inputs the image pipelines build (those whose card has ``image``);
    the others need readers of their own (docs/pipelines.md: "Other data")."""
    return [m for m in list_models() if get_model(m).image is not None]

# A data-fed run is input-bound when its steps spend more than this fraction of their time
# waiting for the next batch (the record's data.input_bound).
INPUT_BOUND_WAIT = 0.1


def time_data_fed(model, batches, feed, warmup=1, steps=3, repeats=3, progress=None,
                  samplers=True):
    """Train ``model`` on successive batches of the iterator ``batches`` (``feed`` turns one
    into what ``model.train_step`` takes); returns the timing, the input wait and CPU use."""
    if warmup < 1 or steps < 1 or repeats < 1:
        raise ValueError("warmup, steps and repeats must each be at least 1")
    total, done = warmup + steps * repeats, 0
    start = time.perf_counter()
    first = next(batches)
    first_batch_s = time.perf_counter() - start
    losses = [model.train_step(feed(first))]
    done += 1
    if progress:
        progress(done, total)
    for _ in range(warmup - 1):
        losses.append(model.train_step(feed(next(batches))))
        done += 1
        if progress:
            progress(done, total)
    meter = CpuMeter(tree=True) if samplers else None
    model.synchronize()
    if meter:
        meter.start()
    items = [None]

    def next_input():
        start = time.perf_counter()
        batch = next(batches)
        waited = time.perf_counter() - start
        items[0] = len(batch["labels"])
        return feed(batch), waited

    per_step, waits, done = time_repeats(model, next_input, steps, repeats, losses, progress,
                                         done, total)
    items = items[0]
    step_time = summarize(per_step)
    return OrderedDict([
        ("throughput", items / step_time["median"]), ("items_per_step", items),
        ("step_time", step_time), ("first_batch_s", first_batch_s),
        ("input_wait_fraction", summarize(waits)["median"]),
        ("cpu", meter.stop() if meter else None), ("losses", losses)])


def open_source(model_name, hparams, data_dir, split="train"):
    """The reader of ``data_dir`` for ``model_name``, checked against the model's classes."""
    if model_name not in image_models():
        raise DatasetError("--data feeds image classification models ({}) for now; {} needs a "
                           "reader of its own data (docs/pipelines.md)".format(
                               ", ".join(image_models()), model_name))
    source = ImageNetFolder(data_dir, split)
    if len(source.classes) > hparams["num_classes"]:
        raise DatasetError("{}: {} classes, but the model's config has {}: set "
                           "--set num_classes={}".format(data_dir, len(source.classes),
                                                         hparams["num_classes"],
                                                         len(source.classes)))
    return source


def data_fed(model, data_dir, pipeline=None, split="train", augment=True, workers=2, prefetch=2,
             seed=0, deterministic=False, warmup=1, steps=3, repeats=3, samplers=True,
             progress=None, rank=0, world_size=1):
    """Time ``model`` trained from ``data_dir`` through the input pipeline of ``pipeline``
    (default: the model's backend's); returns the record's "data" part (docs/records.md).
    ``rank`` of ``world_size`` reads only its share of each epoch (tbdzoo/pipelines/order.py):
    a data-parallel rank's pipeline."""
    source = open_source(model.name, model.hparams, data_dir, split)
    module = for_backend(pipeline or model.backend)
    spec = augment_mod.spec_for_model(model.name, model.hparams, train=augment)
    batches = module.loader(source, spec, model.hparams["batch_size"], seed=seed, epochs=None,
                            workers=workers, prefetch=prefetch, deterministic=deterministic,
                            rank=rank, world_size=world_size)
    try:
        timing = time_data_fed(model, batches, module.feed, warmup, steps, repeats, progress,
                               samplers)
    finally:
        close = getattr(batches, "close", None)
        if close:
            close()
    return OrderedDict([
        ("dir", os.path.abspath(data_dir)), ("split", split), ("examples", len(source)),
        ("classes", len(source.classes)), ("pipeline", module.NAME), ("workers", workers),
        ("prefetch", prefetch), ("augment", bool(augment)), ("deterministic", bool(deterministic)),
        ("seed", seed),
        ("throughput", OrderedDict([("value", timing["throughput"]),
                                    ("unit", model.model_def.unit),
                                    ("items_per_step", timing["items_per_step"])])),
        ("step_time", timing["step_time"]), ("first_batch_s", timing["first_batch_s"]),
        ("input_wait_fraction", timing["input_wait_fraction"]), ("cpu", timing["cpu"]),
        ("losses", timing["losses"])] + ([] if world_size == 1 else [
        ("rank", rank), ("share_examples", len(epoch_order(len(source), seed, 0, True, rank,
                                                             world_size)))]))
