"""ImageNet in its own folder layout: a reader that returns NumPy images and class labels.

The layout (docs/datasets.md)::

    ROOT/train/<synset>/*.JPEG          one folder per class; classes are the sorted folder names
    ROOT/val/<synset>/*.JPEG            validation in class folders, or
    ROOT/val/*.JPEG + a ground-truth file   flat, with its labels in one of two forms:
        LOC_val_solution.csv            ImageId,PredictionString (Kaggle's ILSVRC files): the
                                        first synset of each PredictionString is the label
        a text file                     one label a line for the images in sorted file order:
                                        a synset name, or a class index 0..K-1 in sorted order

Images are decoded with Pillow (imported only when an image is read, so this module imports
where Pillow is absent) to uint8 (H, W, 3) RGB; greyscale and CMYK JPEGs (ImageNet holds a
few) are converted to RGB. Every problem is a :class:`DatasetError` naming the file and what is
wrong with it: nothing is skipped. No framework is imported here; the input pipelines of each
framework (tbdzoo/pipelines/) read the files this reader lists. Valid Python 3.6.
"""
import csv
import io
import os
import re

import numpy as np

from .errors import DatasetError
from .source import ExampleSource

__all__ = ["ImageNetFolder", "JPEG_SUFFIXES", "GROUND_TRUTH_NAMES", "decode_jpeg", "is_synset"]

JPEG_SUFFIXES = (".jpeg", ".jpg")       # compared in lower case: ImageNet's files end .JPEG
GROUND_TRUTH_NAMES = ("LOC_val_solution.csv", "val_ground_truth.txt", "val_labels.txt")
# The devkit's file numbers classes by ILSVRC2012_ID (meta.mat's order), which is not the
# sorted synset order every reader here uses: read as indices it would mislabel every image.
DEVKIT_GROUND_TRUTH = "ILSVRC2012_validation_ground_truth.txt"
_SYNSET = re.compile(r"^n\d{8}$")


def is_synset(name):
    """Whether ``name`` is a WordNet synset id like ImageNet's folders (n01440764)."""
    return bool(_SYNSET.match(name))


def _pillow():
    try:
        from PIL import Image
    except ImportError:
        raise DatasetError("decoding ImageNet's JPEGs needs Pillow: install it (pip install "
                           "Pillow) in this environment") from None
    return Image


