"""Inception-v3 (Szegedy et al. 2016, "Rethinking the Inception Architecture").

Parameter for parameter the architecture of torchvision's ``inception_v3`` with its auxiliary
head (27,161,264 trainable parameters at 1,000 classes; ``aux_head=False`` drops the head and
its loss, 23,834,568, the architecture of Keras' and Gluon's models), under torchvision's names
(``Mixed_5b.branch5x5_2.conv.weight``), so a reader can map them at a glance. Each convolution
is followed by BatchNorm (eps 1e-3, no bias before it) and ReLU.

Every value below has its source next to it: [P] the paper (arXiv 1512.00567, sections 7-8),
[TV] torchvision's model, [S] TF-slim's ``inception_v3_arg_scope``.
"""
from ...datasets import synthetic
from ...spec import Graph
from ...spec.program import Program, optimizer_of, schedule_of
from .. import metrics
from ..card import Benchmark, Consistency, ImageInput, Measured, Training
from ..constraints import boolean, integer, number
from ..registry import register_model

IMAGENET_TRAIN_IMAGES = 1281167

PAPER = {
    "image_size": 299,              # [P] 299 x 299 receptive field
    "num_classes": 1000,
    "width_divisor": 1,             # every channel count divided by this (1: the paper's widths)
    "bn_eps": 1e-3,                 # [TV][S]
    "bn_momentum": 0.1,             # [TV] PyTorch's default: new-batch weight 0.1
    "dropout": 0.5,                 # [TV] before the classifier (TF-slim keeps 0.8, i.e. 0.2)
    # The auxiliary classifier on the 17 x 17 grid and its loss [P][TV]. False drops both, the
    # architecture of keras.applications.InceptionV3 and the Gluon model zoo's inception_v3.
    "aux_head": True,
    "aux_weight": 0.4,              # [S] auxiliary loss weight
    "label_smoothing": 0.1,         # [P] section 7
    # Average pools inside the blocks are 3 x 3, stride 1, pad 1. Frameworks disagree on whether
    # the pad cells count in the mean (PyTorch and MXNet: yes; TF 'same' and CNTK: no); this is
    # torchvision's rule, stated so that every backend follows it.
    "pool_count_include_pad": True,
    "batch_size": 32,               # [P] section 8: 50 replicas x batch 32
    "optimizer": "rmsprop",         # [P] RMSProp, decay 0.9, epsilon 1.0
    "lr": 0.045, "alpha": 0.9, "eps": 1.0, "momentum": 0.9, "centered": False,
    "weight_decay": 4e-5,           # [S] not stated in [P]
    "grad_clip_norm": 2.0,          # [P] section 8: "gradient clipping with threshold 2.0"
    "lr_schedule": "exponential",   # [P] x0.94 every two epochs (staircase)
    "lr_decay": 0.94, "decay_epochs": 2,
    "train_examples": IMAGENET_TRAIN_IMAGES,   # steps_per_epoch = ceil(train_examples / batch)
}

# The auxiliary head needs the 17 x 17 grid, which only a 299-pixel input gives, so the tiny
# config keeps the input and every layer and divides each channel count by 16 instead.
TINY = dict(PAPER, width_divisor=16, num_classes=10, batch_size=2, train_examples=200)

# The grid sizes one side of the input takes, layer after layer: (name, kernel, stride) of each
# unpadded convolution or pool that shrinks it (the padded ones keep it). The blocks' branches
# shrink alike, so one chain stands for each block.
_STEM = (("Conv2d_1a_3x3", 3, 2), ("Conv2d_2a_3x3", 3, 1), ("maxpool1", 3, 2),
         ("Conv2d_4a_3x3", 3, 1), ("maxpool2", 3, 2), ("Mixed_6a", 3, 2))
_TOP = (("Mixed_7a", 3, 2),)
_AUX = (("AuxLogits.pool", 5, 3), ("AuxLogits.conv1", 5, 1))


def _shrink(size, layers):
    """The grid after each of ``layers`` as [(name, size)]; a size below 1 means it cannot run."""
    grids = []
    for name, kernel, stride in layers:
        size = (size - kernel) // stride + 1 if size >= kernel else 0
        grids.append((name, size))
    return grids


def grid_sizes(image_size, aux_head=False):
    """{layer: output grid side} along the main path (and the auxiliary head's, if asked)."""
    main = _shrink(image_size, _STEM)
    grids = main + _shrink(main[-1][1], _TOP)
    if aux_head:
        grids += _shrink(main[-1][1], _AUX)
    return dict(grids)


def smallest_image_size(aux_head):
    """The smallest input side whose every grid keeps at least one cell (grids grow with it)."""
    size = 1
    while min(grid_sizes(size, aux_head).values()) < 1:
        size += 1
    return size


