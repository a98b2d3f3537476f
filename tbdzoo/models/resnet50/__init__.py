"""ResNet-50 v1.5 (He et al. 2016; the stride sits on the 3x3 convolution, as in torchvision).

Parameter names follow torchvision's (``layer1.0.conv1.weight``), so a reader can map them at
a glance. ``stride_in_1x1=True`` gives the original v1 (as in Keras and the Gluon model zoo).
"""
from ...datasets import synthetic
from ...spec import Graph
from .. import metrics
from ..card import Benchmark, Consistency, ImageInput, Measured, Training
from ..constraints import boolean, integer, integers, number
from ..registry import register_model

IMAGENET_TRAIN_IMAGES = 1281167

PAPER = {
    "image_size": 224, "num_classes": 1000, "blocks": (3, 4, 6, 3), "width": 64,
    "stride_in_1x1": False, "bn_momentum": 0.1, "bn_eps": 1e-5, "zero_init_residual": False,
    "batch_size": 32,
    "optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": False, "weight_decay": 1e-4,
    "lr_schedule": "step", "lr_decay": 0.1, "lr_milestones": (30, 60, 80),
    "train_examples": IMAGENET_TRAIN_IMAGES,    # steps_per_epoch = ceil(train_examples / batch_size)
    "label_smoothing": 0.0,
}

# 64 pixels, not 32: at 32 the last stage is 1x1, its BatchNorm sees 4 values per channel, and
# three SGD steps amplify a 1e-7 weight perturbation into a 3e-2 loss difference (PyTorch vs
# itself), so no two backends could agree on the consistency trajectory. At 64 it is ~4e-6.
TINY = dict(PAPER, image_size=64, num_classes=10, blocks=(1, 1, 1, 1), width=8, batch_size=4,
            train_examples=400)

# The rules of ResNet's own hyperparameters; the shared ones are in constraints.COMMON.
RULES = {
    "image_size": integer(1), "num_classes": integer(2), "blocks": integers(1), "width": integer(1),
    "stride_in_1x1": boolean(), "bn_momentum": number(0.0, 1.0), "bn_eps": number(0.0, open_low=True),
    "zero_init_residual": boolean(),
}


def _batch(hp, batch_size, seed):
    return synthetic.image_classification(batch_size, 3, hp["image_size"], hp["num_classes"], seed)


# -- the rest of the card (tbdzoo/models/card.py) -------------------------------------------
# The proxy: one bottleneck block a stage, 8 channels wide, 32 pixels, ten classes; SGD with
# momentum at the paper's lr 0.1. train_examples sets steps_per_epoch from the data set's size,
# so the step schedule's milestones (epochs 30, 60, 80) stay far beyond the target.
TRAINING = Training(metrics=(metrics.TOP1,), target="top1=0.65", eval_every=20,
                    task="tbdzoo.training.image_task:ImageClassificationTask", data_parallel="image",
                    proxy={"image_size": 32, "num_classes": 10, "blocks": (1, 1, 1, 1),
                           "width": 8, "batch_size": 32, "train_examples": 2000})
# A batch that keeps a full-size training step to seconds on a small CPU.
BENCHMARK = Benchmark(cpu_batch_size=8)
CONSISTENCY = Consistency()
# The ImageNet statistics torchvision's and Keras' ResNets use.
IMAGE = ImageInput(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
MEASURED = Measured(parameters=25557032, flops_per_example=8239859200)


@register_model("resnet50", domain="image classification", configs={"paper": PAPER, "tiny": TINY},
                unit="images/s", items=lambda hp, batch: len(batch["labels"]), synthetic_batch=_batch,
                rules=RULES,
                training=TRAINING, benchmark=BENCHMARK, consistency=CONSISTENCY, image=IMAGE, measured=MEASURED)
def build(hp):
    g = Graph("resnet50")
    g.block("", "ResNet")
    size = hp["image_size"]
    x = g.input("images", (3, size, size))
    g.input("labels", (), dtype="int32", role="target")

    def conv_bn(name, x, filters, kernel, stride, pad, bn_name, relu=True, gamma=1.0):
        x = g.add(name, "conv2d", x, filters=filters, kernel=kernel, stride=stride, padding=pad)
        x = g.add(bn_name, "batchnorm", x, eps=hp["bn_eps"], momentum=hp["bn_momentum"],
                  gamma_init=gamma)
        return g.add(bn_name + ".relu", "relu", x) if relu else x

    x = conv_bn("conv1", x, hp["width"], 7, 2, 3, "bn1")
    x = g.add("maxpool", "maxpool2d", x, kernel=3, stride=2, padding=1)

    in_ch = hp["width"]
    for stage, count in enumerate(hp["blocks"]):
        width = hp["width"] * 2 ** stage
        out_ch = width * 4
        for i in range(count):
            stride = 2 if (i == 0 and stage > 0) else 1
            s1, s3 = (stride, 1) if hp["stride_in_1x1"] else (1, stride)
            p = g.block("layer{}.{}".format(stage + 1, i), "Bottleneck") + "."
            shortcut = x
            y = conv_bn(p + "conv1", x, width, 1, s1, 0, p + "bn1")
            y = conv_bn(p + "conv2", y, width, 3, s3, 1, p + "bn2")
            y = conv_bn(p + "conv3", y, out_ch, 1, 1, 0, p + "bn3", relu=False,
                        gamma=0.0 if hp["zero_init_residual"] else 1.0)
            if stride != 1 or in_ch != out_ch:
                shortcut = conv_bn(p + "downsample.0", x, out_ch, 1, stride, 0,
                                   p + "downsample.1", relu=False)
            x = g.add(p + "add", "add", [y, shortcut])
            x = g.add(p + "relu", "relu", x)
            in_ch = out_ch

    x = g.add("avgpool", "global_avgpool", x)
    x = g.add("fc", "dense", x, units=hp["num_classes"])
    g.set_output(x)
    g.set_loss("softmax_cross_entropy", logits=x, labels="labels",
               label_smoothing=hp["label_smoothing"], ignore_index=None)
    return g
