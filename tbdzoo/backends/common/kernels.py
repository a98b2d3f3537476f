"""Dilated convolution kernels, for frameworks without a dilated convolution (or its gradient)
on the CPU: a convolution with the kernel spread out by zeros is the dilated one."""
import numpy as np


def dilated_extent(kernel, dilation):
    """Size of the spread kernel along each axis: d (k - 1) + 1."""
    return tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilation))


def dilate_kernel(weight, dilation, axes=(2, 3)):
    """NumPy reference: ``weight`` with dilation - 1 zeros between taps along ``axes``
    (OIHW's spatial axes by default)."""
    weight = np.asarray(weight)
    kernel = [weight.shape[a] for a in axes]
    shape = list(weight.shape)
    for axis, extent in zip(axes, dilated_extent(kernel, dilation)):
        shape[axis] = extent
    out = np.zeros(shape, weight.dtype)
    index = [slice(None)] * weight.ndim
    for axis, d in zip(axes, dilation):
        index[axis] = slice(None, None, d)
    out[tuple(index)] = weight
    return out
