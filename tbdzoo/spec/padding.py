"""Resolve symbolic padding to explicit (begin, end) pairs once, when the spec is built.

'same' is ambiguous across frameworks (TensorFlow puts the odd pixel after, CNTK before, MXNet
only pads symmetrically), so the spec never stores it: a builder asks for it here and stores
the numbers.
"""


def same(size, kernel, stride=1, dilation=1, odd="end"):
    """Pads that give ceil(size / stride) outputs; ``odd`` says where an odd pixel goes."""
    if odd not in ("end", "begin"):
        raise ValueError("odd must be 'end' or 'begin'")
    effective = dilation * (kernel - 1) + 1
    out = -(-size // stride)
    total = max((out - 1) * stride + effective - size, 0)
    small, large = total // 2, total - total // 2
    return (small, large) if odd == "end" else (large, small)


def same_2d(hw, kernel, stride=1, dilation=1, odd="end"):
    k = kernel if isinstance(kernel, (tuple, list)) else (kernel, kernel)
    s = stride if isinstance(stride, (tuple, list)) else (stride, stride)
    return tuple(same(hw[i], k[i], s[i], dilation, odd) for i in range(2))
