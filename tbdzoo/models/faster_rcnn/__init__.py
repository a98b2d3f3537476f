"""Faster R-CNN (Ren et al. 2015) with a ResNet-101 "C4" network, trained on PASCAL VOC.

The backbone is ResNet-101's conv1 to layer3 (stride 16, 1,024 channels) with frozen batch
norm; an RPN of 3 x 3 anchors per position proposes boxes; RoIAlign crops 14 x 14 features per
RoI, layer4 and average pooling are the box head, and a predictor scores the 20 VOC classes
plus background and regresses a box per class. Parameter names follow torchvision's
FasterRCNN assembled from these parts (``backbone.layer3.22.conv2.weight``,
``rpn.head.cls_logits.weight``, ``roi_heads.box_predictor.bbox_pred.weight``).

The non-differentiable parts (anchor targets, proposals, RoI sampling, RoIAlign's sample
points, post-processing) are the NumPy reference in detection/ beside this file, run by the
training program's targets step (``faster_rcnn.targets``) and by :func:`detect` for inference
(docs/detection.md). Values carry their source: [M] mx-rcnn (TBD's implementation,
``rcnn/config.py``, ``symbol_resnet.py``, its VOC ResNet-101 scripts), [T] torchvision's
detection models. docs/models/faster_rcnn.md lists them with each deliberate change. Valid Python 3.6:
the CNTK worker builds the graph itself.
"""
import functools
from collections import OrderedDict

import numpy as np

from ...datasets.detection_batch import synthetic_detection_batch
from ...errors import BatchError, DetectionInputError
from ...spec import Graph
from ...spec.program import Program, clip_of, optimizer_of, schedule_of
from ...spec.targets import register_targets, stack_written, value_shape
from .. import metrics
from ..card import Benchmark, Consistency, Measured, Training
from ..constraints import Rule, boolean, integer, integers, number
from ..registry import register_model
from .detection import anchors as anchor_grid
from .detection.boxes import check_boxes, check_image_hw
from .detection.postprocess import detections
from .detection.proposals import proposals
from .detection.roi_align import roi_align_points
from .detection.targets import anchor_targets, check_labels, sample_rois

VOC07_TRAINVAL = 5011  # images; [M] appends a flipped copy of each, so an epoch is twice this

PAPER = {
    # data: [M] SCALES (600, 1000); a fixed canvas holds 600 x 1000 and 1000 x 600 alike
    "canvas": (1000, 1000), "max_boxes": 64, "num_classes": 21,
    # network: ResNet-101 [M] [T], frozen batch norm [M] (FIXED_PARAMS 'gamma', 'beta')
    "blocks": (3, 4, 23, 3), "width": 64, "bn_eps": 2e-5,     # [M] symbol_resnet eps
    # The frozen gamma of each bottleneck's last BatchNorm. [M] freezes ImageNet's statistics;
    # from scratch, identity statistics let each of the 33 residual sums double the
    # activations' variance (a first loss of 5e4 and a non-finite second step at lr 1e-3), so
    # each branch is scaled by 1/sqrt(33 bottlenecks): a first loss near 4 (docs/models).
    "residual_gamma": 33 ** -0.5,
    # anchors: [M] ANCHOR_SCALES (8, 16, 32) x stride 16, ANCHOR_RATIOS (0.5, 1, 2)
    "feature_stride": 16, "anchor_sizes": (128, 256, 512), "anchor_ratios": (0.5, 1.0, 2.0),
    # RPN targets: [M] RPN_BATCH_SIZE 256, RPN_FG_FRACTION 0.5, RPN_POSITIVE_OVERLAP 0.7,
    # RPN_NEGATIVE_OVERLAP 0.3, allowed_border 0
    "rpn_batch": 256, "rpn_positive_fraction": 0.5, "rpn_positive_iou": 0.7,
    "rpn_negative_iou": 0.3, "allowed_border": 0,
    # proposals: [M] RPN_PRE_NMS_TOP_N 12000 / 6000, RPN_POST_NMS_TOP_N 2000 / 300,
    # RPN_NMS_THRESH 0.7, RPN_MIN_SIZE 16
    "train_pre_nms": 12000, "train_post_nms": 2000, "test_pre_nms": 6000, "test_post_nms": 300,
    "rpn_nms": 0.7, "rpn_min_size": 16.0,
    # RoI sampling: [M] BATCH_ROIS 128, FG_FRACTION 0.25, FG_THRESH 0.5, BG_THRESH_HI 0.5;
    # BG_THRESH_LO 0 is [T]'s (docs/detection.md)
    "rois_per_image": 128, "fg_fraction": 0.25, "fg_iou": 0.5, "bg_iou_low": 0.0,
    # RoIAlign 14 x 14 at 1/16 [M] (its ROIPooling), 2 x 2 samples per bin, not aligned [T]
    "roi_size": 14, "roi_sampling_ratio": 2, "roi_aligned": False,
    # losses: [M] smooth L1 sigma 3 (RPN, over RPN_BATCH_SIZE) and 1 (head, over BATCH_ROIS)
    "rpn_sigma": 3.0, "head_sigma": 1.0,
    # detections: [T] box_score_thresh 0.05, box_nms_thresh 0.5, box_detections_per_img 100
    "score_threshold": 0.05, "detection_nms": 0.5, "detections_per_image": 100,
    "allow_empty_images": False,  # [M] filter_roidb drops training images without objects
    # the step: [M] one image per GPU, SGD 1e-3, momentum 0.9, wd 5e-4, x0.1 at epoch 7 of 10,
    # clip_gradient 5 (element-wise)
    "batch_size": 1, "optimizer": "sgd", "lr": 1e-3, "momentum": 0.9, "nesterov": False,
    "weight_decay": 5e-4, "lr_schedule": "step", "lr_decay": 0.1, "lr_milestones": (7,),
    "epochs": 10, "train_examples": 2 * VOC07_TRAINVAL, "grad_clip_value": 5.0,
}

