"""Faster R-CNN's non-differentiable parts, one NumPy reference every backend calls
(docs/detection.md): anchors, box coding, NMS, anchor targets, proposals, RoI sampling, the
RoIAlign gather, post-processing and VOC07 mAP. Python 3.6 and NumPy 1.19 compatible."""
