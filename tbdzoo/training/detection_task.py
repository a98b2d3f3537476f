"""Object detection (Faster R-CNN) on a Pascal VOC 2007 folder (voc-composed from `tbd data
make`, or VOC itself): training on ``trainval``, scoring on ``test``.

- **Batches** are tbdzoo.datasets.detection_batch's (``iterate_batches``, the reader's own):
  each image resized by the paper's rule scaled to the config's canvas (short side 0.6 of the
  canvas unless the long side would pass the whole canvas: 600 and 1,000 on the paper's
  1,000-pixel canvas), flipped at random, normalised and padded; each epoch an order and flips
  drawn from (seed, epoch), so every backend trains on the same NumPy arrays. As Faster
  R-CNN's training does, objects marked difficult are left out and images left without
  objects are skipped (counted in the record). Images are decoded once and kept.
- **``map``** is PASCAL VOC2007's mAP (11-point AP at IoU 0.5, difficult objects neither hit
  nor miss; tbdzoo/models/faster_rcnn/detection/evaluation.py) of ``model.predict``'s detections on the test
  images, mapped back to the original pixels and compared with the annotations as written.

The class names are voc-composed's garments when the folder's manifest says voc-composed,
VOC's 20 classes otherwise."""
import os
import warnings

import numpy as np

from ..datasets.detection_batch import iterate_batches, scale_boxes
from ..datasets.errors import DatasetError
from ..datasets.make_images import CLASS_TOKENS
from ..datasets.makers import read_manifest
from ..datasets.voc import CLASSES, VOCDetection
from ..models.faster_rcnn.detection.evaluation import mean_average_precision
from .errors import TrainingError
from .image_task import dataset_name

__all__ = ["DetectionTask", "LAYOUT", "open_sets", "class_names", "resize_sides"]

LAYOUT = ("VOC 2007 layout: DIR/VOC2007/Annotations/<id>.xml, DIR/VOC2007/JPEGImages/<id>.jpg "
          "and DIR/VOC2007/ImageSets/Main/trainval.txt and test.txt")
TRAIN_SET, HELD_OUT_SET = "trainval", "test"
MODEL_INPUTS = ("images", "image_hw", "gt_boxes", "gt_labels", "gt_count")
EVAL_BATCH = 16
PAPER_SHORT_FRACTION = 0.6   # 600 of the paper's 1,000-pixel canvas
# The command that writes the proxy's data in this layout.
DATA_COMMAND = ("tbd data make voc-composed --out DIR --set images=1000 "
                "--set long_side=128 --set min_side=48 --set max_objects=2")


def class_names(data_dir):
    """voc-composed's garment tokens when its manifest names it, else VOC's 20 classes."""
    try:
        name = read_manifest(data_dir).get("name")
    except (DatasetError, AttributeError):
        name = None
    if name == "voc-composed":
        return tuple(CLASS_TOKENS)
    return CLASSES


def _fail(data_dir, problem):
    return TrainingError("{}: not a data set Faster R-CNN trains from ({}); expected {}; make one "
                         "with: {}".format(data_dir, problem, LAYOUT, DATA_COMMAND))


def open_sets(data_dir):
    """(trainval, test) VOCDetections; a folder that is not VOC's layout fails naming the
    problem and the `tbd data make` command."""
    if data_dir is None or not os.path.isdir(data_dir):
        raise _fail(data_dir, "no such folder")
    names = class_names(data_dir)
    try:
        with warnings.catch_warnings():      # the skipped images are counted in the record
            warnings.simplefilter("ignore", UserWarning)
            train = VOCDetection(data_dir, TRAIN_SET, keep_difficult=False, empty="skip",
                                 class_names=names)
        test = VOCDetection(data_dir, HELD_OUT_SET, keep_difficult=True, empty="keep",
                            class_names=names)
    except DatasetError as e:
        raise _fail(data_dir, e) from e
    if not len(train) or not len(test):
        raise _fail(data_dir, "{} images to train on and {} to test".format(len(train),
                                                                             len(test)))
    return train, test