# A 64 x 64 canvas (a 4 x 4 feature map), one bottleneck per stage four channels wide, 6
# anchors per position, 3 object classes: every part of the step, small enough for the
# four-backend consistency test.
TINY = dict(PAPER, residual_gamma=1.0, canvas=(64, 64), max_boxes=3, num_classes=4,
            blocks=(1, 1, 1, 1), width=4, anchor_sizes=(16, 32), rpn_batch=16,
            train_pre_nms=60, train_post_nms=20, test_pre_nms=60, test_post_nms=8,
            rpn_min_size=1.0, rois_per_image=8, roi_size=4, detections_per_image=10,
            batch_size=2, train_examples=20, lr=1e-2)

def _floats():
    return Rule(tuple, 0.0, open_low=True, item=float)

RULES = {
    "canvas": integers(16), "max_boxes": integer(1), "num_classes": integer(2),
    "blocks": integers(1), "width": integer(1), "bn_eps": number(0.0),
    "residual_gamma": number(0.0, open_low=True),
    "feature_stride": integer(1), "anchor_sizes": integers(1), "anchor_ratios": _floats(),
    "rpn_batch": integer(1), "rpn_positive_fraction": number(0.0, 1.0),
    "rpn_positive_iou": number(0.0, 1.0), "rpn_negative_iou": number(0.0, 1.0),
    "allowed_border": integer(0),
    "train_pre_nms": integer(1), "train_post_nms": integer(1), "test_pre_nms": integer(1),
    "test_post_nms": integer(1), "rpn_nms": number(0.0, 1.0), "rpn_min_size": number(0.0),
    "rois_per_image": integer(1), "fg_fraction": number(0.0, 1.0), "fg_iou": number(0.0, 1.0),
    "bg_iou_low": number(0.0, 1.0), "roi_size": integer(1), "roi_sampling_ratio": integer(1),
    "roi_aligned": boolean(), "rpn_sigma": number(0.0, open_low=True),
    "head_sigma": number(0.0, open_low=True), "score_threshold": number(0.0, 1.0),
    "detection_nms": number(0.0, 1.0), "detections_per_image": integer(1),
    "allow_empty_images": boolean(), "epochs": integer(1), "grad_clip_value": number(0.0),
}


def _checks():
    def canvas_pair(hp):
        if len(hp["canvas"]) != 2:
            return "canvas must be (height, width), got {}".format(hp["canvas"])

    def four_stages(hp):
        if len(hp["blocks"]) != 4:
            return "blocks must count the bottlenecks of layer1 to layer4, got {}".format(
                hp["blocks"])

    def thresholds(hp):
        if hp["rpn_negative_iou"] > hp["rpn_positive_iou"]:
            return "rpn_negative_iou {} is above rpn_positive_iou {}".format(
                hp["rpn_negative_iou"], hp["rpn_positive_iou"])
        if hp["bg_iou_low"] >= hp["fg_iou"]:
            return "bg_iou_low {} must be below fg_iou {}".format(hp["bg_iou_low"], hp["fg_iou"])
    return (canvas_pair, four_stages, thresholds)


