"""Pooling windows: which paddings a framework's own pooling can take, and the divisor of
each average-pool window."""
import numpy as np

# Fills explicit max-pool padding where -inf is not used, so a padded cell never wins.
LOWEST_FLOAT32 = float(np.finfo(np.float32).min)


def symmetric(pads):
    """(ph, pw) when ((top, bottom), (left, right)) pads both sides alike, else None."""
    (t, b), (l, r) = pads
    return (t, l) if t == b and l == r else None


def needs_explicit_padding(attrs):
    """True when a pool's padding must be applied before an unpadded pool: frameworks pad
    symmetrically only, and a pad wider than half the window also takes this path so such
    unusual windows match the reference backend exactly."""
    sym = symmetric(attrs["padding"])
    return sym is None or 2 * max(sym) > min(attrs["kernel"])


def output_size(size, kernel, stride, pads):
    """Windows along one axis for an input of ``size`` padded by ``pads`` = (before, after)."""
    return (size + pads[0] + pads[1] - kernel) // stride + 1


def divisors(hw, kernel, stride, padding, count_include_pad):
    """What each average-pool window divides by, as an (Ho, Wo) float32 array: the window's
    cells inside the input, plus its padded cells when ``count_include_pad``."""
    counts = []
    for axis in range(2):
        size, k, s, (before, after) = hw[axis], kernel[axis], stride[axis], padding[axis]
        starts = np.arange(output_size(size, k, s, (before, after))) * s - before
        if count_include_pad:
            lo, hi = np.maximum(starts, -before), np.minimum(starts + k, size + after)
        else:
            lo, hi = np.maximum(starts, 0), np.minimum(starts + k, size)
        counts.append((hi - lo).astype(np.float64))
    return np.outer(counts[0], counts[1]).astype(np.float32)


def rescale(hw, attrs):
    """(Ho, Wo) factors turning a full-window average of a zero-padded input into the spec's
    average: kernel area over :func:`divisors`."""
    kernel = attrs["kernel"]
    table = divisors(hw, kernel, attrs["stride"], attrs["padding"], attrs["count_include_pad"])
    return (kernel[0] * kernel[1]) / table
