"""Faster R-CNN's input pipeline in NumPy: resize, flip, normalise, pad, batch.

The transforms follow mx-rcnn and torchvision's detection references: the image is resized so
its short side is 600 pixels unless its long side would then pass 1,000 (then the long side is
1,000), boxes are scaled by the same ratios; a horizontal flip is the seeded augmentation;
pixels are normalised with ImageNet's mean and standard deviation (torchvision's values).
Images are then padded at the bottom and right to a fixed canvas, so frameworks that need
static shapes get them, and the valid (height, width) travels beside each image; boxes are
padded to a fixed count, with the count of real ones.

Boxes are tbdzoo's: (x1, y1, x2, y2) in pixels, 0-based, x2 and y2 exclusive (a box covering
pixel columns 0..9 is x1 = 0, x2 = 10). Labels are 1..num_classes, 0 is background and padding.

The batch dict (every value a NumPy array, N images, canvas H x W, at most M boxes):
``images`` (N, 3, H, W) float32, ``image_hw`` (N, 2) int32 valid height and width,
``gt_boxes`` (N, M, 4) float32, ``gt_labels`` (N, M) int32, ``gt_count`` (N,) int32,
``difficult`` (N, M) bool, and, to map detections back for evaluation, ``original_hw`` (N, 2)
int32 and ``flipped`` (N,) bool. Padding is 0 (False) everywhere.

Pillow is imported only where an image is resized, so the synthetic generator runs where
Pillow is not installed (the CNTK worker's environment). Valid Python 3.6 and NumPy 1.19.
"""
import numpy as np

from .errors import DatasetError

IMAGENET_MEAN = (0.485, 0.456, 0.406)   # torchvision's ImageNet statistics, RGB, on [0, 1]
IMAGENET_STD = (0.229, 0.224, 0.225)
SHORT_SIDE = 600                        # Faster R-CNN on VOC: mx-rcnn's and py-faster-rcnn's
MAX_LONG_SIDE = 1000                    # scales (600, 1000)
CANVAS = (1000, 1000)                   # every resized image fits: 600 x 1000 or 1000 x 600
MAX_BOXES = 64                          # boxes per image a batch holds; more is an error

BATCH_KEYS = ("images", "image_hw", "gt_boxes", "gt_labels", "gt_count", "difficult",
              "original_hw", "flipped")


def canvas_shape(canvas):
    """(height, width) from an int (a square) or a pair."""
    if isinstance(canvas, (int, np.integer)):
        canvas = (canvas, canvas)
    height, width = (int(v) for v in canvas)
    if height < 1 or width < 1:
        raise DatasetError("canvas {} must be positive: give (height, width) or one side".format(
            canvas))
    return height, width


def resized_shape(height, width, short_side=SHORT_SIDE, max_long_side=MAX_LONG_SIDE):
    """(height, width) after the resize: mx-rcnn's rule, the short side to ``short_side``
    unless the long side would then round past ``max_long_side``; sides rounded to pixels."""
    scale = float(short_side) / min(height, width)
    if np.floor(scale * max(height, width) + 0.5) > max_long_side:
        scale = float(max_long_side) / max(height, width)
    return (max(1, int(np.floor(height * scale + 0.5))),
            max(1, int(np.floor(width * scale + 0.5))))


def resize_image(image, size):
    """``image`` (H, W, 3) uint8 resized to ``size`` = (height, width) with Pillow's bilinear
    filter (which, like torchvision's resize of a PIL image, widens its support when it
    shrinks)."""
    try:
        from PIL import Image
    except ImportError:
        raise DatasetError("resizing images needs Pillow: install it (pip install Pillow) in "
                           "this environment") from None
    height, width = size
    if image.shape[:2] == (height, width):
        return image
    bilinear = getattr(Image, "Resampling", Image).BILINEAR
    resized = Image.fromarray(image).resize((width, height), bilinear)
    return np.asarray(resized, dtype=np.uint8)


def scale_boxes(boxes, from_hw, to_hw):
    """Boxes on an image of ``from_hw`` moved onto the same image resized to ``to_hw``: x by
    the width ratio, y by the height ratio (torchvision's resize_boxes)."""
    sy = float(to_hw[0]) / from_hw[0]
    sx = float(to_hw[1]) / from_hw[1]
    return (np.asarray(boxes, np.float32) * np.array([sx, sy, sx, sy], np.float32)).astype(
        np.float32)


