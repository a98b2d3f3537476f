"""NMS with JAX computing the overlaps on a device, keeping exactly the boxes of the NumPy
reference ``tbdzoo.models.faster_rcnn.detection.nms.nms`` (docs/detection.md, "RoIAlign and NMS
on each backend"); on a GPU the JAX backend lends it to the targets step
(``kernels.lending``).

- The host puts the boxes in the reference's order (``nms.score_order``: score descending,
  equal scores by index) and computes their areas.
- The device computes, in float64 (JAX's x64 mode, for the call only), which pairs overlap
  above the threshold, as bits: one row of 64-bit words a box.
- The host walks the rows in order: a box is kept unless an earlier kept box's row has its bit,
  and a kept box's row is OR-ed into the removed set. That is one small integer operation a
  box, where the reference computes each kept box's IoU with the boxes after it.
- With ``max_keep``, the overlaps are first computed among the best ``2 * max_keep`` boxes only:
  greedy NMS decides each box from the boxes before it, so the boxes kept among a prefix are the
  first ones of the whole. Where the prefix keeps too few, it doubles, and only the new boxes'
  columns are computed and walked: the walk goes on from where it stopped.

The overlap is the reference's IoU, with its operations in its order. XLA may contract a
product that is then added into one fused multiply-add, which rounds once where NumPy rounds
twice: the areas therefore come from the host, and the intersection is held apart
(``lax.optimization_barrier``) from the subtraction that makes the union.
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...errors import DetectionInputError
from ...models.faster_rcnn.detection import nms as reference

PREFIX_PER_KEPT = 2   # with max_keep, the overlaps of the best 2 * max_keep boxes first
ROWS = 1024           # boxes whose overlaps are computed at once (bounds the device's memory)


def _padded(count):
    """The number of boxes sent for ``count`` (few compiled shapes): a power of two from 64 to
    ``ROWS``, then a multiple of ``ROWS``."""
    size = 64
    while size < min(count, ROWS):
        size *= 2
    return size if count <= ROWS else -(-count // ROWS) * ROWS


def _overlaps_above(boxes, areas, others, other_areas, threshold):
    """(len(boxes), len(others)) booleans: IoU > ``threshold``, as the reference's
    ``overlaps_above``; 0 / 0 is NaN, not above."""
    width = jnp.maximum(jnp.minimum(boxes[:, 2, None], others[None, :, 2])
                        - jnp.maximum(boxes[:, 0, None], others[None, :, 0]), 0.0)
    height = jnp.maximum(jnp.minimum(boxes[:, 3, None], others[None, :, 3])
                         - jnp.maximum(boxes[:, 1, None], others[None, :, 1]), 0.0)
    inter = lax.optimization_barrier(width * height)
    union = (areas[:, None] + other_areas[None, :]) - inter
    return inter / union > threshold


@jax.jit
def _overlap_bits(boxes, areas, columns, column_areas, threshold):
    """(len(boxes), len(columns) / 8) uint8: row i's bit j (little-endian) is set where column
    box j overlaps box i above ``threshold``; ``ROWS`` rows at a time."""
    n = boxes.shape[0]
    rows = min(n, ROWS)

    def chunk(part):
        part_boxes, part_areas = part
        over = _overlaps_above(part_boxes, part_areas, columns, column_areas, threshold)
        return jnp.packbits(over, axis=1, bitorder="little")
    bits = lax.map(chunk, (boxes.reshape(n // rows, rows, 4), areas.reshape(n // rows, rows)))
    return bits.reshape(n, -1)


def _walk(words, start, stop, kept, limit):
    """The greedy walk over positions ``start`` .. ``stop`` - 1 (in score order), given the
    positions ``kept`` before them: appends the kept ones to ``kept``, at most ``limit`` in all.
    ``words`` holds each position's overlaps with these positions (uint64 rows of bits)."""
    removed = np.bitwise_or.reduce(words[kept], axis=0) if kept else \
        np.zeros(words.shape[1], np.uint64)
    for i in range(start, stop):
        j = i - start
        if (int(removed[j >> 6]) >> (j & 63)) & 1:
            continue
        kept.append(i)
        if len(kept) >= limit:
            break
        removed |= words[i]


def nms(boxes, scores, threshold, max_keep=None, device=None):
    """Indices (int64 NumPy) of the kept boxes, best first: ``reference.nms``, its overlaps
    computed on ``device`` (default: JAX's default device)."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    scores = np.asarray(scores).reshape(-1)
    if len(scores) != len(boxes):
        raise DetectionInputError("nms got {} boxes but {} scores".format(len(boxes), len(scores)))
    order = reference.score_order(scores)
    count = len(order)
    limit = count if max_keep is None else min(count, int(max_keep))
    if limit <= 0:
        return np.zeros(0, dtype=np.int64)
    ranked = boxes[order]
    areas = (ranked[:, 2] - ranked[:, 0]) * (ranked[:, 3] - ranked[:, 1])

    def sent(begin, end):
        """Boxes ``begin`` .. ``end`` - 1 and their areas on the device, padded with zero boxes
        (which overlap nothing)."""
        padded_boxes = np.zeros((_padded(end - begin), 4), np.float64)
        padded_areas = np.zeros(len(padded_boxes), np.float64)
        padded_boxes[:end - begin], padded_areas[:end - begin] = ranked[begin:end], areas[begin:end]
        return jax.device_put(padded_boxes, device), jax.device_put(padded_areas, device)
    kept, start = [], 0
    size = count if max_keep is None else min(count, PREFIX_PER_KEPT * limit)
    while True:
        with jax.enable_x64(True):
            bits = np.asarray(_overlap_bits(*sent(0, size), *sent(start, size),
                                            np.float64(threshold)))
        _walk(bits.view(np.uint64), start, size, kept, limit)
        if len(kept) >= limit or size == count:
            break
        start, size = size, min(count, 2 * size)
    return order[np.asarray(kept, dtype=np.int64)]


def host_kernel(device):
    """``nms`` with the overlaps on ``device`` (a jax.Device), for ``kernels.lending``."""
    def kernel(boxes, scores, threshold, max_keep=None):
        return nms(boxes, scores, threshold, max_keep, device=device)
    return kernel
