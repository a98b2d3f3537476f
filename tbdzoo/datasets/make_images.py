"""Real image data sets made offline (``tbd data make``; docs/datasets.md).

Nothing can be downloaded here, so these sets are built from what installs from the package
registries: Fashion-MNIST from the Debian package ``dataset-fashion-mnist`` (idx files in
/usr/share/datasets/fashion-mnist/), and the photographs the scikit-image and scikit-learn
wheels ship. Each set depends only on its seed and options: every random choice comes from one
``numpy.random.RandomState(seed)`` (whose streams NumPy keeps fixed across versions), and the
encoders write no timestamps, so the same seed gives the same bytes.

- ``fashion-mnist-imagenet``: ImageNet's layout, ``train/<synset>/*.JPEG`` and
  ``val/<synset>/*.JPEG``, resized to the size a model takes (64 for the tiny ResNet-50, 299
  for Inception-v3).
- ``fashion-mnist-64``: 64 x 64 PNGs in van den Oord's downsampled-ImageNet layout
  (``train_64x64/``, ``valid_64x64/``) and the same images as Chrabaszcz et al.'s ``.npz``.
- ``voc-composed``: Pascal VOC 2007's layout; photographs with Fashion-MNIST garments pasted
  in, their boxes and difficult flags in VOC's XML.
"""
import gzip
import hashlib
import io
import os
import zipfile

import numpy as np

from .errors import DatasetError
from .makers import require_system_file
from .voc import write_voc

__all__ = ["MAKERS", "FASHION_MNIST_DIR", "FASHION_MNIST_CLASSES", "CLASS_TOKENS", "SYNSETS",
           "PHOTOS", "read_idx", "load_fashion_mnist", "write_npz",
           "fashion_mnist_imagenet", "fashion_mnist_64", "voc_composed"]

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"
FASHION_MNIST_FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
                       "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}
FASHION_MNIST_SIZES = {"train": 60000, "test": 10000}
# Fashion-MNIST's class names in label order, and one lower-case token each (VOC's names are
# such tokens: "diningtable", "tvmonitor"), used as VOC class names.
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                         "Shirt", "Sneaker", "Bag", "Ankle boot")
CLASS_TOKENS = ("tshirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker",
                "bag", "ankleboot")
# Synset-like folder names (not WordNet ids): sorted, they give Fashion-MNIST's label order.
SYNSETS = tuple("n{:08d}".format(label) for label in range(10))
IDX_TYPES = {0x08: np.uint8}

# The real photographs voc-composed draws its backgrounds from: (name, library).
PHOTOS = (
    ("astronaut", "scikit-image"), ("chelsea", "scikit-image"), ("coffee", "scikit-image"),
    ("hubble_deep_field", "scikit-image"), ("rocket", "scikit-image"),
    ("motorcycle_left", "scikit-image"), ("motorcycle_right", "scikit-image"),
    ("immunohistochemistry", "scikit-image"), ("retina", "scikit-image"),
    ("camera", "scikit-image"), ("coins", "scikit-image"), ("clock", "scikit-image"),
    ("moon", "scikit-image"), ("grass", "scikit-image"), ("gravel", "scikit-image"),
    ("brick", "scikit-image"), ("china", "scikit-learn"), ("flower", "scikit-learn"),
)


# -- Fashion-MNIST ---------------------------------------------------------------------------
def read_idx(path):
    """One gzipped idx file (LeCun's format: magic 0 0 type ndim, big-endian int32 dims, data)
    as a NumPy array; every problem is an error naming the file."""
    try:
        with gzip.open(path, "rb") as f:
            content = f.read()
    except OSError as e:
        raise DatasetError("{}: cannot read it as gzip: {}".format(path, e)) from e
    except EOFError:
        raise DatasetError("{}: the gzip stream ends early (a truncated download or copy?)".format(
            path)) from None
    if len(content) < 4 or content[0] != 0 or content[1] != 0 or content[2] not in IDX_TYPES:
        raise DatasetError("{}: not an idx file of unsigned bytes (its header is {})".format(
            path, content[:4].hex() or "empty"))
    ndim = content[3]
    header = 4 + 4 * ndim
    if len(content) < header:
        raise DatasetError("{}: the header promises {} dimensions but the file has {} bytes".format(
            path, ndim, len(content)))
    shape = tuple(int(d) for d in np.frombuffer(content[4:header], ">i4"))
    if len(content) - header != int(np.prod(shape)):
        raise DatasetError("{}: the header says {} ({} bytes of data) but {} bytes follow".format(
            path, " x ".join(map(str, shape)), int(np.prod(shape)), len(content) - header))
    return np.frombuffer(content, IDX_TYPES[content[2]], offset=header).reshape(shape)


