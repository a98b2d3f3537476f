"""Faster R-CNN's detection kernels on each framework (NMS, proposals, RoIAlign) and the
torchvision reference; the NumPy reference they match lives with the model
(tbdzoo/models/faster_rcnn/detection/)."""