def read_file_bytes(path):
    """The bytes of one image file; an unreadable or empty file is an error naming it."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DatasetError("{}: cannot be read ({}); fix its permissions or remove it from the "
                           "data set".format(path, e.strerror or e)) from e
    if not data:
        raise DatasetError("{}: the file is empty (0 bytes); replace it with the image or "
                           "remove it from the data set".format(path))
    return data


def decode_jpeg(path, data=None):
    """uint8 (H, W, 3) RGB of the JPEG at ``path`` (``data``: its bytes, if already read)."""
    Image = _pillow()
    data = read_file_bytes(path) if data is None else data
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format != "JPEG":
                raise DatasetError("{}: not a JPEG but a {} image; convert it to JPEG or remove "
                                   "it".format(path, image.format or "unrecognised"))
            image.load()   # a truncated file fails here (Pillow's LOAD_TRUNCATED_IMAGES is off)
            rgb = image.convert("RGB") if image.mode != "RGB" else image
            return np.asarray(rgb, dtype=np.uint8)
    except DatasetError:
        raise
    except Exception as e:  # Pillow raises OSError, SyntaxError or ValueError for bad data
        raise DatasetError("{}: not a decodable JPEG ({}: {}); the file is corrupt or "
                           "truncated: replace it or remove it".format(path, type(e).__name__, e)) from e


def _list_dir(path):
    try:
        return sorted(os.listdir(path))
    except OSError as e:
        raise DatasetError("{}: cannot list the folder ({})".format(path, e.strerror or e)) from e


def _jpegs_in(folder, besides=()):
    """Sorted JPEG paths of ``folder``; any other entry (but the names in ``besides``) is an
    error naming it."""
    paths = []
    for name in _list_dir(folder):
        path = os.path.join(folder, name)
        if name.startswith(".") or name in besides:
            continue  # hidden files (.DS_Store) are not data
        if os.path.isdir(path) or not name.lower().endswith(JPEG_SUFFIXES):
            raise DatasetError("{}: not a JPEG file (names end in {}); a class folder holds "
                               "only its images: move it out".format(path, ", ".join(
                                   s.upper() for s in JPEG_SUFFIXES)))
        paths.append(path)
    return paths


def _class_folders(folder):
    return [n for n in _list_dir(folder)
            if not n.startswith(".") and os.path.isdir(os.path.join(folder, n))]


class ImageNetFolder(ExampleSource):
    """One split of an ImageNet-layout folder: ``len()``, ``paths``, ``labels``, ``classes``,
    and ``example(i)`` -> {"image": uint8 (H, W, 3), "label": int}.

    ``split`` is "train" or "val". Classes come from ``train/`` when it exists (so val's labels
    share train's numbering), else from ``val/``'s class folders. ``ground_truth`` names the
    labels file of a flat ``val/``; by default the first of GROUND_TRUTH_NAMES found in ``val/``
    or ``root`` is read.
    """

    task = "image_classification"

    def __init__(self, root, split="train", ground_truth=None):
        if split not in ("train", "val"):
            raise DatasetError("split {!r}: an ImageNet folder has the splits 'train' and "
                               "'val'".format(split))
        self.root, self.split = root, split
        folder = os.path.join(root, split)
        if not os.path.isdir(folder):
            raise DatasetError("{}: no {}/ folder here; give the folder that holds train/ and "
                               "val/ (ImageNet's layout: train/<synset>/*.JPEG)".format(root, split))
        self.classes = self._find_classes(root, split)
        self.class_index = {c: i for i, c in enumerate(self.classes)}
        subfolders = _class_folders(folder)
        if split == "val" and not subfolders:
            self.ground_truth = self._find_ground_truth(root, folder, ground_truth)
            self.paths = _jpegs_in(folder, besides=GROUND_TRUTH_NAMES + (
                DEVKIT_GROUND_TRUTH, os.path.basename(self.ground_truth)))
            self.labels = self._read_ground_truth(self.ground_truth)
        else:
            self.ground_truth = None
            self.paths, self.labels = self._read_class_folders(folder, subfolders)
        if not self.paths:
            raise DatasetError("{}: no images in this split".format(folder))
        self.labels = np.asarray(self.labels, dtype=np.int64)

    # -- classes and labels ---------------------------------------------------------------
    @staticmethod
    def _find_classes(root, split):
        for source in ("train", split):
            folder = os.path.join(root, source)
            if os.path.isdir(folder):
                classes = _class_folders(folder)
                if classes:
                    return classes
        raise DatasetError("{}: no class folders in train/ (or {}/); ImageNet's layout is "
                           "train/<synset>/*.JPEG with one folder per class".format(root, split))

    def _read_class_folders(self, folder, subfolders):
        paths, labels = [], []
        for name in subfolders:
            if name not in self.class_index:
                raise DatasetError("{}: class folder {!r} is not one of train/'s {} classes"
                                   .format(os.path.join(folder, name), name, len(self.classes)))
            files = _jpegs_in(os.path.join(folder, name))
            if not files and self.split == "train":
                raise DatasetError("{}: an empty class folder; every class needs at least one "
                                   "image".format(os.path.join(folder, name)))
            paths.extend(files)
            labels.extend([self.class_index[name]] * len(files))
        for name in _list_dir(folder):
            path = os.path.join(folder, name)
            if not name.startswith(".") and not os.path.isdir(path):
                raise DatasetError("{}: a file beside the class folders; {}/ holds one folder per "
                                   "class: move it into its class or out".format(path, self.split))
        return paths, labels

    def _find_ground_truth(self, root, folder, given):
        if given is not None:
            if not os.path.isfile(given):
                raise DatasetError("{}: no such ground-truth file".format(given))
            return given
        for place in (folder, root):
            for name in GROUND_TRUTH_NAMES:
                if os.path.isfile(os.path.join(place, name)):
                    return os.path.join(place, name)
        raise DatasetError("{}: the images are not in class folders and no ground-truth file "
                           "was found (looked for {} in val/ and the root); give one with "
                           "ground_truth=, or move each image into val/<synset>/".format(
                               folder, ", ".join(GROUND_TRUTH_NAMES)))

    def _read_ground_truth(self, path):
        if os.path.basename(path) == DEVKIT_GROUND_TRUTH:
            raise DatasetError("{}: the devkit's labels are ILSVRC2012_IDs in meta.mat's order, "
                               "not the sorted synset order of train/; convert them to synset "
                               "names (one a line) or use LOC_val_solution.csv".format(path))
        if path.lower().endswith(".csv"):
            return self._read_solution_csv(path)
        return self._read_label_lines(path)

    def _label_of(self, text, path, where):
        text = text.strip()
        if text in self.class_index:
            return self.class_index[text]
        if text.isdigit() and int(text) < len(self.classes):
            return int(text)
        raise DatasetError("{}, {}: label {!r} is neither one of the {} synsets of train/ nor a "
                           "class index 0..{}".format(path, where, text, len(self.classes),
                                                      len(self.classes) - 1))

    def _read_label_lines(self, path):
        with open(path) as f:
            lines = [l for l in f.read().splitlines() if l.strip()]
        if len(lines) != len(self.paths):
            raise DatasetError("{}: {} labels for the {} images of {}; the file holds one label a "
                               "line for the images in sorted file order".format(
                                   path, len(lines), len(self.paths), os.path.dirname(self.paths[0])
                                   if self.paths else "val/"))
        return [self._label_of(l, path, "line {}".format(i + 1)) for i, l in enumerate(lines)]

    def _read_solution_csv(self, path):
        labels = {}
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None or [h.strip() for h in header[:2]] != ["ImageId", "PredictionString"]:
                raise DatasetError("{}: the first line must be the header "
                                   "'ImageId,PredictionString', not {!r}".format(path, header))
            for number, row in enumerate(reader, start=2):
                if not row:
                    continue
                if len(row) < 2 or not row[1].split():
                    raise DatasetError("{}, line {}: expected an image id and a prediction "
                                       "string starting with its synset, got {!r}".format(
                                           path, number, row))
                if row[0] in labels:
                    raise DatasetError("{}, line {}: image {} is listed twice".format(
                        path, number, row[0]))
                labels[row[0]] = self._label_of(row[1].split()[0], path, "line {}".format(number))
        stems = [os.path.splitext(os.path.basename(p))[0] for p in self.paths]
        missing = [s for s in stems if s not in labels]
        if missing or len(labels) != len(stems):
            raise DatasetError("{}: {} labels for the {} images of val/{}".format(
                path, len(labels), len(stems), "; no label for {}".format(
                    ", ".join(missing[:3]) + (" ..." if len(missing) > 3 else ""))
                if missing else ""))
        return [labels[s] for s in stems]

    # -- ExampleSource --------------------------------------------------------------------
    def __len__(self):
        return len(self.paths)

    def describe(self, index):
        return self.paths[index]

    def read_bytes(self, index):
        """The raw file bytes (for decoders that take them, such as tf.io.decode_and_crop_jpeg)."""
        return read_file_bytes(self.paths[index])

    def image(self, index):
        return decode_jpeg(self.paths[index])

    def example(self, index):
        return {"image": self.image(index), "label": int(self.labels[index])}

    def __getitem__(self, index):
        return self.image(index), int(self.labels[index])

    def check(self, indices=None):
        """Decode every image (or those of ``indices``); raises on the first bad one. Slow for
        the real data set (it decodes everything): a way to vet a copy once."""
        for i in range(len(self)) if indices is None else indices:
            self.image(int(i))

    def __repr__(self):
        return "ImageNetFolder({!r}, split={!r}: {} images, {} classes)".format(
            self.root, self.split, len(self), len(self.classes))
