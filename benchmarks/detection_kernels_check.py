"""Whether the kernels a backend lends Faster R-CNN's targets step on a GPU
(tbdzoo/models/faster_rcnn/detection/kernels.py) give the NumPy reference's results bit for bit at the paper's
size: proposals (a 38 x 64 map's 21,888 anchors, 12,000 -> NMS 0.7 -> 2,000) and, for PyTorch,
RoIAlign's gather points (128 RoIs, 14 x 14 bins, 2 x 2 samples; the record counts the indices
and weights that differ in each case). PyTorch lends the whole proposals step, JAX its NMS.
The record also holds the median time of the proposals step with the NumPy reference and with
the kernel lent (the kernel's first, compiling, call left out). The tests check the same on the
CPU (tests/test_detection_nms.py, tests/test_detection_ops.py); this is their check on the
device.

    python3 -m benchmarks.detection_kernels_check --cases 20 --out check.json
    python3 -m benchmarks.detection_kernels_check --backend jax --cases 20 --out check_jax.json
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

import numpy as np

from tbdzoo.models.faster_rcnn.detection import anchors as anchor_grid
from tbdzoo.models.faster_rcnn.detection import kernels
from tbdzoo.models.faster_rcnn.detection.proposals import proposals
from tbdzoo.models.faster_rcnn.detection.roi_align import roi_align_points

MAP_HW, IMAGE_HW = (38, 64), (600.0, 1000.0)


def proposal_case(rng, grid):
    """An RPN's outputs as a trained one gives them: logits spread over a few units, deltas
    mostly small with some large."""
    objectness = rng.normal(0, 2, len(grid)).astype(np.float32)
    deltas = (rng.normal(0, 0.3, (len(grid), 4)) * rng.choice([1, 5], (len(grid), 1))) \
        .astype(np.float32)
    return objectness, deltas


def roi_case(rng):
    xy = rng.uniform(-20, 980, (128, 2))
    return np.concatenate([xy, xy + rng.uniform(1, 500, (128, 2))], 1).astype(np.float32)


def same(got, expected):
    return all(np.array_equal(np.asarray(g), np.asarray(e)) for g, e in zip(got, expected))


def differing(got, expected):
    """How many elements of each result differ from the reference's."""
    return [int((np.asarray(g) != np.asarray(e)).sum()) for g, e in zip(got, expected)]


def lent_kernels(backend, device_name):
    """(the device's name, {slot: kernel} for the proposals step, the gather points' kernel or
    None) of ``backend`` on ``device_name``."""
    if backend == "jax":
        import jax

        from tbdzoo.backends.jax import nms as jax_nms
        platform, _, index = device_name.partition(":")
        device = jax.devices("gpu" if platform == "cuda" else platform)[int(index or 0)]
        return device.device_kind, {"nms": jax_nms.host_kernel(device)}, None
    import torch

    from tbdzoo.backends.torch import proposals as torch_proposals
    from tbdzoo.backends.torch import roi_align as torch_roi_align
    device = torch.device(device_name)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return (name, {"proposals": torch_proposals.host_kernel(device)},
            torch_roi_align.host_kernel(device))


def timed(function, *args, **kwargs):
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - start


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=("torch", "jax"), default="torch")
    p.add_argument("--cases", type=int, default=20)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=os.path.join(HERE, "results", "detection_kernels_check.json"))
    args = p.parse_args()
    device_name, lent, gather_kernel = lent_kernels(args.backend, args.device)
    grid = anchor_grid.anchors(*MAP_HW)
    rng = np.random.RandomState(0)
    record = {"backend": args.backend, "device": device_name, "lent": sorted(lent),
              "cases": args.cases, "proposals_equal": 0}
    if gather_kernel is not None:
        record.update(gather_points_equal=0, gather_points_differing=[])
    settings = dict(pre_nms=12000, post_nms=2000, threshold=0.7, min_size=16)
    reference_s, lent_s = [], []
    for case in range(args.cases):
        objectness, deltas = proposal_case(rng, grid)
        expected, seconds = timed(proposals, objectness, deltas, grid, IMAGE_HW, **settings)
        reference_s.append(seconds)
        with kernels.lending(**lent):
            got, seconds = timed(proposals, objectness, deltas, grid, IMAGE_HW, **settings)
        if case:
            lent_s.append(seconds)
        record["proposals_equal"] += same(got, expected)
        if gather_kernel is None:
            continue
        rois = roi_case(rng)
        points = (rois, MAP_HW, 1.0 / 16, (14, 14), 2, False)
        expected = roi_align_points(*points)
        with kernels.lending(roi_align_points=gather_kernel):
            got = roi_align_points(*points)
        record["gather_points_equal"] += same(got, expected)
        record["gather_points_differing"].append(differing(got, expected))
    record["proposals_ms_reference"] = 1e3 * statistics.median(reference_s)
    record["proposals_ms_lent"] = 1e3 * statistics.median(lent_s) if lent_s else None
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print("proposals equal in {} of {} cases, on {}; median {:.1f} ms with NumPy, {} lent".format(
        record["proposals_equal"], args.cases, device_name, record["proposals_ms_reference"],
        "-" if not lent_s else "{:.1f} ms".format(record["proposals_ms_lent"])))
    if gather_kernel is not None:
        print("gather points equal in {gather_points_equal} of {cases}".format(**record))
    return 0 if record["proposals_equal"] == args.cases and \
        record.get("gather_points_equal", args.cases) == args.cases else 1


if __name__ == "__main__":
    sys.exit(main())