def load_fashion_mnist(split, folder=FASHION_MNIST_DIR):
    """Fashion-MNIST's ``split`` ("train": 60,000, "test": 10,000) as images (N, 28, 28) uint8
    (white garment on black) and labels (N,) uint8 0..9, from the Debian package's files."""
    if split not in FASHION_MNIST_FILES:
        raise DatasetError("Fashion-MNIST has no split {!r}; give train or test".format(split))
    images_path, labels_path = (os.path.join(folder, name) for name in FASHION_MNIST_FILES[split])
    for path in (images_path, labels_path):
        if os.path.abspath(folder) == FASHION_MNIST_DIR:
            require_system_file(path, FASHION_MNIST_PACKAGE)
        elif not os.path.isfile(path):
            raise DatasetError("{} is missing: source= must be a folder holding Fashion-MNIST's "
                               "idx files ({})".format(path, ", ".join(
                                   FASHION_MNIST_FILES["train"] + FASHION_MNIST_FILES["test"])))
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise DatasetError("{}: images are {}, not N x 28 x 28".format(images_path, images.shape))
    if labels.ndim != 1 or len(labels) != len(images):
        raise DatasetError("{} holds {} labels but {} holds {} images".format(
            labels_path, labels.shape, images_path, len(images)))
    if len(labels) and labels.max() >= len(FASHION_MNIST_CLASSES):
        raise DatasetError("{}: label {} is outside 0..9".format(labels_path, int(labels.max())))
    return images, labels


def _source_facts(folder):
    """Provenance: each Fashion-MNIST file this set was made from, with its SHA-256."""
    facts = {}
    for split in ("train", "test"):
        for name in FASHION_MNIST_FILES[split]:
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    facts[name] = hashlib.sha256(f.read()).hexdigest()
    return {"folder": folder, "package": FASHION_MNIST_PACKAGE, "sha256": facts}


def _balanced(labels, per_class, rng, what):
    """``per_class`` indices of each class, drawn at random, in class order."""
    if per_class < 1:
        raise DatasetError("{}: give at least 1 image per class, not {}".format(what, per_class))
    chosen = []
    for label in range(len(FASHION_MNIST_CLASSES)):
        pool = np.flatnonzero(labels == label)
        if per_class > len(pool):
            raise DatasetError("{}: {} images of class {} asked for, Fashion-MNIST has {}".format(
                what, per_class, FASHION_MNIST_CLASSES[label], len(pool)))
        chosen.append(np.sort(rng.permutation(pool)[:per_class]))
    return np.concatenate(chosen)


def _pillow():
    try:
        from PIL import Image
    except ImportError:
        raise DatasetError("writing images needs Pillow: it is in requirements/main.txt") from None
    return Image


def _rgb(gray, size):
    """A 28 x 28 gray image as (size, size, 3) uint8, resized with Pillow's bicubic filter."""
    image = _pillow().fromarray(gray)
    if size != gray.shape[0]:
        image = image.resize((size, size), _pillow().BICUBIC)
    return np.asarray(image.convert("RGB"))


def _every(progress, what, done, total):
    if done == total or done % 100 == 0:
        progress(what, done, total)


def _check_quality(quality):
    if not 1 <= quality <= 100:
        raise DatasetError("quality={}: give a JPEG quality from 1 to 100 (95 by default)".format(
            quality))