# -- the graph --------------------------------------------------------------------------------
def _conv_bn(g, hp, conv, bn, x, filters, kernel, stride, pad, relu=True, gamma=1.0):
    x = g.add(conv, "conv2d", x, filters=filters, kernel=kernel, stride=stride, padding=pad)
    x = g.add(bn, "frozen_batchnorm", x, eps=hp["bn_eps"], gamma_init=gamma)
    return g.add(bn + ".relu", "relu", x) if relu else x


def _stage(g, hp, prefix, x, in_ch, stage, count):
    """ResNet's bottlenecks, v1.5 (the stride on the 3 x 3 convolution), as torchvision's
    resnet101 and tbdzoo.models.resnet50; returns (output, its channels)."""
    width = hp["width"] * 2 ** stage
    out_ch = width * 4
    for i in range(count):
        stride = 2 if (i == 0 and stage > 0) else 1
        p = g.block("{}layer{}.{}".format(prefix, stage + 1, i), "Bottleneck") + "."
        y = _conv_bn(g, hp, p + "conv1", p + "bn1", x, width, 1, 1, 0)
        y = _conv_bn(g, hp, p + "conv2", p + "bn2", y, width, 3, stride, 1)
        y = _conv_bn(g, hp, p + "conv3", p + "bn3", y, out_ch, 1, 1, 0, relu=False,
                     gamma=hp["residual_gamma"])
        shortcut = x
        if stride != 1 or in_ch != out_ch:
            shortcut = _conv_bn(g, hp, p + "downsample.0", p + "downsample.1", x, out_ch, 1,
                                stride, 0, relu=False)
        x = g.add(p + "relu", "relu", g.add(p + "add", "add", [y, shortcut]))
        in_ch = out_ch
    return x, in_ch


def num_anchors(hp):
    return len(hp["anchor_sizes"]) * len(hp["anchor_ratios"])


def roi_samples(hp):
    return hp["roi_size"] ** 2 * hp["roi_sampling_ratio"] ** 2


# The graph values the targets step and inference read, and the inputs the step writes.
RPN_LOGITS, RPN_DELTAS = "rpn.head.cls_logits", "rpn.head.bbox_pred"
CLASS_LOGITS, BOX_DELTAS = "roi_heads.box_predictor.cls_score", "roi_heads.box_predictor.bbox_pred"
WRITTEN = ("rpn_labels", "rpn_label_weights", "rpn_box_targets", "rpn_box_weights",
           "roi_indices", "roi_weights", "roi_labels", "roi_box_targets", "roi_box_weights")
GT_INPUTS = ("image_hw", "gt_boxes", "gt_labels", "gt_count")


def _batch(hp, batch_size, seed):
    """Synthetic images of coloured rectangles (tbdzoo/datasets/detection_batch.py), one to
    ``max_boxes`` objects each, on the config's canvas."""
    b = synthetic_detection_batch(seed, batch_size, hp["canvas"], hp["num_classes"] - 1,
                                  hp["max_boxes"])
    return OrderedDict((k, b[k]) for k in ("images",) + GT_INPUTS)