def flip_boxes(boxes, width):
    """Boxes of an image ``width`` wide, mirrored: x1' = W - x2, x2' = W - x1 (exact with
    exclusive x2; VOC's inclusive pixels would need W - 1)."""
    boxes = np.asarray(boxes, np.float32)
    out = boxes.copy()
    out[:, 0] = width - boxes[:, 2]
    out[:, 2] = width - boxes[:, 0]
    return out


def _normalising_table():
    """(3, 256) float32: each channel's normalised value of each uint8 level, computed with
    the same float32 operations as normalising pixel by pixel, so a lookup gives the same bits
    at less than half the cost."""
    levels = np.arange(256, dtype=np.float32)[None, :] / np.float32(255.0)
    mean = np.array(IMAGENET_MEAN, np.float32)[:, None]
    std = np.array(IMAGENET_STD, np.float32)[:, None]
    return ((levels - mean) / std).astype(np.float32)


NORMALISED = _normalising_table()


def normalize(image, out=None, flip=False):
    """(H, W, 3) uint8 RGB to (3, H, W) float32: x / 255, minus ImageNet's mean, over its
    standard deviation; written into ``out`` when given (a canvas's top left, say), mirrored
    left to right when ``flip``."""
    image = np.asarray(image)
    height, width = image.shape[:2]
    if out is None:
        out = np.empty((3, height, width), np.float32)
    columns = slice(None, None, -1) if flip else slice(None)
    for c in range(3):
        np.take(NORMALISED[c], image[:, columns, c], out=out[c], mode="clip")
    return out


def _resize(image, boxes, short_side, max_long_side):
    """(resized uint8 image, boxes scaled onto it, its (h, w))."""
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise DatasetError("an image must be (height, width, 3) uint8 RGB, got {} {}".format(
            image.shape, image.dtype))
    size = resized_shape(image.shape[0], image.shape[1], short_side, max_long_side)
    boxes = scale_boxes(np.asarray(boxes, np.float32).reshape(-1, 4), image.shape[:2], size)
    return resize_image(image, size), boxes, size


def check_sample(image_hw, boxes, labels, what, num_classes=None, require_boxes=False):
    """Raise DatasetError naming ``what`` (the image) unless its ``boxes`` (K, 4) are finite,
    non-empty and inside its ``image_hw`` (height, width), its ``labels`` (K,) are class ids
    1..num_classes (1 or more when num_classes is None; 0 is background and padding), and, when
    ``require_boxes``, K >= 1. Returns (boxes float32 (K, 4), labels (K,))."""
    height, width = (int(v) for v in image_hw)
    boxes = np.asarray(boxes, np.float32)
    if boxes.size == 0:
        boxes = boxes.reshape(0, 4)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise DatasetError("{}: boxes must be (K, 4) as (x1, y1, x2, y2), got shape {}".format(
            what, boxes.shape))
    labels = np.asarray(labels).reshape(-1)
    if len(labels) != len(boxes):
        raise DatasetError("{}: {} boxes but {} labels: give one class id per box".format(
            what, len(boxes), len(labels)))
    if require_boxes and len(boxes) == 0:
        raise DatasetError(
            "{}: no boxes, but this configuration trains on ground truth and needs at least one "
            "per image; leave such images out (VOCDetection(..., empty='skip')) or pass "
            "require_boxes=False".format(what))
    for k, box in enumerate(boxes):
        x1, y1, x2, y2 = (float(v) for v in box)
        if not np.isfinite(box).all():
            raise DatasetError("{}: box {} {} is not finite".format(what, k, box.tolist()))
        if x2 <= x1 or y2 <= y1:
            raise DatasetError("{}: box {} {} is empty: boxes are (x1, y1, x2, y2) with x2 > x1 "
                               "and y2 > y1".format(what, k, box.tolist()))
        if x1 < 0 or y1 < 0 or x2 > width or y2 > height:
            raise DatasetError("{}: box {} {} reaches outside the {} x {} (height x width) image: "
                               "boxes lie in [0, width] x [0, height]; clip it to the image".format(
                                   what, k, box.tolist(), height, width))
    if len(labels):
        if labels.dtype.kind not in "iu" and not (labels == np.round(labels)).all():
            raise DatasetError("{}: labels {} are not whole class ids".format(
                what, labels.tolist()))
        top = num_classes if num_classes is not None else np.iinfo(np.int32).max
        bad = (labels < 1) | (labels > top)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise DatasetError("{}: box {} has class id {}, outside 1..{} (0 is the background, "
                               "never a box's class)".format(
                                   what, k, labels[k].item(),
                                   num_classes if num_classes is not None else "num_classes"))
    return boxes, labels


