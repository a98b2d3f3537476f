"""TensorFlow's own input pipeline: ``tf.data`` reads the files, ``tf.io.decode_and_crop_jpeg``
decodes only the training crop's window (the fused decode and crop), ``tf.image.resize``
resizes (bilinear, antialiased), and ``map(num_parallel_calls=workers)``, ``batch`` and
``prefetch`` run it in TensorFlow's own threads. The crop windows are those of
tbdzoo/pipelines/augment.py, drawn by ``tf.numpy_function`` from the JPEG header's size
(``tf.io.extract_jpeg_shape``), so every framework crops the same window."""
from . import framework  # noqa: F401  (first: TensorFlow imported as the backend needs it)

# isort: split
import itertools

import numpy as np
import tensorflow as tf

from ...pipelines import augment
from ...pipelines.common import check_source, pillow_error
from ...pipelines.order import batch_plan

__all__ = ["NAME", "loader", "as_numpy", "feed"]

NAME = "tf.data (TensorFlow {})".format(tf.__version__)
# Pillow and libjpeg's default IDCT; TensorFlow's default ("INTEGER_FAST") is coarser.
DCT = "INTEGER_ACCURATE"


def _dataset(source, spec, plan, seed, workers, prefetch, deterministic, batch_size):
    paths = tf.constant(list(source.paths))
    labels = tf.constant(np.asarray(source.labels, np.int32))

    def items():
        for chunk in plan:
            yield from chunk

    def draw(epoch, index, shape):
        p = augment.draw(spec, seed, int(epoch), int(index), int(shape[0]), int(shape[1]))
        return np.array([p.top, p.left, p.height, p.width, int(p.flip)], np.int32)

    def load(epoch, index):
        data = tf.io.read_file(tf.gather(paths, index))
        if spec.train:
            window = tf.numpy_function(draw, [epoch, index, tf.io.extract_jpeg_shape(data)],
                                       tf.int32, stateful=False)
            window.set_shape([5])
            image = tf.io.decode_and_crop_jpeg(data, window[:4], channels=3, dct_method=DCT)
            image = tf.image.resize(image, [spec.size, spec.size], "bilinear", antialias=True)
            image = tf.cond(window[4] > 0, lambda: tf.image.flip_left_right(image), lambda: image)
        else:
            image = tf.io.decode_jpeg(data, channels=3, dct_method=DCT)
            shape = tf.cast(tf.shape(image)[:2], tf.float64)
            short = tf.reduce_min(shape)
            rh = tf.cast(tf.round(shape[0] * spec.resize / short), tf.int32)
            rw = tf.cast(tf.round(shape[1] * spec.resize / short), tf.int32)
            image = tf.image.resize(image, tf.stack([rh, rw]), "bilinear", antialias=True)
            top, left = (rh - spec.size) // 2, (rw - spec.size) // 2
            image = image[top:top + spec.size, left:left + spec.size]
        return image, tf.gather(labels, index)

    def normalise(images, batch_labels):
        x = (images / 255.0 - tf.constant(spec.mean)) / tf.constant(spec.std)
        return {"images": tf.transpose(x, [0, 3, 1, 2]), "labels": batch_labels}

    ds = tf.data.Dataset.from_generator(items, output_signature=(
        tf.TensorSpec((), tf.int64), tf.TensorSpec((), tf.int64)))
    ds = ds.map(load, num_parallel_calls=workers, deterministic=deterministic) if workers \
        else ds.map(load)
    ds = ds.batch(batch_size, drop_remainder=False).map(normalise)
    return ds.prefetch(prefetch)


class _Named:
    """Iterates the dataset; a decoding failure becomes a DatasetError naming the file, found
    among the examples in flight when it happened (the batch being built and those prefetched)."""

    def __init__(self, dataset, source, plan_window, window):
        self._it, self.source = iter(dataset), source
        self._plan, self._window, self._done = plan_window, window, 0

    def __iter__(self):
        return self

    def __next__(self):
        try:
            batch = next(self._it)
        except (tf.errors.InvalidArgumentError, tf.errors.UnknownError) as e:
            raise self._name(e) from e
        self._done += 1
        return batch

    def _name(self, error):
        for chunk in self._plan(self._done, self._window):
            for _, index in chunk:
                named = pillow_error(self.source, index)
                if named is not None:
                    return named
        return error  # no file in flight is bad: the framework's own error, unchanged


def loader(source, spec, batch_size, seed=0, epoch=0, epochs=1, shuffle=True, workers=0,
           prefetch=2, rank=0, world_size=1, drop_last=True, deterministic=True):
    """Batches {"images": float32 (N, 3, S, S), "labels": int32 (N,)} as tf.Tensors (the
    canonical NCHW layout; the TensorFlow backend's prepare_batch lays them out NHWC).
    ``workers`` is map's num_parallel_calls (0: one call at a time); ``deterministic=False``
    lets map hand examples over as they finish, so a batch's examples may change."""
    check_source(source, batch_size, workers, prefetch)

    def plan():
        return batch_plan(len(source), batch_size, seed, epoch, epochs, shuffle, rank,
                          world_size, drop_last)

    def window(done, count):
        return itertools.islice(plan(), done, done + count)

    ds = _dataset(source, spec, plan(), seed, workers, prefetch, deterministic, batch_size)
    return _Named(ds, source, window, prefetch + workers + 2)


def as_numpy(batch):
    return {k: v.numpy() for k, v in batch.items()}


def feed(batch):
    """tf.Tensors; the backend's prepare_batch reads them as NumPy (a copy on the CPU)."""
    return batch