def check_batch(hp, batch):
    """A detection batch the model can take, by example and box: a valid size within the
    canvas, a box count within the slots (and at least one box unless allow_empty_images),
    boxes with a positive width and height inside their image, labels in 1 .. num_classes - 1
    (0 is the background). Raises BatchError naming the input and example."""
    canvas_h, canvas_w = hp["canvas"]
    if "image_hw" in batch:
        image_hw = np.asarray(batch["image_hw"])
        bad = (image_hw < 1) | (image_hw > np.array([canvas_h, canvas_w]))
        if bad.any():
            i = int(np.argwhere(bad)[0][0])
            h, w = (int(v) for v in image_hw[i])
            raise BatchError(
                "batch['image_hw'][{}] = ({}, {}) is outside the {} x {} canvas: an image's "
                "valid region must lie on the canvas (pad the image, do not crop it)".format(
                    i, h, w, canvas_h, canvas_w), input="image_hw", position=(i,),
                value=(h, w), allowed=((1, canvas_h), (1, canvas_w)))
    if "gt_count" not in batch:
        return
    counts = np.asarray(batch["gt_count"]).reshape(-1)
    for i, count in enumerate(counts):
        count = int(count)
        if not 0 <= count <= hp["max_boxes"]:
            raise BatchError("batch['gt_count'][{}]: example {}: gt_count {} is outside [0, {}] "
                             "(max_boxes)".format(i, i, count, hp["max_boxes"]),
                             input="gt_count", position=(i,), value=count,
                             allowed=(0, hp["max_boxes"]))
        if count == 0 and not hp["allow_empty_images"]:
            raise BatchError(
                "batch['gt_count'][{}]: example {}: an image without boxes (gt_count 0); "
                "training needs at least one object per image, as mx-rcnn's filter_roidb: drop "
                "the image or build with allow_empty_images=True".format(i, i),
                input="gt_count", position=(i,), value=0, allowed=(1, hp["max_boxes"]))
        hw = batch["image_hw"][i] if "image_hw" in batch else hp["canvas"]
        for name, check in (
                ("gt_boxes", functools.partial(check_boxes, np.asarray(batch["gt_boxes"][i])[:count],
                                               "example {} gt_boxes".format(i),
                                               image_hw=hw, positive=True)),
                ("gt_labels", functools.partial(check_labels, np.asarray(batch["gt_labels"][i])[:count],
                                                "example {} gt_labels".format(i),
                                                hp["num_classes"], count))):
            try:
                check()
            except DetectionInputError as e:
                raise BatchError("batch[{!r}][{}]: {}".format(name, i, e), input=name,
                                 position=(i,), allowed="boxes inside the image with a positive "
                                 "size" if name == "gt_boxes" else
                                 (1, hp["num_classes"])) from e


def detect(model, batch):
    """Inference (``model.predict``): per image, the RPN's proposals (test_pre_nms ->
    test_post_nms), the head on them, torchvision's post-processing. Returns {"boxes" (N, D, 4),
    "scores" (N, D), "labels" (N, D) int32, "counts" (N,) int32}, D = detections_per_image,
    each image's detections best first and zero past its count."""
    hp = model.hparams
    model._check_batch(batch, ["images", "image_hw"])
    images, image_hw = np.asarray(batch["images"]), np.asarray(batch["image_hw"])
    values = model.values({"images": images}, [RPN_LOGITS, RPN_DELTAS])
    grid = _anchors(model.spec, hp)
    rows = hp["rois_per_image"]
    chunks, placed = [], []
    for i in range(len(images)):
        boxes, _ = proposals(*_rpn_per_anchor(values, i, hp), anchors=grid, valid_hw=image_hw[i],
                             pre_nms=hp["test_pre_nms"], post_nms=hp["test_post_nms"],
                             threshold=hp["rpn_nms"], min_size=hp["rpn_min_size"])
        placed.append((len(chunks), boxes))
        for start in range(0, len(boxes), rows):
            part = boxes[start:start + rows]
            chunks.append((i, np.concatenate([part, np.repeat(part[-1:], rows - len(part), 0)])))
    head = {}
    if chunks:
        points = [roi_align_points(rois, feature_hw(model.spec),
                                   1.0 / hp["feature_stride"], hp["roi_size"],
                                   hp["roi_sampling_ratio"], hp["roi_aligned"])
                  for _, rois in chunks]
        head = model.values({"images": images[[i for i, _ in chunks]],
                             "roi_indices": np.stack([p[0] for p in points]),
                             "roi_weights": np.stack([p[1] for p in points])},
                            [CLASS_LOGITS, BOX_DELTAS])
    most = hp["detections_per_image"]
    out = OrderedDict([("boxes", np.zeros((len(images), most, 4), np.float32)),
                       ("scores", np.zeros((len(images), most), np.float32)),
                       ("labels", np.zeros((len(images), most), np.int32)),
                       ("counts", np.zeros(len(images), np.int32))])
    for i, (first, boxes) in enumerate(placed):
        if not len(boxes):
            continue
        rows_of = slice(first * rows, first * rows + len(boxes))
        found = detections(head[CLASS_LOGITS][rows_of], head[BOX_DELTAS][rows_of], boxes,
                           image_hw[i], score_threshold=hp["score_threshold"],
                           nms_threshold=hp["detection_nms"], max_detections=most)
        count = len(found[0])
        out["boxes"][i, :count], out["scores"][i, :count] = found[0], found[1]
        out["labels"][i, :count], out["counts"][i] = found[2], count
    return out