MIN_IMAGE_SIZE = smallest_image_size(aux_head=False)      # 75: Mixed_7a leaves a 1 x 1 grid
MIN_AUX_IMAGE_SIZE = smallest_image_size(aux_head=True)   # 299: the 17 x 17 grid the head needs

RULES = {
    "image_size": integer(MIN_IMAGE_SIZE), "num_classes": integer(2), "width_divisor": integer(1),
    "bn_eps": number(0.0, open_low=True), "bn_momentum": number(0.0, 1.0),
    "aux_head": boolean(), "aux_weight": number(0.0), "pool_count_include_pad": boolean(),
}


def _aux_head_fits(hp):
    """The auxiliary head's 5 x 5 pool (stride 3) and 5 x 5 convolution need Mixed_6e's grid at
    17 x 17 or more; below MIN_AUX_IMAGE_SIZE only the model without the head can be built."""
    if hp["aux_head"] and hp["image_size"] < MIN_AUX_IMAGE_SIZE:
        return ("image_size {} is too small for the auxiliary head, whose 5 x 5 pool (stride 3) "
                "and 5 x 5 convolution need Mixed_6e's 17 x 17 grid: the smallest input with "
                "the head is {}; set aux_head=false (inputs down to {}) or image_size >= {}"
                .format(hp["image_size"], MIN_AUX_IMAGE_SIZE, MIN_IMAGE_SIZE, MIN_AUX_IMAGE_SIZE))
    return None


def _batch(hp, batch_size, seed):
    return synthetic.image_classification(batch_size, 3, hp["image_size"], hp["num_classes"], seed)


