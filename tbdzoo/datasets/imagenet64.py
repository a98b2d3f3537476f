"""Downsampled ImageNet (64 x 64, or 8, 16, 32) as NumPy arrays: both published layouts.

- van den Oord et al.'s, read by WGAN's training: unlabelled numbered PNGs in ``train_64x64/``
  and ``valid_64x64/``. ``PNGFolder(folder)`` lists them and reads them one at a time
  (``folder[i]``: (64, 64, 3) uint8 RGB) or all at once (``.array()``).
- Chrabaszcz et al.'s, with labels: ``Imagenet64_train_npz/train_data_batch_<k>.npz``
  (k = 1..10) and ``Imagenet64_val_npz/val_data.npz``, each with ``data`` (N x 12288 uint8,
  a row holding the red plane, then green, then blue) and 1-based ``labels``.
  ``read_npz(path)`` and ``read_npz_folder(folder)`` return images (N, 64, 64, 3) uint8 and
  labels (N,) int64, 0-based.

The same data set is also published as pickled dicts (the same names without ``.npz``).
Unpickling a file can run any code its author put in it, so the pickled files are refused by
name and every ``.npz`` is opened with ``np.load(allow_pickle=False)``. Each problem (a
truncated PNG, a wrong size or colour mode, a missing key, a batch missing from the sequence,
a stray file) is an error naming the file; nothing is skipped.
"""
import os
import re
import zipfile

import numpy as np

from .errors import DatasetError

__all__ = ["PNG_FOLDERS", "NPZ_FOLDERS", "PNGFolder", "read_png_folder", "read_npz",
           "read_npz_folder", "is_pickle"]

PNG_FOLDERS = {"train": "train_64x64", "valid": "valid_64x64"}
NPZ_FOLDERS = {"train": "Imagenet64_train_npz", "valid": "Imagenet64_val_npz"}
PICKLE_SUFFIXES = (".pkl", ".pickle", ".p")
TRAIN_BATCH = re.compile(r"^train_data_batch_(\d+)(\.npz)?$")
VAL_DATA = re.compile(r"^val_data(\.npz)?$")
PICKLE_PROTOCOL_BYTE = 0x80     # pickle protocols 2 and later start with PROTO (0x80)


def is_pickle(path):
    """Whether ``path`` looks like a pickle: by name, or by its first byte."""
    if path.lower().endswith(PICKLE_SUFFIXES):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(1) == bytes([PICKLE_PROTOCOL_BYTE])
    except OSError:
        return False


def _refuse_pickle(path):
    raise DatasetError(
        "{}: a pickled file; tbdzoo never unpickles data (unpickling can run any code the "
        "file holds): use the .npz variant of the same data (Imagenet64_train_npz/"
        "train_data_batch_<k>.npz, Imagenet64_val_npz/val_data.npz)".format(path))


def _natural(name):
    stem = os.path.splitext(name)[0]
    return (0, int(stem), name) if stem.isdigit() else (1, 0, name)


class PNGFolder:
    """The PNGs of one folder of van den Oord's layout, in numeric order of their names.

    Every file in the folder must be a ``.png`` (anything else is an error naming it); each is
    checked when read: a complete PNG, RGB, ``size`` x ``size``.
    """

    def __init__(self, folder, size=64):
        if not os.path.isdir(folder):
            raise DatasetError("{}: no such folder; give train_64x64/ or valid_64x64/ of the "
                               "downsampled ImageNet (or a folder of such PNGs)".format(folder))
        names = sorted(os.listdir(folder), key=_natural)
        others = [n for n in names if not n.lower().endswith(".png")]
        if others:
            raise DatasetError("{}: {} file(s) that are not PNGs, first {}; the folder must hold "
                               "only the numbered PNGs".format(
                                   folder, len(others), os.path.join(folder, others[0])))
        if not names:
            raise DatasetError("{}: no PNGs in the folder".format(folder))
        self.folder, self.size = folder, size
        self.paths = [os.path.join(folder, n) for n in names]

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index):
        if not -len(self) <= index < len(self):
            raise IndexError("index {} out of range for {} PNGs".format(index, len(self)))
        return self.read(self.paths[index])

    def read(self, path):
        """One PNG as (size, size, 3) uint8, checked."""
        try:
            from PIL import Image
        except ImportError:
            raise DatasetError("reading PNGs needs Pillow: it is in requirements/main.txt") from None
        try:
            with Image.open(path) as image:
                if image.format != "PNG":
                    raise DatasetError("{}: a {} image, not a PNG".format(path, image.format))
                image.load()
                mode, width, height = image.mode, image.width, image.height
                pixels = np.asarray(image)
        except DatasetError:
            raise
        except (OSError, ValueError, SyntaxError) as e:
            raise DatasetError("{}: cannot read the PNG ({}): truncated or corrupt".format(
                path, e)) from e
        if mode != "RGB":
            raise DatasetError("{}: colour mode {}, not RGB".format(path, mode))
        if (height, width) != (self.size, self.size):
            raise DatasetError("{}: {} x {} pixels (height x width), not {} x {}".format(
                path, height, width, self.size, self.size))
        return pixels.astype(np.uint8, copy=False)

    def array(self, limit=None):
        """The first ``limit`` images (all by default) as (N, size, size, 3) uint8."""
        paths = self.paths if limit is None else self.paths[:limit]
        out = np.empty((len(paths), self.size, self.size, 3), np.uint8)
        for i, path in enumerate(paths):
            out[i] = self.read(path)
        return out