def transform(image, boxes, flip=False, short_side=SHORT_SIDE, max_long_side=MAX_LONG_SIDE):
    """One image and its boxes through resize, optional flip and normalisation.

    Returns (image (3, h, w) float32, boxes float32 on it, (h, w)).
    """
    resized, boxes, size = _resize(image, boxes, short_side, max_long_side)
    if flip:
        boxes = flip_boxes(boxes, size[1])
    return normalize(resized, flip=flip), boxes, size


def empty_batch(batch_size, canvas, max_boxes):
    """A batch of ``batch_size`` all-padding examples, to be filled in."""
    height, width = canvas_shape(canvas)
    return {
        "images": np.zeros((batch_size, 3, height, width), np.float32),
        "image_hw": np.zeros((batch_size, 2), np.int32),
        "gt_boxes": np.zeros((batch_size, max_boxes, 4), np.float32),
        "gt_labels": np.zeros((batch_size, max_boxes), np.int32),
        "gt_count": np.zeros((batch_size,), np.int32),
        "difficult": np.zeros((batch_size, max_boxes), bool),
        "original_hw": np.zeros((batch_size, 2), np.int32),
        "flipped": np.zeros((batch_size,), bool),
    }


def put_example(batch, i, image_hw, boxes, labels, difficult=None, original_hw=None,
                flipped=False, name=None):
    """Example ``i``'s size, boxes, labels and difficult flags into ``batch`` (boxes at the
    front of the slots), after checking that it fits; returns the canvas region (3, h, w) its
    pixels go to."""
    what = name if name is not None else "example {}".format(i)
    height, width = batch["images"].shape[2:]
    max_boxes = batch["gt_boxes"].shape[1]
    h, w = (int(v) for v in image_hw)
    if h > height or w > width:
        raise DatasetError(
            "{}: the resized image is {} x {} but the canvas is {} x {}; give a larger canvas "
            "or a smaller short_side / max_long_side".format(what, h, w, height, width))
    count = len(boxes)
    if count > max_boxes:
        raise DatasetError("{}: {} boxes but the batch holds max_boxes={}; raise max_boxes".format(
            what, count, max_boxes))
    batch["image_hw"][i] = (h, w)
    batch["gt_boxes"][i, :count] = boxes
    batch["gt_labels"][i, :count] = labels
    batch["gt_count"][i] = count
    if difficult is not None:
        batch["difficult"][i, :count] = difficult
    batch["original_hw"][i] = original_hw if original_hw is not None else (h, w)
    batch["flipped"][i] = bool(flipped)
    return batch["images"][i, :, :h, :w]


def make_batch(samples, flips=None, canvas=CANVAS, max_boxes=MAX_BOXES, short_side=SHORT_SIDE,
               max_long_side=MAX_LONG_SIDE, names=None, num_classes=None, require_boxes=False):
    """A batch dict from ``samples``, each (image HWC uint8, boxes, labels, difficult) as
    ``VOCDetection`` gives them; ``flips`` one bool per sample (default none flipped);
    ``names`` name the samples in errors. Each sample is checked first (``check_sample``: boxes
    inside the image, class ids in 1..``num_classes``, at least one box when
    ``require_boxes``)."""
    samples = list(samples)
    flips = [False] * len(samples) if flips is None else [bool(f) for f in flips]
    if len(flips) != len(samples):
        raise DatasetError("{} flips for {} samples: give one per sample".format(
            len(flips), len(samples)))
    batch = empty_batch(len(samples), canvas, max_boxes)
    for i, (sample, flip) in enumerate(zip(samples, flips)):
        image, boxes, labels, difficult = sample
        name = "example {}".format(i) if names is None else names[i]
        boxes, labels = check_sample(np.shape(image)[:2], boxes, labels, name, num_classes,
                                     require_boxes)
        resized, boxes, size = _resize(image, boxes, short_side, max_long_side)
        # scaling in float32 may put an edge a rounding error past the resized image
        boxes[:, 0::2] = np.clip(boxes[:, 0::2], 0, size[1])
        boxes[:, 1::2] = np.clip(boxes[:, 1::2], 0, size[0])
        if flip:
            boxes = flip_boxes(boxes, size[1])
        region = put_example(batch, i, size, boxes, labels, difficult, np.shape(image)[:2], flip,
                             name)
        normalize(resized, out=region, flip=flip)
    return batch