class _Builder:
    def __init__(self, g, hp):
        self.g, self.hp = g, hp

    def conv(self, name, x, filters, kernel, stride=1, padding=0):
        """torchvision's BasicConv2d: convolution without bias, BatchNorm, ReLU."""
        g = self.g
        g.block(name, "BasicConv2d")
        filters = max(1, filters // self.hp["width_divisor"])
        if isinstance(padding, tuple) and all(isinstance(p, int) for p in padding):
            padding = ((padding[0], padding[0]), (padding[1], padding[1]))
        x = g.add(name + ".conv", "conv2d", x, filters=filters, kernel=kernel, stride=stride,
                  padding=padding)
        x = g.add(name + ".bn", "batchnorm", x, eps=self.hp["bn_eps"], momentum=self.hp["bn_momentum"])
        return g.add(name + ".relu", "relu", x)

    def avgpool(self, name, x):
        return self.g.add(name, "avgpool2d", x, kernel=3, stride=1, padding=1,
                          count_include_pad=self.hp["pool_count_include_pad"])

    def cat(self, name, branches):
        return self.g.add(name, "concat", branches, axis=0)

    def block_a(self, p, x, pool_features):
        b1 = self.conv(p + "branch1x1", x, 64, 1)
        b5 = self.conv(p + "branch5x5_1", x, 48, 1)
        b5 = self.conv(p + "branch5x5_2", b5, 64, 5, padding=2)
        b3 = self.conv(p + "branch3x3dbl_1", x, 64, 1)
        b3 = self.conv(p + "branch3x3dbl_2", b3, 96, 3, padding=1)
        b3 = self.conv(p + "branch3x3dbl_3", b3, 96, 3, padding=1)
        bp = self.conv(p + "branch_pool", self.avgpool(p + "pool", x), pool_features, 1)
        return self.cat(p + "concat", [b1, b5, b3, bp])

    def block_b(self, p, x):
        b3 = self.conv(p + "branch3x3", x, 384, 3, stride=2)
        bd = self.conv(p + "branch3x3dbl_1", x, 64, 1)
        bd = self.conv(p + "branch3x3dbl_2", bd, 96, 3, padding=1)
        bd = self.conv(p + "branch3x3dbl_3", bd, 96, 3, stride=2)
        bp = self.g.add(p + "pool", "maxpool2d", x, kernel=3, stride=2)
        return self.cat(p + "concat", [b3, bd, bp])

    def block_c(self, p, x, c7):
        b1 = self.conv(p + "branch1x1", x, 192, 1)
        b7 = self.conv(p + "branch7x7_1", x, c7, 1)
        b7 = self.conv(p + "branch7x7_2", b7, c7, (1, 7), padding=(0, 3))
        b7 = self.conv(p + "branch7x7_3", b7, 192, (7, 1), padding=(3, 0))
        bd = self.conv(p + "branch7x7dbl_1", x, c7, 1)
        bd = self.conv(p + "branch7x7dbl_2", bd, c7, (7, 1), padding=(3, 0))
        bd = self.conv(p + "branch7x7dbl_3", bd, c7, (1, 7), padding=(0, 3))
        bd = self.conv(p + "branch7x7dbl_4", bd, c7, (7, 1), padding=(3, 0))
        bd = self.conv(p + "branch7x7dbl_5", bd, 192, (1, 7), padding=(0, 3))
        bp = self.conv(p + "branch_pool", self.avgpool(p + "pool", x), 192, 1)
        return self.cat(p + "concat", [b1, b7, bd, bp])

    def block_d(self, p, x):
        b3 = self.conv(p + "branch3x3_1", x, 192, 1)
        b3 = self.conv(p + "branch3x3_2", b3, 320, 3, stride=2)
        b7 = self.conv(p + "branch7x7x3_1", x, 192, 1)
        b7 = self.conv(p + "branch7x7x3_2", b7, 192, (1, 7), padding=(0, 3))
        b7 = self.conv(p + "branch7x7x3_3", b7, 192, (7, 1), padding=(3, 0))
        b7 = self.conv(p + "branch7x7x3_4", b7, 192, 3, stride=2)
        bp = self.g.add(p + "pool", "maxpool2d", x, kernel=3, stride=2)
        return self.cat(p + "concat", [b3, b7, bp])

    def block_e(self, p, x):
        b1 = self.conv(p + "branch1x1", x, 320, 1)
        b3 = self.conv(p + "branch3x3_1", x, 384, 1)
        b3 = self.cat(p + "branch3x3_cat", [
            self.conv(p + "branch3x3_2a", b3, 384, (1, 3), padding=(0, 1)),
            self.conv(p + "branch3x3_2b", b3, 384, (3, 1), padding=(1, 0))])
        bd = self.conv(p + "branch3x3dbl_1", x, 448, 1)
        bd = self.conv(p + "branch3x3dbl_2", bd, 384, 3, padding=1)
        bd = self.cat(p + "branch3x3dbl_cat", [
            self.conv(p + "branch3x3dbl_3a", bd, 384, (1, 3), padding=(0, 1)),
            self.conv(p + "branch3x3dbl_3b", bd, 384, (3, 1), padding=(1, 0))])
        bp = self.conv(p + "branch_pool", self.avgpool(p + "pool", x), 192, 1)
        return self.cat(p + "concat", [b1, b3, bd, bp])

    def aux(self, p, x):
        """The auxiliary classifier on the 17 x 17 grid (training only: its loss is weighted)."""
        g = self.g
        x = g.add(p + "pool", "avgpool2d", x, kernel=5, stride=3)
        x = self.conv(p + "conv0", x, 128, 1)
        x = self.conv(p + "conv1", x, 768, 5)
        x = g.add(p + "avgpool", "global_avgpool", x)
        return g.add(p + "fc", "dense", x, units=self.hp["num_classes"])


# -- the rest of the card (tbdzoo/models/card.py) -------------------------------------------
# The proxy: every layer of the paper at 75 pixels, the smallest input without the auxiliary
# head (which needs 299: docs/models/inception_v3.md), each channel count divided by 16; RMSProp as in the
# paper.
TRAINING = Training(metrics=(metrics.TOP1,), target="top1=0.5", eval_every=20,
                    task="tbdzoo.training.image_task:ImageClassificationTask", data_parallel="image",
                    proxy={"image_size": 75, "num_classes": 10, "width_divisor": 16,
                           "aux_head": False, "batch_size": 16, "train_examples": 2000})
# A batch that keeps a full-size training step to seconds on a small CPU.
BENCHMARK = Benchmark(cpu_batch_size=4)
# The consistency case (docs/consistency.md, "Inception-v3 tiny is ill-conditioned"): the
# auxiliary loss, RMSProp and gradient clipping, without dropout. 94 BatchNorm + ReLU layers
# hold 1.1 million ReLU inputs spread around zero, and float32 rounding carries some across
# zero, so:
# - lr 0.0045, not the config's 0.045: at 0.045 PyTorch in float32 lands 7e-3 from PyTorch in
#   float64 at the third step, which no float32 implementation can be held to;
# - its loss, in float32 on every backend, is 1e-6 to 5.4e-6 relative from PyTorch in float64
#   (seeds 0-2; PyTorch itself 1.3e-6): 94 normalisations each scale their input's rounding by
#   1 / std. rtol 1.5e-5 holds that and still catches a backend 2e-5 off;
# - a gradient may miss the element-wise tolerance by float32 noise (PyTorch against itself,
#   weights perturbed by 1e-6, misses it on most tensors), never the direction: every
#   gradient keeps a cosine above 0.9995 (CNTK's lowest);
# - so a gradient projected on a direction is off by that noise too: TensorFlow and CNTK
#   miss the reference's central difference by 1e-2 relative (4e-3 of 0.29, ||g|| 212 on the
#   first slice), 2e-5 of ||g||, where a wrong gradient is off by about ||g|| / sqrt(size).
# TensorFlow runs eager: tracing and optimising each gradient and update graph costs more than
# the whole eager protocol.
CONSISTENCY = Consistency(
    overrides={"dropout": 0.0, "lr": 0.0045},
    tolerances={"loss": {"rtol": 1.5e-5, "atol": 1e-7},
                "gradients": {"elementwise": False, "atol_of_global": 1e-6, "min_cosine": 0.9995},
                "directions": {"rtol": 1e-3, "atol_of_norm": 1e-4}},
    backend_overrides={"tensorflow": {"execution": "eager"}})
# Inputs in [-1, 1], as Keras' and TF-slim's Inception-v3 preprocess them.
IMAGE = ImageInput(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
MEASURED = Measured(parameters=27161264, flops_per_example=11507671168)


@register_model("inception_v3", domain="image classification", configs={"paper": PAPER, "tiny": TINY},
                unit="images/s", items=lambda hp, batch: len(batch["labels"]), synthetic_batch=_batch,
                rules=RULES, checks=(_aux_head_fits,),
                training=TRAINING, benchmark=BENCHMARK, consistency=CONSISTENCY, image=IMAGE, measured=MEASURED)
def build(hp):
    g = Graph("inception_v3")
    g.block("", "Inception3")
    for scope, kind in (("Mixed_5b", "InceptionA"), ("Mixed_5c", "InceptionA"),
                        ("Mixed_5d", "InceptionA"), ("Mixed_6a", "InceptionB"),
                        ("Mixed_6b", "InceptionC"), ("Mixed_6c", "InceptionC"),
                        ("Mixed_6d", "InceptionC"), ("Mixed_6e", "InceptionC"),
                        ("Mixed_7a", "InceptionD"), ("Mixed_7b", "InceptionE"),
                        ("Mixed_7c", "InceptionE")) + (
                            (("AuxLogits", "InceptionAux"),) if hp["aux_head"] else ()):
        g.block(scope, kind)
    size = hp["image_size"]
    x = g.input("images", (3, size, size))
    g.input("labels", (), dtype="int32", role="target")
    b = _Builder(g, hp)
    x = b.conv("Conv2d_1a_3x3", x, 32, 3, stride=2)
    x = b.conv("Conv2d_2a_3x3", x, 32, 3)
    x = b.conv("Conv2d_2b_3x3", x, 64, 3, padding=1)
    x = g.add("maxpool1", "maxpool2d", x, kernel=3, stride=2)
    x = b.conv("Conv2d_3b_1x1", x, 80, 1)
    x = b.conv("Conv2d_4a_3x3", x, 192, 3)
    x = g.add("maxpool2", "maxpool2d", x, kernel=3, stride=2)
    x = b.block_a("Mixed_5b.", x, 32)
    x = b.block_a("Mixed_5c.", x, 64)
    x = b.block_a("Mixed_5d.", x, 64)
    x = b.block_b("Mixed_6a.", x)
    for name, c7 in (("Mixed_6b.", 128), ("Mixed_6c.", 160), ("Mixed_6d.", 160), ("Mixed_6e.", 192)):
        x = b.block_c(name, x, c7)
    aux = b.aux("AuxLogits.", x) if hp["aux_head"] else None
    x = b.block_d("Mixed_7a.", x)
    x = b.block_e("Mixed_7b.", x)
    x = b.block_e("Mixed_7c.", x)
    x = g.add("avgpool", "global_avgpool", x)
    x = g.add("dropout", "dropout", x, rate=hp["dropout"])
    logits = g.add("fc", "dense", x, units=hp["num_classes"])
    g.set_output(logits)

    p = Program()
    smoothing = {"label_smoothing": hp["label_smoothing"], "ignore_index": None}
    p.loss("main", "softmax_cross_entropy", logits=logits, labels="labels", **smoothing)
    terms = [("main", 1.0)]
    if aux is not None:
        p.loss("aux", "softmax_cross_entropy", logits=aux, labels="labels", **smoothing)
        terms.append(("aux", hp["aux_weight"]))
    p.objective("total", terms)
    p.group("all", "*", optimizer_of(hp), schedule_of(hp),
            clip={"kind": "global_norm", "value": hp["grad_clip_norm"]} if hp["grad_clip_norm"] else None)
    p.phase("train", "total", "all")
    g.set_program(p)
    return g