def read_png_folder(folder, size=64, limit=None):
    """``PNGFolder(folder, size).array(limit)``: (N, size, size, 3) uint8."""
    return PNGFolder(folder, size).array(limit)


def read_npz(path, size=None, num_classes=1000):
    """One of Chrabaszcz et al.'s ``.npz`` files as images (N, s, s, 3) uint8 and labels (N,)
    int64 0-based. ``s`` comes from the rows' width (3 s^2) unless ``size`` is given."""
    name = os.path.basename(path)
    if os.path.isfile(path) and is_pickle(path):
        _refuse_pickle(path)
    if not name.endswith(".npz"):
        if is_pickle(path) or TRAIN_BATCH.match(name) or VAL_DATA.match(name):
            _refuse_pickle(path)
        raise DatasetError("{}: not an .npz file; give Chrabaszcz et al.'s .npz files".format(path))
    try:
        with np.load(path, allow_pickle=False) as npz:
            keys = sorted(npz.files)
            missing = [k for k in ("data", "labels") if k not in keys]
            if missing:
                raise DatasetError("{}: no {} in the file (it holds {}); Chrabaszcz et al.'s "
                                   "files hold data, labels and, for training, mean".format(
                                       path, " or ".join(missing), ", ".join(keys) or "nothing"))
            data, labels = npz["data"], npz["labels"]
    except DatasetError:
        raise
    except ValueError as e:
        raise DatasetError("{}: cannot load without unpickling ({}); tbdzoo reads only plain "
                           "arrays".format(path, e)) from e
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        raise DatasetError("{}: not a readable .npz (zip) file ({}): truncated or "
                           "corrupt".format(path, e)) from e
    if data.dtype != np.uint8 or data.ndim != 2:
        raise DatasetError("{}: data is {} {}, not N x 3*s*s uint8".format(
            path, data.shape, data.dtype))
    side = int(round((data.shape[1] / 3.0) ** 0.5))
    if 3 * side * side != data.shape[1] or (size is not None and side != size):
        raise DatasetError("{}: rows of {} values are not 3 x {} x {} images".format(
            path, data.shape[1], size or "s", size or "s"))
    labels = np.asarray(labels)
    if labels.ndim != 1 or len(labels) != len(data) or labels.dtype.kind not in "iu":
        raise DatasetError("{}: labels are {} {}, not {} integers (one per row of data)".format(
            path, labels.shape, labels.dtype, len(data)))
    if len(labels) and (labels.min() < 1 or labels.max() > num_classes):
        raise DatasetError("{}: labels run {}..{}; Chrabaszcz et al.'s are 1-based, 1..{}".format(
            path, int(labels.min()), int(labels.max()), num_classes))
    images = data.reshape(len(data), 3, side, side).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels.astype(np.int64) - 1


def _npz_files(folder):
    """The data files of an npz folder in order: train_data_batch_1..K, or val_data."""
    if not os.path.isdir(folder):
        raise DatasetError("{}: no such folder; give Imagenet64_train_npz/ or "
                           "Imagenet64_val_npz/".format(folder))
    batches, val, others = {}, [], []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if is_pickle(path) or ((TRAIN_BATCH.match(name) or VAL_DATA.match(name))
                               and not name.endswith(".npz")):
            _refuse_pickle(path)
        train = TRAIN_BATCH.match(name)
        if train:
            batches[int(train.group(1))] = path
        elif VAL_DATA.match(name):
            val.append(path)
        else:
            others.append(path)
    if others:
        raise DatasetError("{}: not a data file of this layout (train_data_batch_<k>.npz or "
                           "val_data.npz)".format(others[0]))
    if batches and val:
        raise DatasetError("{}: holds both training batches and val_data.npz; give the training "
                           "and validation folders separately".format(folder))
    if val:
        return val
    if not batches:
        raise DatasetError("{}: no train_data_batch_<k>.npz or val_data.npz here".format(folder))
    missing = sorted(set(range(1, max(batches) + 1)) - set(batches))
    if missing:
        raise DatasetError("{}: train_data_batch_{}.npz is missing (the folder holds batches up "
                           "to {}): a partial copy?".format(folder, missing[0], max(batches)))
    return [batches[k] for k in sorted(batches)]


def read_npz_folder(folder, size=None, num_classes=1000):
    """Every batch of an npz folder, concatenated: images (N, s, s, 3) uint8, labels (N,)
    int64 0-based."""
    images, labels = [], []
    for path in _npz_files(folder):
        x, y = read_npz(path, size, num_classes)
        if images and x.shape[1:] != images[0].shape[1:]:
            raise DatasetError("{}: {} images, but the batches before it hold {}".format(
                path, "x".join(map(str, x.shape[1:])), "x".join(map(str, images[0].shape[1:]))))
        images.append(x)
        labels.append(y)
    return np.concatenate(images), np.concatenate(labels)