# -- the rest of the card (tbdzoo/models/card.py) -------------------------------------------
# The proxy: the tiny config (one bottleneck a stage) 16 channels wide on a 160-pixel canvas,
# which holds voc-composed's 96 x 128 images unresized (the task's resize is the paper's 600 /
# 1,000 scaled to the canvas), anchors of 48 and 64 for its 48- to 67-pixel garments (at most
# 2 an image), the 10 garment classes and the background, 32 RoIs an image; SGD with momentum
# at tiny's lr 1e-2, ten times the paper's 1e-3 (the backbone learns from scratch, not from
# ImageNet's weights). train_examples: voc-composed's 750 trainval images, so the step
# schedule's x0.1 at epoch 7 of 10 (step 2,625) keeps its meaning. Its task draws batches for
# one process: no data-parallel training to a target.
TRAINING = Training(metrics=(metrics.MAP,), target="map=0.1", eval_every=250,
                    task="tbdzoo.training.detection_task:DetectionTask", base_config="tiny",
                    proxy={"canvas": (160, 160), "max_boxes": 2, "num_classes": 11, "width": 16,
                           "anchor_sizes": (48, 64), "rpn_batch": 64, "train_pre_nms": 600,
                           "train_post_nms": 128, "test_pre_nms": 600, "test_post_nms": 32,
                           "rois_per_image": 32, "detections_per_image": 20, "batch_size": 2,
                           "train_examples": 750})
# On a CPU the suite runs one image a step, and a smaller batch is not enough: the paper step
# is 1.7 TFLOP (a 1,000 x 1,000 canvas, 128 RoIs through layer4); a 600 x 600 canvas and 32
# RoIs make it 0.55 TFLOP, the same network and program. The record names the override.
BENCHMARK = Benchmark(cpu_batch_size=1,
                      cpu_overrides={"canvas": (600, 600), "rois_per_image": 32})
# The targets step runs once, on the reference, and every backend trains on its targets.
CONSISTENCY = Consistency(replays_targets=True)
MEASURED = Measured(parameters=52094294, flops_per_example=566597782912)


@register_model("faster_rcnn", domain="object detection",
                configs={"paper": PAPER, "tiny": TINY}, unit="images/s",
                items=lambda hp, batch: len(batch["images"]), synthetic_batch=_batch,
                rules=RULES, checks=_checks(), check_batch=check_batch, inference=detect,
                inference_inputs=("images", "image_hw"),
                training=TRAINING, benchmark=BENCHMARK, consistency=CONSISTENCY, measured=MEASURED)