def iterate_batches(dataset, batch_size, seed=0, shuffle=True, flip=True, drop_last=False,
                    canvas=CANVAS, max_boxes=MAX_BOXES, short_side=SHORT_SIDE,
                    max_long_side=MAX_LONG_SIDE, num_classes=None, require_boxes=False):
    """One epoch of batch dicts over ``dataset`` (indexable, each item as ``make_batch``
    takes): the order shuffled and each image flipped with probability 1/2 when asked, both
    from ``seed`` (give each epoch its own seed). mx-rcnn instead appends a flipped copy of
    every image to the epoch; torchvision's references flip at random, as here. ``num_classes``
    and ``require_boxes`` are ``make_batch``'s checks."""
    rng = np.random.RandomState(seed)
    order = rng.permutation(len(dataset)) if shuffle else np.arange(len(dataset))
    flips = rng.uniform(size=len(dataset)) < 0.5 if flip else np.zeros(len(dataset), bool)
    stop = len(order) - len(order) % batch_size if drop_last else len(order)
    name_of = getattr(dataset, "name_of", None)
    for start in range(0, stop, batch_size):
        indices = order[start:start + batch_size]
        names = [name_of(int(i)) for i in indices] if name_of is not None else None
        yield make_batch([dataset[int(i)] for i in indices], flips[start:start + batch_size],
                         canvas, max_boxes, short_side, max_long_side, names, num_classes,
                         require_boxes)


def _ints(rng, low, high, size=None, dtype=np.int64):
    """Integers in [low, high) from a RandomState or a Generator."""
    draw = rng.integers if hasattr(rng, "integers") else rng.randint
    return draw(low, high, size=size, dtype=dtype)


def _random_state(rng):
    if isinstance(rng, (int, np.integer)):
        return np.random.RandomState(int(rng))
    if hasattr(rng, "uniform") and (hasattr(rng, "integers") or hasattr(rng, "randint")):
        return rng
    raise DatasetError("rng must be a seed, a numpy RandomState or a Generator, got {!r}".format(
        rng))


def class_colours(num_classes):
    """A fixed RGB colour per class (row 0, background, unused), the same for every batch, so
    a detector can learn the classes of synthetic boxes."""
    return np.random.RandomState(12345).randint(0, 256, size=(num_classes + 1, 3))


def _check_counts(num_classes, min_boxes, max_boxes):
    if num_classes < 1:
        raise DatasetError("num_classes={} counts object classes (background not counted): "
                           "give at least 1".format(num_classes))
    if not 1 <= min_boxes <= max_boxes:
        raise DatasetError("need 1 <= min_boxes <= max_boxes, got {} and {}".format(
            min_boxes, max_boxes))


