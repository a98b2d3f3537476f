"""torchvision's ``FasterRCNN`` assembled as tbdzoo's ``faster_rcnn`` (docs/models/faster_rcnn.md): the
reference the parameter test compares names and shapes with, and the contender
``benchmarks/gpu_faster_rcnn.py`` times against tbdzoo's step.

The trunk is torchvision's ResNet built from its own ``Bottleneck`` with the hyperparameters'
stages and width (the paper config's is ``resnet101``'s, name for name and shape; the tiny
config's is the same code, smaller), frozen batch norm at the model's epsilon; conv1 .. layer3
is the backbone (stride 16), layer4 + average pooling the box head, ``RPNHead`` and
``FastRCNNPredictor`` the rest. Every hyperparameter ``FasterRCNN``'s constructor takes comes
from tbdzoo's: the anchors, the RPN's sampling and thresholds, the training and evaluation
proposal counts, the RoI sampling, RoIAlign, the detection thresholds. What it does not take:

- the RPN's ``min_size`` (torchvision's 1e-3) is an attribute of the built RPN; it is set to
  the model's ``rpn_min_size``;
- anchors crossing the image border are used (tbdzoo ignores them, ``allowed_border`` 0);
- the head's smooth L1 has beta 1/9 (tbdzoo: sigma 1, beta 1); the RPN's divides by the
  anchors sampled (tbdzoo: by ``rpn_batch``);
- RoIs are sampled from IoU 0 up (tbdzoo's ``bg_iou_low`` 0 agrees) and a short sample is
  not padded (tbdzoo pads to ``rois_per_image`` with ignored RoIs).

Images go through torchvision's own transform with mean 0 and standard deviation 1 (tbdzoo's
batches are already normalised) and ``min_size`` / ``max_size`` given by the caller, the
image's own sides, so it is not resized.
"""
from collections import OrderedDict
from functools import partial

import torch
from torch import nn
from torchvision.models.detection import FasterRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, RPNHead
from torchvision.models.resnet import Bottleneck
from torchvision.ops import FrozenBatchNorm2d, MultiScaleRoIAlign

TRUNK = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3")
# tbdzoo's frozen batch norm tensors -> FrozenBatchNorm2d's buffers
BN_NAMES = {"gamma": "weight", "beta": "bias"}


def _stage(inplanes, planes, blocks, stride, norm_layer):
    """torchvision's ``ResNet._make_layer`` for Bottleneck: the projection shortcut on the first
    block when the stride or the width changes."""
    downsample = None
    if stride != 1 or inplanes != planes * Bottleneck.expansion:
        downsample = nn.Sequential(
            nn.Conv2d(inplanes, planes * Bottleneck.expansion, 1, stride=stride, bias=False),
            norm_layer(planes * Bottleneck.expansion))
    layers = [Bottleneck(inplanes, planes, stride, downsample, norm_layer=norm_layer)]
    layers += [Bottleneck(planes * Bottleneck.expansion, planes, norm_layer=norm_layer)
               for _ in range(1, blocks)]
    return nn.Sequential(*layers)


def resnet_trunk(hp):
    """conv1 .. layer4 of a ResNet with the model's ``blocks`` and ``width`` (64 and (3, 4, 23,
    3): torchvision's ``resnet101``), frozen batch norm of epsilon ``bn_eps``; returns
    (OrderedDict of the modules, layer3's channels, layer4's channels)."""
    norm_layer = partial(FrozenBatchNorm2d, eps=hp["bn_eps"])
    width = hp["width"]
    modules = OrderedDict([
        ("conv1", nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)),
        ("bn1", norm_layer(width)), ("relu", nn.ReLU(inplace=True)),
        ("maxpool", nn.MaxPool2d(3, stride=2, padding=1))])
    inplanes = width
    for stage, blocks in enumerate(hp["blocks"]):
        planes = width * 2 ** stage
        modules["layer{}".format(stage + 1)] = _stage(inplanes, planes, blocks,
                                                      1 if stage == 0 else 2, norm_layer)
        inplanes = planes * Bottleneck.expansion
    return modules, inplanes // 2, inplanes


def faster_rcnn(hp, min_size=800, max_size=1333):
    """torchvision's FasterRCNN with tbdzoo's hyperparameters ``hp``; its transform resizes an
    image's short side to ``min_size`` unless the long side would pass ``max_size`` (give an
    image's own sides to leave it as it is)."""
    trunk, features, head_channels = resnet_trunk(hp)
    backbone = nn.Sequential(OrderedDict((k, trunk[k]) for k in TRUNK))
    backbone.out_channels = features
    box_head = nn.Sequential(OrderedDict([("layer4", trunk["layer4"]),
                                          ("avgpool", nn.AdaptiveAvgPool2d(1)),
                                          ("flatten", nn.Flatten())]))
    anchors = AnchorGenerator((tuple(hp["anchor_sizes"]),), (tuple(hp["anchor_ratios"]),))
    model = FasterRCNN(
        backbone, num_classes=None, min_size=min_size, max_size=max_size,
        image_mean=[0.0, 0.0, 0.0], image_std=[1.0, 1.0, 1.0],
        rpn_anchor_generator=anchors,
        rpn_head=RPNHead(features, anchors.num_anchors_per_location()[0]),
        rpn_pre_nms_top_n_train=hp["train_pre_nms"], rpn_post_nms_top_n_train=hp["train_post_nms"],
        rpn_pre_nms_top_n_test=hp["test_pre_nms"], rpn_post_nms_top_n_test=hp["test_post_nms"],
        rpn_nms_thresh=hp["rpn_nms"], rpn_fg_iou_thresh=hp["rpn_positive_iou"],
        rpn_bg_iou_thresh=hp["rpn_negative_iou"], rpn_batch_size_per_image=hp["rpn_batch"],
        rpn_positive_fraction=hp["rpn_positive_fraction"],
        box_roi_pool=MultiScaleRoIAlign(["0"], hp["roi_size"], hp["roi_sampling_ratio"]),
        box_head=box_head, box_predictor=FastRCNNPredictor(head_channels, hp["num_classes"]),
        box_score_thresh=hp["score_threshold"], box_nms_thresh=hp["detection_nms"],
        box_detections_per_img=hp["detections_per_image"], box_fg_iou_thresh=hp["fg_iou"],
        box_bg_iou_thresh=hp["fg_iou"], box_batch_size_per_image=hp["rois_per_image"],
        box_positive_fraction=hp["fg_fraction"])
    model.rpn.min_size = hp["rpn_min_size"]   # no constructor argument for it
    return model


def state_dict(weights):
    """tbdzoo's canonical weights (``model.get_weights()``, PyTorch's layouts) as the state
    dict of :func:`faster_rcnn`'s model: the same names but the batch norms' gamma and beta."""
    out = OrderedDict()
    for name, value in weights.items():
        module, _, tensor = name.rpartition(".")
        out[module + "." + BN_NAMES.get(tensor, tensor)] = torch.as_tensor(value)
    return out


def load_weights(model, weights):
    """Copy tbdzoo's weights into :func:`faster_rcnn`'s model; every tensor of the model must
    be given (a strict load), so a renamed parameter fails here rather than training from
    torchvision's own initialisation."""
    model.load_state_dict(state_dict(weights), strict=True)
    return model
