"""RoIAlign's gather points (``roi_align.roi_align_points``) computed by PyTorch on a device,
for ``tbdzoo.models.faster_rcnn.detection.kernels.lending``: the same float32 operations, one elementwise kernel
each (no fused multiply-add, no division turned into a multiplication: ``divide``), so the
indices and weights are those of the NumPy reference, bit for bit (tests/test_detection_ops.py
on the CPU, benchmarks/detection_kernels_check.py on a GPU). At Faster R-CNN's size (128 RoIs,
14 x 14 bins, 2 x 2 samples, 4 taps: 400,000 points) NumPy takes tens of milliseconds a step on
the host. The points stay on the device as :class:`TorchDeviceArray`: RoIAlign reads them
there, so their 3 MB never travel to the host and back."""
import numpy as np
import torch

from ...spec.targets import DeviceArray


class TorchDeviceArray(DeviceArray):
    """A PyTorch tensor a targets step wrote, left on its device (``spec.targets.DeviceArray``)."""

    def _host_copy(self):
        return self.native.cpu().numpy()

    @classmethod
    def stack(cls, arrays):
        return cls(torch.stack([a.native for a in arrays]), arrays[0].dtype)


def divide(x, value):
    """``x / value`` rounded as NumPy rounds it: PyTorch's CUDA kernels divide by a Python
    number as a multiplication by its reciprocal, which can differ in the last bit
    (roi_h / 14); a divisor on the device is divided by."""
    return x / torch.full((), float(value), dtype=x.dtype, device=x.device)


def _axis_samples(start, bin_size, bins, sr):
    """(R, bins * sr) sample coordinates along one axis, bin-major."""
    device = start.device
    b = torch.arange(bins, dtype=torch.float32, device=device)
    s = torch.arange(sr, dtype=torch.float32, device=device) + 0.5
    coarse = start[:, None, None] + b[None, :, None] * bin_size[:, None, None]
    return (coarse + divide(s[None, None, :] * bin_size[:, None, None], sr)).reshape(
        len(start), -1)


def _corners(coord, size):
    outside = (coord < -1.0) | (coord > size)
    coord = torch.where(coord <= 0, torch.zeros_like(coord), coord)
    low = coord.long()  # truncation of a non-negative value
    last = low >= size - 1
    low = torch.where(last, torch.full_like(low, size - 1), low)
    high = torch.where(last, torch.full_like(low, size - 1), low + 1)
    coord = torch.where(last, low.float(), coord)
    return outside, low, high, coord - low.float()


def points(rois, feature_hw, spatial_scale, output_size, sampling_ratio, aligned, device):
    """Indices (R, S, 4) int32 and weights (R, S, 4) float32, as TorchDeviceArrays on
    ``device`` (the indices' tensor int64, the dtype PyTorch's gathers take)."""
    height, width = feature_hw
    out_h, out_w = output_size
    sr = int(sampling_ratio)
    r = torch.from_numpy(np.ascontiguousarray(rois, dtype=np.float32)).to(device)
    offset = 0.5 if aligned else 0.0
    scale = float(np.float32(spatial_scale))
    x1 = r[:, 0] * scale - offset
    y1 = r[:, 1] * scale - offset
    roi_w = r[:, 2] * scale - offset - x1
    roi_h = r[:, 3] * scale - offset - y1
    if not aligned:
        roi_w = roi_w.clamp(min=1.0)
        roi_h = roi_h.clamp(min=1.0)
    ys = _axis_samples(y1, divide(roi_h, out_h), out_h, sr)
    xs = _axis_samples(x1, divide(roi_w, out_w), out_w, sr)
    y_out, y_low, y_high, ly = _corners(ys, height)
    x_out, x_low, x_high, lx = _corners(xs, width)
    n = len(r)

    def grid(y_part, x_part, combine):
        y5 = y_part.reshape(n, out_h, sr, 1, 1)
        x5 = x_part.reshape(n, 1, 1, out_w, sr)
        return combine(y5, x5).permute(0, 1, 3, 2, 4).reshape(n, -1)
    hy, hx = 1.0 - ly, 1.0 - lx
    weights = torch.stack([grid(hy, hx, torch.mul), grid(hy, lx, torch.mul),
                           grid(ly, hx, torch.mul), grid(ly, lx, torch.mul)], dim=2)
    indices = torch.stack([grid(y_low * width, x_low, torch.add),
                           grid(y_low * width, x_high, torch.add),
                           grid(y_high * width, x_low, torch.add),
                           grid(y_high * width, x_high, torch.add)], dim=2)
    outside = grid(y_out, x_out, torch.logical_or)[:, :, None]
    weights = torch.where(outside, torch.zeros_like(weights), weights)
    indices = torch.where(outside, torch.zeros_like(indices), indices)
    return TorchDeviceArray(indices, np.int32), TorchDeviceArray(weights, np.float32)


def host_kernel(device):
    """``roi_align_points`` by PyTorch on ``device``, for ``kernels.lending``."""
    def kernel(rois, feature_hw, spatial_scale, output_size, sampling_ratio, aligned):
        return points(rois, feature_hw, spatial_scale, output_size, sampling_ratio, aligned,
                      device)
    return kernel
