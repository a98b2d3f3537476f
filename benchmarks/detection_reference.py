"""CPU cost of the detection reference per image at Faster R-CNN's paper size (docs/detection.md).

    .venv/bin/python -m benchmarks.detection_reference
    .venv-cntk/bin/python -m benchmarks.detection_reference      # NumPy 1.19, the CNTK worker's

A 600 x 1000 image, a 38 x 63 feature map (21,546 anchors), three objects. The RPN outputs are
drawn two ways, because NMS's cost depends on them: ``random`` (an untrained RPN: few boxes
overlap, NMS stops early) and ``clustered`` (objectness follows the objects: many boxes overlap
and NMS walks far down the 12,000). Each time is the best of ``--repeats`` runs.
"""
import argparse
import functools
import os
import time

HERE = os.path.dirname(os.path.abspath(__file__))

import numpy as np

from tbdzoo.models.faster_rcnn.detection.anchors import anchors
from tbdzoo.models.faster_rcnn.detection.boxes import iou
from tbdzoo.models.faster_rcnn.detection.postprocess import detections
from tbdzoo.models.faster_rcnn.detection.proposals import EVAL, TRAIN, proposals
from tbdzoo.models.faster_rcnn.detection.roi_align import roi_align_points
from tbdzoo.models.faster_rcnn.detection.targets import anchor_targets, sample_rois

HEIGHT, WIDTH = 600, 1000
GT = np.array([[50.0, 60.0, 300.0, 400.0], [400.0, 100.0, 700.0, 500.0], [720.0, 300.0, 990.0, 590.0]])
LABELS = [1, 5, 9]


def best_ms(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times), out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.RandomState(0)
    grid = anchors(38, 63, 16)
    print("numpy {}, {} anchors, load average {:.1f}".format(
        np.__version__, len(grid), os.getloadavg()[0]))
    ms, _ = best_ms(lambda: anchor_targets(grid, GT, (HEIGHT, WIDTH), np.random.RandomState(1)),
                    args.repeats)
    print("anchor_targets: {:.1f} ms".format(ms))
    outputs = {
        "random": (rng.randn(len(grid)), rng.randn(len(grid), 4) * 0.2),
        "clustered": (iou(grid, GT).max(axis=1) + rng.randn(len(grid)) * 0.05,
                      rng.randn(len(grid), 4) * 0.1),
    }
    for name, (objectness, deltas) in sorted(outputs.items()):
        for preset, settings in (("TRAIN", TRAIN), ("EVAL", EVAL)):
            ms, (boxes, _) = best_ms(functools.partial(proposals, objectness, deltas, grid,
                                                       (HEIGHT, WIDTH), **settings), args.repeats)
            print("proposals {} ({} RPN): {:.1f} ms, {} boxes".format(preset, name, ms, len(boxes)))
    train_boxes, _ = proposals(*outputs["clustered"], anchors=grid, valid_hw=(HEIGHT, WIDTH), **TRAIN)
    ms, sampled = best_ms(lambda: sample_rois(train_boxes, GT, LABELS, np.random.RandomState(2)),
                          args.repeats)
    print("sample_rois: {:.1f} ms".format(ms))
    ms, _ = best_ms(lambda: roi_align_points(sampled[0], (38, 63), 1 / 16.0, (14, 14), 2, False),
                    args.repeats)
    print("roi_align_points (128 RoIs, 14 x 14, 2 x 2 samples): {:.1f} ms".format(ms))
    eval_boxes, _ = proposals(*outputs["clustered"], anchors=grid, valid_hw=(HEIGHT, WIDTH), **EVAL)
    logits, box_deltas = rng.randn(len(eval_boxes), 21) * 3, rng.randn(len(eval_boxes), 84) * 0.5
    ms, _ = best_ms(lambda: detections(logits, box_deltas, eval_boxes, (HEIGHT, WIDTH)), args.repeats)
    print("postprocess.detections ({} RoIs): {:.1f} ms".format(len(eval_boxes), ms))


if __name__ == "__main__":
    main()
