"""Boxes and scores NMS kernels are checked on against the NumPy reference (imported by the
tests and, in the JAX environment, by the checks they run there)."""
import numpy as np


def tied_pixel_boxes(rng, n=300):
    """Whole-pixel boxes piled on a small area, scores from 4 values: many overlaps, many ties,
    IoUs exactly at 0.5 (two boxes of one width, one twice the other's height)."""
    xy = rng.randint(0, 50, (n, 2))
    wh = rng.randint(1, 25, (n, 2))
    boxes = np.concatenate([xy, xy + wh], 1).astype(np.float32)
    boxes[1] = boxes[0]
    boxes[1, 3] = boxes[0, 1] + (boxes[0, 3] - boxes[0, 1]) / 2  # IoU 0.5 with box 0
    scores = rng.randint(0, 4, n).astype(np.float32) / 4
    return boxes, scores


def float_boxes(rng, n=400):
    xy = rng.uniform(0, 60, (n, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(1, 30, (n, 2))], 1)
    return boxes, rng.uniform(size=n)


THRESHOLDS = (0.3, 0.5, 0.7)
