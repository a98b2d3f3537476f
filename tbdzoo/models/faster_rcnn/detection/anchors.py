"""The RPN's anchors, laid out and rounded exactly as torchvision's AnchorGenerator lays them out.

Row order is position-major: feature row y, then column x, then the A = len(ratios) * len(sizes)
anchors of that position, ratio-major (ratio 0.5 with sizes 128, 256, 512, then ratio 1, ...).
That is also the order of an RPN output (A*4, H, W) transposed to (H, W, A, 4).
"""
import numpy as np

from ....errors import DetectionInputError

SIZES = (128, 256, 512)
RATIOS = (0.5, 1.0, 2.0)
STRIDE = 16


def base_anchors(sizes=SIZES, ratios=RATIOS):
    """(A, 4) anchors centred on (0, 0), in float32 then rounded half to even, as torchvision:
    height / width = ratio, area = size**2."""
    scales = np.asarray(sizes, dtype=np.float32)
    h_ratios = np.sqrt(np.asarray(ratios, dtype=np.float32))
    w_ratios = np.float32(1) / h_ratios
    ws = (w_ratios[:, None] * scales[None, :]).reshape(-1)
    hs = (h_ratios[:, None] * scales[None, :]).reshape(-1)
    return np.round(np.stack([-ws, -hs, ws, hs], axis=1) / np.float32(2))


def anchors(feature_height, feature_width, stride=STRIDE, sizes=SIZES, ratios=RATIOS):
    """(feature_height * feature_width * A, 4) float32 anchors in input-image pixels; ``stride``
    is one int or (stride_y, stride_x)."""
    if int(feature_height) < 1 or int(feature_width) < 1:
        raise DetectionInputError("the feature map must be at least 1 x 1; got {} x {}".format(
            feature_height, feature_width))
    stride_y, stride_x = (stride, stride) if np.ndim(stride) == 0 else stride
    if stride_y <= 0 or stride_x <= 0:
        raise DetectionInputError("stride must be positive; got {!r}".format(stride))
    shift_x = np.arange(int(feature_width), dtype=np.float32) * np.float32(stride_x)
    shift_y = np.arange(int(feature_height), dtype=np.float32) * np.float32(stride_y)
    yy, xx = np.meshgrid(shift_y, shift_x, indexing="ij")
    shifts = np.stack([xx.ravel(), yy.ravel(), xx.ravel(), yy.ravel()], axis=1)
    base = base_anchors(sizes, ratios)
    return (shifts[:, None, :] + base[None, :, :]).reshape(-1, 4).astype(np.float32)