def synthetic_image(rng, height, width, num_classes, max_boxes, min_boxes=1, min_box_size=None):
    """One (height, width, 3) uint8 image of ``min_boxes`` to ``max_boxes`` rectangles with
    their boxes (float32, whole pixels, tbdzoo's coordinates) and labels (int64,
    1..num_classes): each rectangle is filled with its class's colour (``class_colours``)
    plus noise, over a background of one random colour plus noise; later rectangles may cover
    earlier ones. Sides are at least ``min_box_size`` (default an eighth of the image's short
    side, at least 2). ``rng`` is a seed, a RandomState or a Generator."""
    rng = _random_state(rng)
    _check_counts(num_classes, min_boxes, max_boxes)
    colours = class_colours(num_classes)
    smallest = min_box_size if min_box_size is not None else max(2, min(height, width) // 8)
    smallest = max(1, min(smallest, height, width))
    palette = colours.astype(np.int16)
    palette[0] = _ints(rng, 0, 256, size=3)          # this image's background
    count = int(_ints(rng, min_boxes, max_boxes + 1))
    labels = _ints(rng, 1, num_classes + 1, size=count).astype(np.int64)
    boxes = np.zeros((count, 4), np.float32)
    painted = np.zeros((height, width), np.int64 if num_classes > 255 else np.uint8)
    for k in range(count):
        bh = int(_ints(rng, smallest, height + 1))
        bw = int(_ints(rng, smallest, width + 1))
        y1 = int(_ints(rng, 0, height - bh + 1))
        x1 = int(_ints(rng, 0, width - bw + 1))
        boxes[k] = (x1, y1, x1 + bw, y1 + bh)
        painted[y1:y1 + bh, x1:x1 + bw] = labels[k]
    image = palette[painted]
    image += _ints(rng, -24, 25, size=(height, width, 3), dtype=np.int16)
    return np.clip(image, 0, 255).astype(np.uint8), boxes, labels


def synthetic_detection_batch(rng, batch, canvas, num_classes, max_boxes, min_boxes=1,
                              min_box_size=None, min_image_fraction=0.5):
    """A valid batch dict of ``synthetic_image``s, normalised like real images, for tiny
    configs.

    Each image's valid size is uniform in [``min_image_fraction``, 1] of the canvas on each side
    (the first image fills the canvas, so padding and full images both occur) and holds
    ``min_boxes`` to ``max_boxes`` rectangles. ``num_classes`` counts object classes: labels
    are 1..num_classes. ``rng`` is a seed, a RandomState or a Generator; the batch depends on
    it alone.
    """
    rng = _random_state(rng)
    height, width = canvas_shape(canvas)
    _check_counts(num_classes, min_boxes, max_boxes)
    out = empty_batch(batch, (height, width), max_boxes)
    for i in range(batch):
        if i == 0:
            h, w = height, width
        else:
            h = int(_ints(rng, max(1, int(np.ceil(height * min_image_fraction))), height + 1))
            w = int(_ints(rng, max(1, int(np.ceil(width * min_image_fraction))), width + 1))
        image, boxes, labels = synthetic_image(rng, h, w, num_classes, max_boxes, min_boxes,
                                               min_box_size)
        normalize(image, out=put_example(out, i, (h, w), boxes, labels))
    return out


def check_detection_batch(batch, num_classes=None, require_boxes=False):
    """Raise DatasetError naming the first key and example that break the batch format:
    the keys, shapes and dtypes above, valid sizes within the canvas, counts within the box
    slots (at least 1 when ``require_boxes``), real boxes with x1 < x2 and y1 < y2 inside the
    valid region, labels in 1..num_classes (when given), and zeros in every padded slot."""
    missing = [k for k in BATCH_KEYS if k not in batch]
    if missing:
        raise DatasetError("the detection batch lacks {}".format(", ".join(missing)))
    images = batch["images"]
    if images.ndim != 4 or images.shape[1] != 3 or images.dtype != np.float32:
        raise DatasetError("images must be (N, 3, H, W) float32, got {} {}".format(
            images.shape, images.dtype))
    n, _, height, width = images.shape
    max_boxes = batch["gt_boxes"].shape[1] if batch["gt_boxes"].ndim == 3 else -1
    expected = {"image_hw": ((n, 2), np.int32), "gt_boxes": ((n, max_boxes, 4), np.float32),
                "gt_labels": ((n, max_boxes), np.int32), "gt_count": ((n,), np.int32),
                "difficult": ((n, max_boxes), np.bool_), "original_hw": ((n, 2), np.int32),
                "flipped": ((n,), np.bool_)}
    for key, (shape, dtype) in expected.items():
        value = batch[key]
        if value.shape != shape or value.dtype != dtype:
            raise DatasetError("{} must be {} {}, got {} {}".format(
                key, shape, np.dtype(dtype).name, value.shape, value.dtype))
    for i in range(n):
        h, w = (int(v) for v in batch["image_hw"][i])
        count = int(batch["gt_count"][i])
        if not (1 <= h <= height and 1 <= w <= width):
            raise DatasetError("example {}: image_hw {} x {} outside the {} x {} canvas".format(
                i, h, w, height, width))
        if not 0 <= count <= max_boxes:
            raise DatasetError("example {}: gt_count {} outside [0, {}]".format(i, count,
                                                                                 max_boxes))
        if require_boxes and count == 0:
            raise DatasetError("example {}: no boxes, but this configuration needs at least one "
                               "per image".format(i))
        boxes, labels = batch["gt_boxes"][i], batch["gt_labels"][i]
        real = boxes[:count]
        bad = ((real[:, 0] < 0) | (real[:, 1] < 0) | (real[:, 2] > w) | (real[:, 3] > h)
               | (real[:, 2] <= real[:, 0]) | (real[:, 3] <= real[:, 1]))
        if bad.any():
            raise DatasetError("example {}: box {} {} is empty or outside its {} x {} image".format(
                i, int(np.argmax(bad)), real[np.argmax(bad)].tolist(), h, w))
        top = num_classes if num_classes is not None else np.iinfo(np.int32).max
        if count and not ((labels[:count] >= 1) & (labels[:count] <= top)).all():
            raise DatasetError("example {}: labels {} outside 1..{}".format(
                i, labels[:count].tolist(), num_classes))
        if (boxes[count:] != 0).any() or (labels[count:] != 0).any() or \
                batch["difficult"][i, count:].any():
            raise DatasetError("example {}: box slots past gt_count={} are not 0".format(i, count))
        if (images[i, :, h:, :] != 0).any() or (images[i, :, :, w:] != 0).any():
            raise DatasetError("example {}: pixels outside its {} x {} image are not 0".format(
                i, h, w))