def _check_size(size):
    if not 8 <= size <= 1024:
        raise DatasetError("size={}: give an image side between 8 and 1024 pixels (28 keeps "
                           "Fashion-MNIST's own; 64 fits the tiny ResNet-50, 299 "
                           "Inception-v3)".format(size))


# -- fashion-mnist-imagenet ------------------------------------------------------------------
def fashion_mnist_imagenet(out_dir, seed, progress, size=64, train_per_class=100,
                           val_per_class=20, quality=95, source=FASHION_MNIST_DIR):
    """Fashion-MNIST in ImageNet's layout: ``train/<synset>/<synset>_<index>.JPEG`` from the
    training split, ``val/<synset>/val_<index>.JPEG`` from the test split (index: the image's
    position in its Fashion-MNIST file), and ``LOC_synset_mapping.txt``."""
    _check_size(size)
    _check_quality(quality)
    rng = np.random.RandomState(seed)
    Image = _pillow()
    counts = {}
    for split, folder, per_class in (("train", "train", train_per_class),
                                     ("test", "val", val_per_class)):
        images, labels = load_fashion_mnist(split, source)
        chosen = _balanced(labels, per_class, rng, "{}_per_class".format(
            "train" if split == "train" else "val"))
        for synset in SYNSETS:
            os.makedirs(os.path.join(out_dir, folder, synset))
        what = "{}/ JPEGs".format(folder)
        for done, index in enumerate(chosen, 1):
            synset = SYNSETS[labels[index]]
            name = ("{}_{}.JPEG".format(synset, index) if folder == "train"
                    else "val_{:08d}.JPEG".format(index))
            Image.fromarray(_rgb(images[index], size)).save(
                os.path.join(out_dir, folder, synset, name), "JPEG", quality=quality)
            _every(progress, what, done, len(chosen))
        counts[folder] = len(chosen)
    with open(os.path.join(out_dir, "LOC_synset_mapping.txt"), "w") as f:
        for synset, name in zip(SYNSETS, FASHION_MNIST_CLASSES):
            f.write("{} {}\n".format(synset, name))
    return {"layout": "imagenet", "image_size": [size, size, 3], "images": counts,
            "classes": dict(zip(SYNSETS, FASHION_MNIST_CLASSES)), "jpeg_quality": quality,
            "source": _source_facts(source)}


# -- fashion-mnist-64 ------------------------------------------------------------------------
def write_npz(path, arrays):
    """``np.savez_compressed`` with a fixed timestamp on every member (NumPy stamps the current
    time), so the file's bytes depend only on the arrays; no pickled objects."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for key, array in arrays.items():
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.asarray(array), allow_pickle=False)
            archive.writestr(info, buffer.getvalue())


def _chw_rows(images):
    """(N, H, W, 3) uint8 as Chrabaszcz's rows: (N, 3 * H * W), all red, then green, then blue."""
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2)).reshape(len(images), -1)


