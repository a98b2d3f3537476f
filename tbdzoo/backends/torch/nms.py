"""NMS on PyTorch tensors with torchvision's kernel (CPU or CUDA), keeping exactly the boxes of
the NumPy reference ``tbdzoo.models.faster_rcnn.detection.nms.nms`` (docs/detection.md,
"RoIAlign and NMS on each backend").

Two choices make it exact. The order is fixed before torchvision sees the boxes: a stable sort
by score descending (equal scores by index ascending, the reference's tie rule), then strictly
decreasing stand-in scores, so no sort inside the kernel can reorder ties. The IoU is taken in
float64, as the reference computes it, with the same operations; torchvision suppresses at
IoU strictly greater than the threshold, as the reference does. With ``max_keep`` the kernel
first runs on the best boxes only, doubling them until it keeps enough: the same boxes, for a
fraction of the work. Where torchvision does not import, the NumPy reference runs on a host
copy.
"""
import numpy as np
import torch

from ...errors import DetectionInputError
from ...models.faster_rcnn.detection import kernels
from ...models.faster_rcnn.detection import nms as reference

PREFIX_PER_KEPT = 2  # with max_keep, NMS first runs on the best 2 * max_keep boxes


def _checked(boxes, scores):
    if boxes.dim() != 2 or boxes.shape[1] != 4:
        raise DetectionInputError("boxes must be (N, 4) as (x1, y1, x2, y2); got {}".format(
            tuple(boxes.shape)))
    scores = scores.reshape(-1)
    if scores.shape[0] != boxes.shape[0]:
        raise DetectionInputError("nms got {} boxes but {} scores".format(boxes.shape[0],
                                                                          scores.shape[0]))
    if torch.isnan(scores).any():
        raise DetectionInputError("scores[{}] is NaN: a score must be a number".format(
            int(torch.nonzero(torch.isnan(scores))[0, 0])))
    return scores


def score_order(scores):
    """Indices by score descending, equal scores by index ascending (a stable sort). Adding
    0.0 turns -0.0 into 0.0, which a radix sort would otherwise tell apart."""
    return torch.sort(scores.reshape(-1) + 0.0, descending=True, stable=True)[1]


def nms(boxes, scores, threshold, max_keep=None):
    """Indices (int64, on the boxes' device) of the kept boxes, best first: the reference's
    greedy NMS with torchvision.ops.nms doing the work. ``max_keep`` keeps the first ones."""
    scores = _checked(boxes, scores)
    try:
        import torchvision
    except ImportError:
        with kernels.lending(nms=None):  # the NumPy walk itself, even inside host_kernel
            kept = reference.nms(boxes.detach().cpu().double().numpy(),
                                 scores.detach().cpu().double().numpy(), threshold, max_keep)
        return torch.from_numpy(kept).to(boxes.device)
    order = score_order(scores)
    count = order.numel()
    ranked = boxes[order].to(torch.float64)
    ranks = -torch.arange(count, device=boxes.device, dtype=torch.float64)
    # Greedy NMS decides each box from the boxes before it alone, so NMS of the best ``size``
    # keeps exactly the kept boxes among them: once that holds ``max_keep``, they are the
    # answer. torchvision's kernel costs about size**2, and at 12,000 -> 2,000 proposals a
    # few thousand usually suffice.
    size = count if max_keep is None else min(count, PREFIX_PER_KEPT * int(max_keep))
    while True:
        kept = torchvision.ops.nms(ranked[:size], ranks[:size], float(threshold))
        if max_keep is None or size == count or kept.numel() >= int(max_keep):
            break
        size = min(count, 2 * size)
    kept = order[kept]
    return kept if max_keep is None else kept[:int(max_keep)]


def batched_nms(boxes, scores, labels, threshold):
    """NMS within each label, as the per-class NMS of ``postprocess.detections``: the kept
    indices, by score descending, equal scores by index ascending. Each class runs on its own
    (torchvision's batched_nms shifts the boxes of each class apart, which rounds the
    coordinates and so the IoU differently)."""
    scores = _checked(boxes, scores)
    labels = labels.reshape(-1)
    if labels.shape[0] != boxes.shape[0]:
        raise DetectionInputError("batched_nms got {} boxes but {} labels".format(
            boxes.shape[0], labels.shape[0]))
    kept = [own[nms(boxes[own], scores[own], threshold)]
            for own in (torch.nonzero(labels == c)[:, 0] for c in torch.unique(labels))]
    if not kept:
        return torch.zeros(0, dtype=torch.int64, device=boxes.device)
    kept = torch.sort(torch.cat(kept))[0]
    return kept[score_order(scores[kept])]


def host_kernel(device):
    """``nms`` on NumPy arrays done by torchvision on ``device``, for
    ``tbdzoo.models.faster_rcnn.detection.kernels.lending``: a backend's targets step keeps its NumPy code and
    the greedy walk, its slowest part, runs on the device."""
    def kernel(boxes, scores, threshold, max_keep=None):
        kept = nms(torch.from_numpy(np.ascontiguousarray(boxes, dtype=np.float64)).to(device),
                   torch.from_numpy(np.ascontiguousarray(scores, dtype=np.float64)).to(device),
                   threshold, max_keep)
        return kept.cpu().numpy()
    return kernel