def build(hp):
    g = Graph("faster_rcnn")
    for scope, kind in (("", "FasterRCNN"), ("rpn", "RegionProposalNetwork"),
                        ("rpn.head", "RPNHead"), ("roi_heads", "RoIHeads"),
                        ("roi_heads.box_predictor", "FastRCNNPredictor")):
        g.block(scope, kind)
    height, width = hp["canvas"]
    x = g.input("images", (3, height, width))
    g.input("image_hw", (2,), dtype="int32")
    g.input("gt_boxes", (hp["max_boxes"], 4), role="target")
    g.input("gt_labels", (hp["max_boxes"],), dtype="int32", role="target")
    g.input("gt_count", (), dtype="int32", role="target")

    # backbone: conv1 .. layer3, stride 16
    x = _conv_bn(g, hp, "backbone.conv1", "backbone.bn1", x, hp["width"], 7, 2, 3)
    x = g.add("backbone.maxpool", "maxpool2d", x, kernel=3, stride=2, padding=1)
    channels = hp["width"]
    for stage in range(3):
        x, channels = _stage(g, hp, "backbone.", x, channels, stage, hp["blocks"][stage])
    features = x
    _, fh, fw = g.shape_of(features)

    # RPN: [T] RPNHead, N(0, 0.01) weights and zero biases ([M] the same)
    a = num_anchors(hp)
    rpn = g.add("rpn.head.conv.0.0", "conv2d", features, filters=channels, kernel=3, padding=1,
                use_bias=True, weight_init=("normal", 0.01))
    rpn = g.add("rpn.head.conv.0.1", "relu", rpn)
    logits = g.add(RPN_LOGITS, "conv2d", rpn, filters=a, kernel=1, use_bias=True,
                   weight_init=("normal", 0.01))
    deltas = g.add(RPN_DELTAS, "conv2d", rpn, filters=4 * a, kernel=1, use_bias=True,
                   weight_init=("normal", 0.01))

    # box head: RoIAlign, the RoIs folded into the batch, layer4, average pooling
    r, s = hp["rois_per_image"], roi_samples(hp)
    indices = g.input("roi_indices", (r, s, 4), dtype="int32", role="target")
    weights = g.input("roi_weights", (r, s, 4), role="target")
    y = g.add("roi_heads.box_roi_pool", "roi_align", [features, indices, weights],
              output_size=hp["roi_size"], sampling_ratio=hp["roi_sampling_ratio"])
    y = g.add("roi_heads.rois", "to_batch", y)
    y, channels = _stage(g, hp, "roi_heads.box_head.", y, channels, 3, hp["blocks"][3])
    y = g.add("roi_heads.box_head.avgpool", "global_avgpool", y)
    k = hp["num_classes"]
    # [M] cls_score N(0, 0.01), bbox_pred N(0, 0.001), zero biases
    cls = g.add(CLASS_LOGITS, "dense", y, units=k, init=("normal", 0.01))
    box = g.add(BOX_DELTAS, "dense", y, units=4 * k, init=("normal", 0.001))
    g.set_output(cls)

    rpn_labels = g.input("rpn_labels", (a, fh, fw), role="target")
    rpn_label_weights = g.input("rpn_label_weights", (a, fh, fw), role="target")
    rpn_targets = g.input("rpn_box_targets", (4 * a, fh, fw), role="target")
    rpn_weights = g.input("rpn_box_weights", (4 * a, fh, fw), role="target")
    roi_labels = g.add("targets.roi_labels", "to_batch",
                       g.input("roi_labels", (r,), dtype="int32", role="target"))
    roi_targets = g.add("targets.roi_box_targets", "to_batch",
                        g.input("roi_box_targets", (r, 4 * k), role="target"))
    roi_weights = g.add("targets.roi_box_weights", "to_batch",
                        g.input("roi_box_weights", (r, 4 * k), role="target"))

    p = Program()
    p.loss("rpn_objectness", "sigmoid_cross_entropy", logits=logits, labels=rpn_labels,
           weight=rpn_label_weights)
    p.loss("rpn_box", "smooth_l1", prediction=deltas, target=rpn_targets, weight=rpn_weights,
           sigma=hp["rpn_sigma"], normalizer=float(hp["rpn_batch"]))
    p.loss("head_class", "softmax_cross_entropy", logits=cls, labels=roi_labels,
           ignore_index=-1)
    p.loss("head_box", "smooth_l1", prediction=box, target=roi_targets, weight=roi_weights,
           sigma=hp["head_sigma"])
    p.objective("total", [("rpn_objectness", 1.0), ("rpn_box", 1.0), ("head_class", 1.0),
                          ("head_box", 1.0)])
    p.group("all", "*", optimizer_of(hp), schedule_of(hp), clip_of(hp))
    p.phase("train", "total", "all")
    p.targets("sample", "faster_rcnn.targets", reads=[logits, deltas], writes=list(WRITTEN),
              inputs=list(GT_INPUTS))
    g.set_program(p.check(g))
    return g


# -- the targets step ----------------------------------------------------------------------
def feature_hw(graph):
    """(height, width) of the backbone's stride-16 map: what the RPN's outputs cover."""
    return tuple(graph.shape_of(RPN_LOGITS)[1:])


def _anchors(graph, hp):
    fh, fw = feature_hw(graph)
    return _grid(fh, fw, hp)


def _grid(fh, fw, hp):
    """The anchors over an fh x fw map, made once per layout: every step reads the same grid."""
    stride = hp["feature_stride"]
    return _cached_grid(int(fh), int(fw), tuple(stride) if np.ndim(stride) else stride,
                        tuple(hp["anchor_sizes"]), tuple(hp["anchor_ratios"]))


@functools.lru_cache(maxsize=8)
def _cached_grid(fh, fw, stride, sizes, ratios):
    grid = anchor_grid.anchors(fh, fw, stride, sizes, ratios)
    grid.setflags(write=False)  # shared by every caller
    return grid