def fashion_mnist_64(out_dir, seed, progress, train_per_class=100, val_per_class=20,
                     train_batches=1, source=FASHION_MNIST_DIR):
    """Fashion-MNIST at 64 x 64 RGB, twice: numbered PNGs in ``train_64x64/`` and
    ``valid_64x64/`` (van den Oord's layout, unlabelled), and ``Imagenet64_train_npz/
    train_data_batch_<k>.npz`` + ``Imagenet64_val_npz/val_data.npz`` (Chrabaszcz et al.'s keys:
    ``data`` N x 12288 uint8, channel-major rows; ``labels`` 1-based; ``mean`` in training
    batches). PNG number i is row i - 1 of the npz files, in a seeded shuffled order."""
    if train_batches < 1:
        raise DatasetError("train_batches={}: give at least 1".format(train_batches))
    rng = np.random.RandomState(seed)
    Image = _pillow()
    counts = {}
    for split, folder, per_class in (("train", "train_64x64", train_per_class),
                                     ("test", "valid_64x64", val_per_class)):
        images, labels = load_fashion_mnist(split, source)
        chosen = rng.permutation(_balanced(labels, per_class, rng, "{}_per_class".format(
            "train" if split == "train" else "val")))
        os.makedirs(os.path.join(out_dir, folder))
        pixels = np.empty((len(chosen), 64, 64, 3), np.uint8)
        what = "{}/ PNGs".format(folder)
        for done, index in enumerate(chosen, 1):
            pixels[done - 1] = _rgb(images[index], 64)
            Image.fromarray(pixels[done - 1]).save(
                os.path.join(out_dir, folder, "{:07d}.png".format(done)), "PNG")
            _every(progress, what, done, len(chosen))
        rows, ones = _chw_rows(pixels), labels[chosen].astype(np.int64) + 1
        if split == "train":
            if train_batches > len(rows):
                raise DatasetError("train_batches={}: more batches than the {} training "
                                   "images".format(train_batches, len(rows)))
            npz_folder = os.path.join(out_dir, "Imagenet64_train_npz")
            os.makedirs(npz_folder)
            mean = rows.mean(axis=0)
            for k, part in enumerate(np.array_split(np.arange(len(rows)), train_batches), 1):
                write_npz(os.path.join(npz_folder, "train_data_batch_{}.npz".format(k)),
                          {"data": rows[part], "labels": ones[part], "mean": mean})
                progress("train npz batches", k, train_batches)
        else:
            npz_folder = os.path.join(out_dir, "Imagenet64_val_npz")
            os.makedirs(npz_folder)
            write_npz(os.path.join(npz_folder, "val_data.npz"), {"data": rows, "labels": ones})
        counts[split] = len(chosen)
    return {"layout": "imagenet64", "image_size": [64, 64, 3],
            "images": {"train": counts["train"], "valid": counts["test"]},
            "train_batches": train_batches,
            "labels": {str(k + 1): name for k, name in enumerate(FASHION_MNIST_CLASSES)},
            "source": _source_facts(source)}


# -- voc-composed ----------------------------------------------------------------------------
def _load_photo(name, library):
    try:
        if library == "scikit-learn":
            from sklearn.datasets import load_sample_image
            pixels = load_sample_image(name + ".jpg")
        else:
            import skimage.data
            if name.startswith("motorcycle_"):
                left, right, _ = skimage.data.stereo_motorcycle()
                pixels = left if name.endswith("left") else right
            else:
                pixels = getattr(skimage.data, name)()
    except ImportError as e:
        raise DatasetError("voc-composed draws its backgrounds from {}'s photographs, which is "
                           "not installed ({}); it is pinned in requirements/main.txt".format(
                               library, e)) from e
    pixels = np.asarray(pixels)
    if pixels.ndim == 2:
        pixels = np.repeat(pixels[:, :, None], 3, axis=2)
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise DatasetError("{}'s photograph {} is {} {}, not an RGB or gray uint8 image".format(
            library, name, pixels.shape, pixels.dtype))
    return pixels


def _background(photo, height, width, rng):
    """A random crop of ``photo`` with the target's aspect (half to all of the largest such
    crop), flipped at random, resized to height x width."""
    ph, pw = photo.shape[:2]
    scale = min(ph / height, pw / width) * rng.uniform(0.5, 1.0)
    ch, cw = max(1, int(round(height * scale))), max(1, int(round(width * scale)))
    top, left = rng.randint(0, ph - ch + 1), rng.randint(0, pw - cw + 1)
    crop = photo[top:top + ch, left:left + cw]
    if rng.rand() < 0.5:
        crop = crop[:, ::-1]
    Image = _pillow()
    return np.asarray(Image.fromarray(np.ascontiguousarray(crop)).resize(
        (width, height), Image.BILINEAR), dtype=np.float32)


def _garment(gray, side, rng):
    """A garment scaled to ``side`` pixels: its colour (a random tint over the garment's own
    shading) and its opacity (from its brightness on Fashion-MNIST's black ground)."""
    Image = _pillow()
    shade = np.asarray(Image.fromarray(gray).resize((side, side), Image.BICUBIC),
                       np.float32) / 255.0
    alpha = np.clip(shade * 3.0, 0.0, 1.0)
    tint = rng.uniform(0.15, 1.0, size=3).astype(np.float32)
    colour = 255.0 * tint[None, None, :] * (0.35 + 0.65 * shade[:, :, None])
    return colour, alpha


