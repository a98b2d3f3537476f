"""RoIAlign as a gather: NumPy computes, per RoI sample, four feature positions and bilinear
weights; a backend's graph gathers and sums them, so every framework pools the same points.

The arithmetic follows torchvision.ops.roi_align in float32 (docs/detection.md): a sample at
y < -1, y > H, x < -1 or x > W contributes 0 (weights 0, indices 0); one in [-1, 0] is moved to 0;
one past the last row or column reads that row or column. Samples are ordered
(out_h, out_w, sr_y, sr_x), flattened; the four corners are (y_low, x_low), (y_low, x_high),
(y_high, x_low), (y_high, x_high).
"""
import numpy as np

from ....errors import DetectionInputError
from . import kernels
from .boxes import check_boxes


def _pair(value, name):
    pair = (value, value) if np.ndim(value) == 0 else tuple(value)
    if len(pair) != 2 or int(pair[0]) < 1 or int(pair[1]) < 1:
        raise DetectionInputError("{} must be a positive int or (height, width); got {!r}".format(
            name, value))
    return int(pair[0]), int(pair[1])


def _axis_samples(start, bin_size, bins, sr):
    """(R, bins * sr) float32 sample coordinates along one axis, bin-major."""
    f32 = np.float32
    b = np.arange(bins, dtype=np.float32)
    s = np.arange(sr, dtype=np.float32) + f32(0.5)
    coarse = start[:, None, None] + b[None, :, None] * bin_size[:, None, None]
    return (coarse + s[None, None, :] * bin_size[:, None, None] / f32(sr)).reshape(len(start), -1)


def _corners(coord, size):
    """Per sample: whether it is outside, low and high integer positions, the fraction past low."""
    outside = (coord < -1.0) | (coord > size)
    coord = np.where(coord <= 0, np.float32(0), coord)
    low = coord.astype(np.int64)  # truncation, as the C++ (int) cast of a non-negative value
    last = low >= size - 1
    low = np.where(last, size - 1, low)
    high = np.where(last, size - 1, low + 1)
    coord = np.where(last, low.astype(np.float32), coord)
    return outside, low, high, (coord - low.astype(np.float32)).astype(np.float32)


def roi_align_points(rois, feature_hw, spatial_scale, output_size, sampling_ratio, aligned):
    """Gather indices (R, S, 4) int32 into one image's flattened H*W map, and weights (R, S, 4)
    float32, S = out_h * out_w * sampling_ratio**2, for that image's ``rois`` (R, 4)."""
    rois = check_boxes(rois, "rois").astype(np.float32)
    height, width = _pair(feature_hw, "feature_hw")
    out_h, out_w = _pair(output_size, "output_size")
    sr = int(sampling_ratio)
    if sr < 1:
        raise DetectionInputError(
            "sampling_ratio must be a positive int (the adaptive sampling_ratio <= 0 of "
            "torchvision gives each RoI its own number of samples, which a gather cannot); got "
            "{!r}".format(sampling_ratio))
    kernel = kernels.lent("roi_align_points")
    if kernel is not None:
        return kernel(rois, (height, width), spatial_scale, (out_h, out_w), sr, aligned)
    f32 = np.float32
    offset = f32(0.5) if aligned else f32(0)
    scale = f32(spatial_scale)
    x1 = rois[:, 0] * scale - offset
    y1 = rois[:, 1] * scale - offset
    roi_w = rois[:, 2] * scale - offset - x1
    roi_h = rois[:, 3] * scale - offset - y1
    if not aligned:
        roi_w = np.maximum(roi_w, f32(1))
        roi_h = np.maximum(roi_h, f32(1))
    ys = _axis_samples(y1, roi_h / f32(out_h), out_h, sr)  # (R, out_h * sr)
    xs = _axis_samples(x1, roi_w / f32(out_w), out_w, sr)  # (R, out_w * sr)
    y_out, y_low, y_high, ly = _corners(ys, height)
    x_out, x_low, x_high, lx = _corners(xs, width)
    n = len(rois)
    # (R, out_h, sr_y, out_w, sr_x) -> (R, out_h, out_w, sr_y, sr_x)
    def grid(y_part, x_part, combine):
        y5 = y_part.reshape(n, out_h, sr, 1, 1)
        x5 = x_part.reshape(n, 1, 1, out_w, sr)
        return combine(y5, x5).transpose(0, 1, 3, 2, 4).reshape(n, -1)
    hy, hx = f32(1) - ly, f32(1) - lx
    weights = np.stack([grid(hy, hx, np.multiply), grid(hy, lx, np.multiply),
                        grid(ly, hx, np.multiply), grid(ly, lx, np.multiply)], axis=2)
    indices = np.stack([grid(y_low * width, x_low, np.add), grid(y_low * width, x_high, np.add),
                        grid(y_high * width, x_low, np.add), grid(y_high * width, x_high, np.add)],
                       axis=2)
    outside = grid(y_out, x_out, np.logical_or)[:, :, None]
    weights = np.where(outside, f32(0), weights).astype(np.float32)
    indices = np.where(outside, 0, indices).astype(np.int32)
    return indices, weights


def roi_align_numpy(features, indices, weights, output_size, sampling_ratio):
    """(R, C, out_h, out_w): the gather form applied to one image's ``features`` (C, H, W), the
    reference the graph op ``roi_align`` is tested against."""
    features = np.asarray(features)
    out_h, out_w = _pair(output_size, "output_size")
    sr = int(sampling_ratio)
    flat = features.reshape(features.shape[0], -1)  # (C, H*W)
    n = indices.shape[0]
    summed = (flat[:, indices] * weights[None]).sum(axis=-1)  # (C, R, S)
    pooled = summed.reshape(features.shape[0], n, out_h, out_w, sr * sr).mean(axis=-1)
    return pooled.transpose(1, 0, 2, 3).astype(features.dtype)
