"""The one definition of image-classification augmentation that every input pipeline follows.

Training: a random-resized crop (area a fraction of the image drawn from ``scale``, aspect
ratio log-uniform in ``ratio``, ten tries, then a centre crop of the image clamped to the
ratio range), resized to ``size`` x ``size`` (bilinear), flipped left-right with probability
``flip``. Evaluation: the short side resized to ``resize`` (``size / 0.875``: 256 for 224,
342 for 299), then the centre ``size`` x ``size``. Both then divide by 255, subtract ``mean``
and divide by ``std`` per RGB channel, and lay the image out as (3, size, size) float32.

Each example's crop window and flip are a pure function of (seed, epoch, dataset index, image
height, width): :func:`draw` seeds a NumPy generator with those three numbers, so every
pipeline, worker process and framework draws the same crop for the same example, and a
pipeline can draw it wherever it runs. :func:`reference` is the NumPy (Pillow) version of the
whole transform, against which the framework pipelines are tested. docs/pipelines.md.
"""
import collections
import math

import numpy as np

from ..models import get_model

__all__ = ["AugmentSpec", "CropParams", "spec_for_model", "draw", "crop_window", "eval_geometry",
           "reference"]

# Per-channel mean and std of the input, on the [0, 1] scale, of a model without its own (its
# card's ``image``): the ImageNet statistics.
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
EVAL_CROP_FRACTION = 0.875
TRIES = 10

CropParams = collections.namedtuple("CropParams", "top left height width flip")


class AugmentSpec(collections.namedtuple(
        "AugmentSpec", "size train mean std scale ratio flip resize")):
    """What one pipeline does to each image. ``train=False`` gives the evaluation transform;
    ``train=True`` with ``scale=(1, 1)``, ``ratio=(w/h...)`` is still random in position, so
    "no augmentation" is ``train=False``."""

    def __new__(cls, size, train=True, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0), flip=0.5, resize=None):
        if resize is None:
            resize = int(round(size / EVAL_CROP_FRACTION))
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError("mean and std need three numbers each (RGB), std above 0; got "
                             "{} and {}".format(mean, std))
        if not (0 < scale[0] <= scale[1] <= 1) or not (0 < ratio[0] <= ratio[1]):
            raise ValueError("scale needs 0 < low <= high <= 1 and ratio 0 < low <= high; got "
                             "scale {} ratio {}".format(scale, ratio))
        return super().__new__(
            cls, int(size), bool(train), tuple(float(m) for m in mean),
            tuple(float(s) for s in std), tuple(scale), tuple(ratio), float(flip), int(resize))

    def evaluation(self):
        return self._replace(train=False)


def spec_for_model(model_name, hparams, train=True):
    """The AugmentSpec of ``model_name``'s config: its image size and its normalisation (its
    card's ``image``; a config that holds "mean" and "std", sequences of three numbers,
    overrides them)."""
    if "image_size" not in hparams:
        raise ValueError("{} takes no images (no image_size in its config); image input "
                         "pipelines feed image classification models".format(model_name))
    image = get_model(model_name).image
    mean = tuple(hparams.get("mean", image.mean if image else IMAGENET_MEAN))
    std = tuple(hparams.get("std", image.std if image else IMAGENET_STD))
    return AugmentSpec(hparams["image_size"], train=train, mean=mean, std=std)


def generator(seed, epoch, index):
    """The NumPy generator of one example's random choices."""
    return np.random.default_rng([int(seed), int(epoch), int(index)])


def crop_window(rng, height, width, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0)):
    """(top, left, crop height, crop width) of a random-resized crop of a height x width image."""
    area = float(height * width)
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(TRIES):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    # Fallback: the whole image, narrowed to the nearest allowed aspect ratio, centred.
    aspect = float(width) / height
    if aspect < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif aspect > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w


def draw(spec, seed, epoch, index, height, width):
    """The CropParams of example ``index`` in ``epoch`` (training; None for evaluation, whose
    resize and centre crop :func:`eval_geometry` gives and which draws nothing)."""
    if not spec.train:
        return None
    rng = generator(seed, epoch, index)
    top, left, h, w = crop_window(rng, height, width, spec.scale, spec.ratio)
    return CropParams(top, left, h, w, bool(rng.uniform() < spec.flip))


def eval_geometry(spec, height, width):
    """((resized height, resized width), (top, left, h, w) of the centre crop on the resized
    image). The short side becomes ``spec.resize``; the long side keeps the aspect ratio."""
    if height <= width:
        rh, rw = spec.resize, int(round(width * spec.resize / float(height)))
    else:
        rh, rw = int(round(height * spec.resize / float(width))), spec.resize
    if min(rh, rw) < spec.size:
        raise ValueError("resize {} is below the crop size {}".format(spec.resize, spec.size))
    return (rh, rw), ((rh - spec.size) // 2, (rw - spec.size) // 2, spec.size, spec.size)


def normalise(hwc_float01, spec):
    """(H, W, 3) in [0, 1] -> (3, H, W) float32, normalised by the spec's mean and std."""
    out = (hwc_float01 - np.asarray(spec.mean, np.float32)) / np.asarray(spec.std, np.float32)
    return np.ascontiguousarray(out.transpose(2, 0, 1), dtype=np.float32)


def reference(image, spec, params=None):
    """The transform in NumPy and Pillow: uint8 (H, W, 3) -> float32 (3, size, size).
    ``params`` (from :func:`draw`) is needed for training; evaluation computes its own."""
    from PIL import Image
    pil = Image.fromarray(image)
    if spec.train:
        box = (params.left, params.top, params.left + params.width, params.top + params.height)
        pil = pil.resize((spec.size, spec.size), Image.BILINEAR, box=box)
        if params.flip:
            pil = pil.transpose(Image.FLIP_LEFT_RIGHT)
    else:
        (rh, rw), (top, left, h, w) = eval_geometry(spec, image.shape[0], image.shape[1])
        pil = pil.resize((rw, rh), Image.BILINEAR).crop((left, top, left + w, top + h))
    return normalise(np.asarray(pil, np.float32) / 255.0, spec)