def _rpn_per_anchor(values, i, hp):
    """Image ``i``'s objectness (H*W*A,) and deltas (H*W*A, 4) in the anchors' order: the
    RPN's (A, H, W) and (A*4, H, W) outputs, position-major (docs/detection.md)."""
    logits = np.asarray(values[RPN_LOGITS][i])
    a, fh, fw = logits.shape
    deltas = np.asarray(values[RPN_DELTAS][i]).reshape(a, 4, fh, fw)
    return logits.transpose(1, 2, 0).reshape(-1), deltas.transpose(2, 3, 0, 1).reshape(-1, 4)


def _as_maps(per_anchor, a, fh, fw):
    """(H*W*A, k) in the anchors' order -> (A*k, H, W), the layout of the RPN's outputs."""
    k = per_anchor.shape[1]
    return per_anchor.reshape(fh, fw, a, k).transpose(2, 3, 0, 1).reshape(a * k, fh, fw)


def rpn_targets(grid, gt_boxes, image_hw, feature_hw, rng, hp):
    """One image's RPN targets as the RPN's maps: labels (1 object, 0 background), label
    weights (1 on the sampled anchors), box targets and box weights."""
    labels, targets, weights = anchor_targets(
        grid, gt_boxes, image_hw, rng, batch_size=hp["rpn_batch"],
        positive_fraction=hp["rpn_positive_fraction"], positive_iou=hp["rpn_positive_iou"],
        negative_iou=hp["rpn_negative_iou"], allowed_border=hp["allowed_border"])
    a = len(grid) // (feature_hw[0] * feature_hw[1])
    maps = [(labels == 1)[:, None], (labels >= 0)[:, None], targets, weights]
    return [_as_maps(m.astype(np.float32), a, feature_hw[0], feature_hw[1]) for m in maps]


def roi_targets(objectness, deltas, grid, gt_boxes, gt_labels, image_hw, feature_hw, rng, hp):
    """One image's head inputs: training proposals, the sampled RoIs with their labels and
    class-specific targets, and RoIAlign's gather points for them."""
    boxes, _ = proposals(objectness, deltas, grid, image_hw, pre_nms=hp["train_pre_nms"],
                         post_nms=hp["train_post_nms"], threshold=hp["rpn_nms"],
                         min_size=hp["rpn_min_size"])
    rois, labels, targets, weights = sample_rois(
        boxes, gt_boxes, gt_labels, rng, num_classes=hp["num_classes"],
        batch_size=hp["rois_per_image"], fg_fraction=hp["fg_fraction"], fg_iou=hp["fg_iou"],
        bg_iou=(hp["bg_iou_low"], hp["fg_iou"]), valid_hw=image_hw)
    indices, taps = roi_align_points(rois, feature_hw, 1.0 / hp["feature_stride"], hp["roi_size"],
                                     hp["roi_sampling_ratio"], hp["roi_aligned"])
    return indices, taps, labels, targets, weights


@register_targets("faster_rcnn.targets")
def targets(values, inputs, hparams, rng):
    """The program's targets step: per image, the RPN's targets and the head's RoIs, each
    sampler drawing from its own stream (``rng.stream('anchor_targets' | 'sample_rois',
    image)``, docs/detection.md). The RPN's targets read only the inputs, so every image's are
    made before the first read of the RPN's outputs (on a GPU, while it still computes them)."""
    hp = hparams
    n, _a, fh, fw = value_shape(values, RPN_LOGITS)
    grid = _grid(fh, fw, hp)
    images = []
    for i in range(n):
        count = int(inputs["gt_count"][i])
        images.append((np.asarray(inputs["gt_boxes"][i])[:count],
                       np.asarray(inputs["gt_labels"][i])[:count],
                       check_image_hw(inputs["image_hw"][i], "example {} image_hw".format(i))))
    rpn = [rpn_targets(grid, gt, hw, (fh, fw), rng.stream("anchor_targets", i), hp)
           for i, (gt, _, hw) in enumerate(images)]
    out = OrderedDict((name, []) for name in WRITTEN)
    for i, (gt, classes, hw) in enumerate(images):
        objectness, deltas = _rpn_per_anchor(values, i, hp)
        head = roi_targets(objectness, deltas, grid, gt, classes, hw, (fh, fw),
                           rng.stream("sample_rois", i), hp)
        for name, value in zip(WRITTEN, list(rpn[i]) + list(head)):
            out[name].append(value)
    return OrderedDict((name, stack_written(v)) for name, v in out.items())