def resize_sides(canvas):
    """(short_side, max_long_side): the paper's 600 and 1,000 as fractions of its 1,000-pixel
    canvas, so any image, landscape or portrait, fits the config's canvas."""
    side = min(canvas)
    return int(round(PAPER_SHORT_FRACTION * side)), side


class _Decoded:
    """A VOCDetection whose images are decoded once: a proxy's epochs are many and short."""

    def __init__(self, data):
        self.data, self._samples = data, [data[i] for i in range(len(data))]

    def __len__(self):
        return len(self._samples)

    def __getitem__(self, index):
        return self._samples[index]

    def name_of(self, index):
        return self.data.name_of(index)


class DetectionTask:
    metric_names = ("map",)

    layout, data_command = LAYOUT, DATA_COMMAND   # what a missing --data is told

    @staticmethod
    def check_data(data_dir):
        """Open the folder's image sets, so that a wrong layout fails before a model is built."""
        open_sets(data_dir)

    def __init__(self, model, data_dir, seed=0, workers=0, rank=0, world_size=1):
        if world_size > 1:
            raise TrainingError("faster_rcnn has no data-parallel training task yet: drop "
                                "--nproc")
        hp = self.hp = model.hparams
        self.model, self.seed = model, seed
        train, test = open_sets(data_dir)
        self.classes = len(train.class_names) + 1
        if self.classes > hp["num_classes"]:
            raise TrainingError("{}: {} classes and the background, but the model has "
                                "num_classes={}; set --set num_classes={}".format(
                                    data_dir, self.classes - 1, hp["num_classes"], self.classes))
        short_side, long_side = resize_sides(hp["canvas"])
        self.options = dict(canvas=hp["canvas"], max_boxes=hp["max_boxes"],
                            short_side=short_side, max_long_side=long_side,
                            num_classes=self.classes - 1, require_boxes=True)
        self.train = _Decoded(train)
        self.test = test
        self._truth = [(a.boxes, a.labels, a.difficult)
                       for a in (test.annotation(i) for i in range(len(test)))]
        self.pipeline = ("VOC reader, NumPy batches (tbdzoo.datasets.detection_batch), short "
                         "side {}, long side at most {}, random flips".format(short_side,
                                                                              long_side))
        self.dataset = dataset_name(data_dir)
        self.examples = {"train": len(train), "train_skipped_without_objects": len(train.skipped),
                         "test": len(test)}
        self._held_out = None

    def batches(self):
        """Training batches without end: epoch e in the order and flips of (seed, e), the last
        short batch dropped; only the inputs the model takes."""
        epoch = 0
        while True:
            for batch in iterate_batches(self.train, self.hp["batch_size"],
                                         seed=[self.seed, epoch], drop_last=True,
                                         **self.options):
                yield dict((k, batch[k]) for k in MODEL_INPUTS)
            epoch += 1

    def close(self):
        pass

    def held_out(self):
        """The test images as batches, in order, unflipped, with difficult objects kept."""
        if self._held_out is None:
            options = dict(self.options, require_boxes=False)
            self._held_out = list(iterate_batches(self.test, EVAL_BATCH, shuffle=False,
                                                  flip=False, **options))
        return self._held_out

    def detections(self):
        """Per test image (boxes, scores, labels) of ``model.predict``, in the image's own
        pixels (the resize undone, clipped to the image)."""
        out = []
        for batch in self.held_out():
            found = self.model.predict({"images": batch["images"], "image_hw": batch["image_hw"]})
            for i in range(len(batch["images"])):
                n = int(found["counts"][i])
                height, width = (int(v) for v in batch["original_hw"][i])
                boxes = scale_boxes(np.asarray(found["boxes"][i][:n]), batch["image_hw"][i],
                                    (height, width))
                boxes[:, 0::2] = np.clip(boxes[:, 0::2], 0, width)
                boxes[:, 1::2] = np.clip(boxes[:, 1::2], 0, height)
                out.append((boxes, np.asarray(found["scores"][i][:n]),
                            np.asarray(found["labels"][i][:n])))
        return out

    def evaluate(self, metrics=None):
        """{"map": VOC07 mAP of the test images' detections}; ``metrics`` changes nothing."""
        return {"map": mean_average_precision(self.detections(), self._truth,
                                              num_classes=self.hp["num_classes"])}