def _compose(background, garments, rng, min_side, max_objects, max_tries=30):
    """Paste up to ``max_objects`` garments (label, gray) onto ``background``; each keeps at
    least 40 % of itself visible. Returns the image, boxes, labels (0..9) and visible fractions."""
    height, width = background.shape[:2]
    owner = np.full((height, width), -1, np.int32)      # which object each pixel shows
    areas, boxes, labels = [], [], []
    image = background.copy()
    max_side = max(min_side, int(0.7 * min(height, width)))
    for label, gray in garments[:max_objects]:
        for _ in range(max_tries):
            side = int(round(np.exp(rng.uniform(np.log(min_side), np.log(max_side)))))
            top, left = rng.randint(0, height - side + 1), rng.randint(0, width - side + 1)
            colour, alpha = _garment(gray, side, rng)
            solid = alpha > 0.5
            rows, cols = np.flatnonzero(solid.any(axis=1)), np.flatnonzero(solid.any(axis=0))
            if len(rows) == 0 or rows[-1] - rows[0] < 7 or cols[-1] - cols[0] < 7:
                continue                                   # a faint garment: draw again
            window = owner[top:top + side, left:left + side]
            trial = np.where(solid, len(areas), window)
            kept = [np.count_nonzero(trial == k) + np.count_nonzero(owner == k) -
                    np.count_nonzero(window == k) for k in range(len(areas))]
            if any(v < 0.4 * a for v, a in zip(kept, areas)):
                continue                                   # would hide an earlier object
            owner[top:top + side, left:left + side] = trial
            region = image[top:top + side, left:left + side]
            region[:] = alpha[:, :, None] * colour + (1.0 - alpha[:, :, None]) * region
            areas.append(int(np.count_nonzero(solid)))
            boxes.append((left + cols[0], top + rows[0], left + cols[-1] + 1, top + rows[-1] + 1))
            labels.append(label)
            break
    visible = [np.count_nonzero(owner == k) / float(a) for k, a in enumerate(areas)]
    pixels = np.clip(np.round(image), 0, 255).astype(np.uint8)
    return pixels, np.array(boxes, np.float32).reshape(-1, 4), labels, visible


def voc_composed(out_dir, seed, progress, images=48, long_side=500, max_objects=4,
                 min_side=32, difficult_side=24, difficult_visible=0.75, quality=95,
                 source=FASHION_MNIST_DIR):
    """VOC 2007's layout under ``VOC2007/`` (written by ``write_voc``): ``images`` photographs (random crops of PHOTOS,
    ``long_side`` x 3/4 of it, landscape or portrait) with 1..``max_objects`` Fashion-MNIST
    garments pasted in; half the images are train, a quarter val, a quarter test (garments of
    Fashion-MNIST's test split). An object is difficult when its box's shorter side is under
    ``difficult_side`` pixels or less than ``difficult_visible`` of it is visible."""
    if images < 4:
        raise DatasetError("images={}: give at least 4 (train, val and test need one each)".format(
            images))
    if max_objects < 1:
        raise DatasetError("max_objects={}: give at least 1".format(max_objects))
    _check_quality(quality)
    if not 64 <= long_side <= 4096:
        raise DatasetError("long_side={}: give 64 to 4096 pixels (VOC's images are about "
                           "500)".format(long_side))
    short_side = int(round(long_side * 0.75))
    if not 8 <= min_side <= int(0.7 * short_side):
        raise DatasetError("min_side={}: give 8 up to 70 % of the short side ({})".format(
            min_side, int(0.7 * short_side)))
    rng = np.random.RandomState(seed)
    photos = {}                                    # loaded when first drawn
    splits = {"train": load_fashion_mnist("train", source),
              "test": load_fashion_mnist("test", source)}
    n_train, n_val = images // 2, images // 4
    set_of = ["train"] * n_train + ["val"] * n_val + ["test"] * (images - n_train - n_val)
    pixels, notes, sets, photo_use = {}, {}, {"train": [], "val": [], "test": []}, {}
    for number, image_set in enumerate(set_of, 1):
        image_id = "{:06d}".format(number)
        landscape = rng.rand() < 0.75
        height, width = (short_side, long_side) if landscape else (long_side, short_side)
        photo_index = rng.randint(len(PHOTOS))
        photo_use[PHOTOS[photo_index][0]] = photo_use.get(PHOTOS[photo_index][0], 0) + 1
        if photo_index not in photos:
            photos[photo_index] = _load_photo(*PHOTOS[photo_index])
        background = _background(photos[photo_index], height, width, rng)
        garment_images, garment_labels = splits["test" if image_set == "test" else "train"]
        count = rng.randint(1, max_objects + 1)
        picks = rng.randint(len(garment_labels), size=count)
        garments = [(int(garment_labels[i]), garment_images[i]) for i in picks]
        image, boxes, labels, visible = _compose(background, garments, rng, min_side, count)
        sides = np.minimum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1])
        difficult = (sides < difficult_side) | (np.array(visible) < difficult_visible)
        pixels[image_id] = image
        notes[image_id] = {"boxes": boxes, "labels": np.array(labels, np.int64) + 1,
                           "difficult": difficult}
        sets[image_set].append(image_id)
        if len(pixels) == WRITE_EVERY or number == images:   # bounded memory for big sets
            folder = write_voc(out_dir, pixels, {i: notes[i] for i in pixels}, {},
                               quality=quality, class_names=CLASS_TOKENS)
            pixels = {}
        _every(progress, "images (JPEG + XML)", number, images)
    sets["trainval"] = sets["train"] + sets["val"]
    for name, ids in sets.items():
        with open(os.path.join(folder, "ImageSets", "Main", name + ".txt"), "w") as f:
            f.write("".join(i + "\n" for i in ids))
    _write_class_sets(folder, notes, sets)
    labels = np.concatenate([n["labels"] for n in notes.values()])
    hard = np.concatenate([n["difficult"] for n in notes.values()])
    return {"layout": "voc2007", "folder": "VOC2007", "long_side": long_side,
            "images": {name: len(ids) for name, ids in sets.items()},
            "objects": int(len(labels)), "difficult": int(hard.sum()),
            "objects_per_class": {CLASS_TOKENS[k]: int(np.sum(labels == k + 1))
                                  for k in range(len(CLASS_TOKENS))},
            "classes": dict(zip(CLASS_TOKENS, FASHION_MNIST_CLASSES)),
            "photos": {"{} ({})".format(name, library): photo_use.get(name, 0)
                       for name, library in PHOTOS},
            "jpeg_quality": quality, "source": _source_facts(source)}


WRITE_EVERY = 64      # voc-composed writes its images in groups of this many


def _write_class_sets(folder, notes, sets):
    """VOC's per-class lists ``ImageSets/Main/<class>_<set>.txt``: ``id flag`` a line, 1 when
    the class is in the image, 0 when only as difficult objects, -1 when absent."""
    for label, token in enumerate(CLASS_TOKENS, 1):
        for name, ids in sets.items():
            lines = []
            for image_id in ids:
                note = notes[image_id]
                present = note["labels"] == label
                flag = -1 if not present.any() else (0 if note["difficult"][present].all() else 1)
                lines.append("{} {:2d}\n".format(image_id, flag))
            with open(os.path.join(folder, "ImageSets", "Main",
                                   "{}_{}.txt".format(token, name)), "w") as f:
                f.write("".join(lines))


MAKERS = {
    "fashion-mnist-imagenet": (
        "Fashion-MNIST as ImageNet-layout JPEG folders (train/, val/ by synset), resized",
        fashion_mnist_imagenet),
    "fashion-mnist-64": (
        "Fashion-MNIST at 64 x 64: van den Oord's PNG folders and Chrabaszcz's .npz",
        fashion_mnist_64),
    "voc-composed": (
        "Pascal VOC 2007 layout: photographs with Fashion-MNIST garments pasted in, VOC XML",
        voc_composed),
}
