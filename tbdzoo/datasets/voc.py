"""Pascal VOC 2007 detection: a reader of the real layout and a writer of small copies of it.

The layout (``VOCdevkit/VOC2007``; either that folder or its parent may be given)::

    Annotations/<id>.xml          one per image: size, and per object name, difficult, bndbox
    JPEGImages/<id>.jpg
    ImageSets/Main/<set>.txt      one image id a line: train, val, trainval, test

VOC's boxes are 1-based, inclusive pixel coordinates (xmin = 1 is the first column, xmax the
last column covered). tbdzoo's are 0-based with exclusive x2, y2: the reader returns
(xmin - 1, ymin - 1, xmax, ymax), the writer stores the inverse, so the box's width is
xmax - xmin + 1 in VOC's terms and x2 - x1 in tbdzoo's; flipping and scaling need no "+1".

XML is parsed with the standard library's ElementTree: VOC annotations are local files the
user downloaded, not untrusted network input (ElementTree does not defend against crafted
entity-expansion documents; defusedxml would be the choice for those). Images are read and
written with Pillow, imported only when an image is, so this module also imports where Pillow
is absent. Every problem is an error naming the file; nothing is skipped unless asked, and
what is skipped is counted.
"""
import collections
import os
import warnings
import xml.etree.ElementTree as ElementTree

import numpy as np

from .detection_batch import (
    CANVAS,
    MAX_BOXES,
    MAX_LONG_SIDE,
    SHORT_SIDE,
    check_detection_batch,
    iterate_batches,
    make_batch,
    synthetic_detection_batch,
    synthetic_image,
)
from .errors import DatasetError

__all__ = ["CLASSES", "MAIN_SETS", "VOCDetection", "VOCSample", "VOCAnnotation", "write_voc",
           "annotation_xml", "parse_annotation", "read_image_set", "find_voc_folder",
           # the batches, re-exported from detection_batch
           "CANVAS", "MAX_BOXES", "SHORT_SIDE", "MAX_LONG_SIDE", "make_batch", "iterate_batches",
           "synthetic_image", "synthetic_detection_batch", "check_detection_batch"]

CLASSES = ("aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
           "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa",
           "train", "tvmonitor")   # VOC's order; label = index + 1, 0 is background
MAIN_SETS = ("train", "val", "trainval", "test")
FOLDER = "VOC2007"
EMPTY_POLICIES = ("error", "skip", "keep")

VOCSample = collections.namedtuple("VOCSample", "image boxes labels difficult")
VOCAnnotation = collections.namedtuple("VOCAnnotation",
                                       "image_id height width boxes labels difficult")


def _pillow():
    try:
        from PIL import Image
    except ImportError:
        raise DatasetError("reading and writing VOC's JPEG images needs Pillow: install it "
                           "(pip install Pillow) in this environment") from None
    return Image


def find_voc_folder(root):
    """The VOC2007 folder: ``root`` itself or ``root/VOC2007``."""
    for folder in (root, os.path.join(root, FOLDER)):
        if os.path.isdir(os.path.join(folder, "Annotations")):
            return folder
    raise DatasetError(
        "{}: no Annotations/ here or in {}/; give the VOC2007 folder (holding Annotations/, "
        "JPEGImages/ and ImageSets/Main/) or its parent, VOCdevkit".format(root, FOLDER))


def read_image_set(folder, image_set):
    """The image ids listed in ImageSets/Main/<image_set>.txt, in order."""
    path = os.path.join(folder, "ImageSets", "Main", image_set + ".txt")
    if not os.path.isfile(path):
        main = os.path.join(folder, "ImageSets", "Main")
        known = sorted(f[:-4] for f in os.listdir(main) if f.endswith(".txt")) \
            if os.path.isdir(main) else []
        raise DatasetError("{}: no such image set file; image sets here: {}".format(
            path, ", ".join(known) or "(none)"))
    ids = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 1:
                raise DatasetError(
                    "{}, line {}: {!r} is not one image id (a per-class list holds 'id flag'); "
                    "give a main set: {}".format(path, number, line.strip(), ", ".join(MAIN_SETS)))
            ids.append(fields[0])
    if len(set(ids)) != len(ids):
        twice = sorted(i for i, n in collections.Counter(ids).items() if n > 1)
        raise DatasetError("{}: image ids listed twice: {}".format(path, ", ".join(twice[:5])))
    return ids


def _text(node, tag, path, where):
    child = node.find(tag)
    if child is None or child.text is None or not child.text.strip():
        raise DatasetError("{}: {} has no <{}>".format(path, where, tag))
    return child.text.strip()


def _number(node, tag, path, where):
    text = _text(node, tag, path, where)
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not np.isfinite(value):
        raise DatasetError("{}: {} <{}> is {!r}, not a finite number".format(
            path, where, tag, text))
    return value


def parse_annotation(path, class_names=CLASSES):
    """One VOC XML file as a VOCAnnotation: boxes float32 (K, 4) in tbdzoo's 0-based
    coordinates, labels int64 1..len(class_names), difficult bool; errors name the file."""
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError as e:
        raise DatasetError("{}: malformed XML: {}".format(path, e)) from e
    except OSError as e:
        raise DatasetError("{}: cannot read the annotation: {}".format(path, e)) from e
    if root.tag != "annotation":
        raise DatasetError("{}: the root element is <{}>, VOC's is <annotation>".format(
            path, root.tag))
    size = root.find("size")
    if size is None:
        raise DatasetError("{}: <annotation> has no <size>".format(path))
    width = int(_number(size, "width", path, "<size>"))
    height = int(_number(size, "height", path, "<size>"))
    if width < 1 or height < 1:
        raise DatasetError("{}: <size> is {} x {}, not an image".format(path, width, height))
    boxes, labels, difficult = [], [], []
    for k, obj in enumerate(root.findall("object")):
        where = "<object> {}".format(k + 1)
        name = _text(obj, "name", path, where)
        if name not in class_names:
            raise DatasetError("{}: {} has unknown class {!r}; {} classes are {}".format(
                path, where, name, "VOC's" if tuple(class_names) == CLASSES else "the",
                ", ".join(class_names)))
        flag = obj.find("difficult")
        hard = flag is not None and flag.text is not None and flag.text.strip() not in ("", "0")
        box = obj.find("bndbox")
        if box is None:
            raise DatasetError("{}: {} ({}) has no <bndbox>".format(path, where, name))
        xmin, ymin, xmax, ymax = (_number(box, t, path, where + " <bndbox>")
                                  for t in ("xmin", "ymin", "xmax", "ymax"))
        x1, y1, x2, y2 = xmin - 1, ymin - 1, xmax, ymax
        if x2 <= x1 or y2 <= y1:
            raise DatasetError(
                "{}: {} ({}) has xmin={:g} xmax={:g} ymin={:g} ymax={:g}: an empty box (VOC's "
                "coordinates are inclusive, so xmax >= xmin)".format(
                    path, where, name, xmin, xmax, ymin, ymax))
        if x1 < 0 or y1 < 0 or x2 > width or y2 > height:
            raise DatasetError(
                "{}: {} ({}) box xmin={:g} ymin={:g} xmax={:g} ymax={:g} lies outside the {} x {} "
                "image (VOC's pixels run from 1 to the width and height)".format(
                    path, where, name, xmin, ymin, xmax, ymax, width, height))
        boxes.append((x1, y1, x2, y2))
        labels.append(class_names.index(name) + 1)
        difficult.append(hard)
    image_id = os.path.splitext(os.path.basename(path))[0]
    return VOCAnnotation(image_id, height, width, np.array(boxes, np.float32).reshape(-1, 4),
                         np.array(labels, np.int64), np.array(difficult, bool))


class VOCDetection:
    """The images of one image set of VOC 2007 with their objects.

    ``dataset[i]`` is a VOCSample (image (H, W, 3) uint8 RGB, boxes float32 (K, 4) as
    (x1, y1, x2, y2) = (xmin - 1, ymin - 1, xmax, ymax) of VOC's 1-based inclusive pixels,
    labels int64 1..20, difficult bool (K,)). Every annotation is parsed and checked when the
    dataset is made, so errors come at once, each naming its file.

    ``keep_difficult=False`` leaves out objects marked difficult (as Faster R-CNN's training
    does); VOC's evaluation keeps them, and ignores detections matched to them. ``empty`` says
    what to do with an image left without objects: "error" (the default), "skip" (leave it
    out: ``skipped`` lists the ids and a warning gives the count) or "keep" (K = 0).
    ``class_names`` are the names a label indexes (label = position + 1); VOC's 20 by default.
    """

    def __init__(self, root, image_set="trainval", keep_difficult=True, empty="error",
                 class_names=CLASSES):
        if empty not in EMPTY_POLICIES:
            raise DatasetError("empty={!r}: give one of {}".format(empty,
                                                                  ", ".join(EMPTY_POLICIES)))
        self.folder = find_voc_folder(root)
        self.image_set = image_set
        self.keep_difficult = keep_difficult
        self.class_names = tuple(class_names)
        self.ids, self.skipped, self._annotations = [], [], []
        for image_id in read_image_set(self.folder, image_set):
            for path in (self.annotation_path(image_id), self.image_path(image_id)):
                if not os.path.isfile(path):
                    raise DatasetError("{}: missing, but ImageSets/Main/{}.txt lists {}".format(
                        path, image_set, image_id))
            note = parse_annotation(self.annotation_path(image_id), self.class_names)
            if not keep_difficult:
                easy = ~note.difficult
                note = note._replace(boxes=note.boxes[easy], labels=note.labels[easy],
                                     difficult=note.difficult[easy])
            if len(note.labels) == 0 and empty != "keep":
                if empty == "error":
                    raise DatasetError(
                        "{}: no objects{}; pass empty='skip' to leave such images out or "
                        "empty='keep' to keep them".format(
                            self.annotation_path(image_id),
                            "" if keep_difficult else " once difficult ones are left out"))
                self.skipped.append(image_id)
                continue
            self.ids.append(image_id)
            self._annotations.append(note._replace(image_id=image_id))
        if self.skipped:
            warnings.warn("VOCDetection({!r}): skipped {} of {} images without objects (first: "
                          "{}); their ids are in .skipped".format(
                              image_set, len(self.skipped), len(self.skipped) + len(self.ids),
                              ", ".join(self.skipped[:3])), stacklevel=2)

    def annotation_path(self, image_id):
        return os.path.join(self.folder, "Annotations", image_id + ".xml")

    def image_path(self, image_id):
        return os.path.join(self.folder, "JPEGImages", image_id + ".jpg")

    def __len__(self):
        return len(self.ids)

    def name_of(self, index):
        """The image file of example ``index``, to name it in errors."""
        return self.image_path(self.ids[index])

    def annotation(self, index):
        """Example ``index``'s VOCAnnotation, without reading its image."""
        return self._annotations[index]

    def load_image(self, index):
        """Example ``index``'s image, (H, W, 3) uint8 RGB, checked against its annotation."""
        note = self._annotations[index]
        path = self.image_path(note.image_id)
        image_module = _pillow()
        try:
            with image_module.open(path) as im:
                pixels = np.asarray(im.convert("RGB"), dtype=np.uint8)
        except (OSError, ValueError) as e:
            raise DatasetError("{}: cannot read the image: {}".format(path, e)) from e
        if pixels.shape[:2] != (note.height, note.width):
            raise DatasetError("{}: the image is {} x {} (height x width) but {} says {} x {}"
                               .format(path, pixels.shape[0], pixels.shape[1],
                                       self.annotation_path(note.image_id), note.height,
                                       note.width))
        return pixels

    def __getitem__(self, index):
        if not -len(self) <= index < len(self):
            raise IndexError("index {} out of range for {} images".format(index, len(self)))
        index = index % len(self)
        note = self._annotations[index]
        return VOCSample(self.load_image(index), note.boxes.copy(), note.labels.copy(),
                         note.difficult.copy())

    def batches(self, batch_size, seed=0, **options):
        """One epoch of batch dicts: ``iterate_batches`` (tbdzoo/datasets/detection_batch.py)
        over this dataset, class ids checked against VOC's 20 classes."""
        options.setdefault("num_classes", len(CLASSES))
        return iterate_batches(self, batch_size, seed=seed, **options)


def _voc_box(box, image_id):
    """tbdzoo's (x1, y1, x2, y2) as VOC's whole-pixel (xmin, ymin, xmax, ymax)."""
    voc = (box[0] + 1, box[1] + 1, box[2], box[3])
    rounded = [int(round(float(v))) for v in voc]
    if any(abs(float(v) - r) > 1e-4 for v, r in zip(voc, rounded)):
        raise DatasetError("image {}: box {} is not on whole pixels; VOC stores integers: round "
                           "the box first".format(image_id, [float(v) for v in box]))
    return rounded


def _add(parent, tag, text=None):
    node = ElementTree.SubElement(parent, tag)
    if text is not None:
        node.text = str(text)
    return node


def _indent(node, depth=0):
    """Tabs and newlines between elements, as VOC's own files have them (ElementTree.indent
    needs Python 3.9)."""
    children = list(node)
    if not children:
        return
    node.text = "\n" + "\t" * (depth + 1)
    for child in children:
        _indent(child, depth + 1)
        child.tail = "\n" + "\t" * (depth + 1)
    children[-1].tail = "\n" + "\t" * depth


def annotation_xml(image_id, height, width, boxes, labels, difficult=None, class_names=CLASSES):
    """VOC's XML for one image (``<size>``, and per object ``<name>``, ``<difficult>``,
    ``<bndbox>``), from boxes in tbdzoo's coordinates and labels 1..len(class_names)."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    labels = np.asarray(labels).reshape(-1)
    difficult = np.zeros(len(labels), bool) if difficult is None else np.asarray(difficult, bool)
    if not len(boxes) == len(labels) == len(difficult):
        raise DatasetError("image {}: {} boxes, {} labels, {} difficult flags: give one each per "
                           "object".format(image_id, len(boxes), len(labels), len(difficult)))
    root = ElementTree.Element("annotation")
    _add(root, "folder", FOLDER)
    _add(root, "filename", image_id + ".jpg")
    size = _add(root, "size")
    _add(size, "width", width)
    _add(size, "height", height)
    _add(size, "depth", 3)
    _add(root, "segmented", 0)
    for box, label, hard in zip(boxes, labels, difficult):
        if not 1 <= int(label) <= len(class_names):
            raise DatasetError("image {}: label {} is not in 1..{}".format(
                image_id, int(label), len(class_names)))
        obj = _add(root, "object")
        _add(obj, "name", class_names[int(label) - 1])
        _add(obj, "pose", "Unspecified")
        _add(obj, "truncated", 0)
        _add(obj, "difficult", int(bool(hard)))
        bndbox = _add(obj, "bndbox")
        for tag, value in zip(("xmin", "ymin", "xmax", "ymax"), _voc_box(box, image_id)):
            _add(bndbox, tag, value)
    _indent(root)
    return ElementTree.tostring(root, encoding="unicode")


def write_voc(root, images, annotations, image_sets, quality=95, class_names=CLASSES):
    """Write a VOC 2007 layout under ``root``/VOC2007 and return that folder.

    ``images`` maps image id to (H, W, 3) uint8 RGB (stored as JPEG with Pillow at
    ``quality``); ``annotations`` maps image id to a dict of ``boxes`` (K, 4) in tbdzoo's
    coordinates (whole pixels), ``labels`` (K,) 1..20 and optionally ``difficult`` (K,);
    ``image_sets`` maps a set name (train, val, trainval, test) to its image ids;
    ``class_names`` are the names labels index (VOC's 20 by default).
    """
    image_module = _pillow()
    unannotated = sorted(set(images) - set(annotations))
    if unannotated:
        raise DatasetError("images without annotations: {}; give each image a (possibly empty) "
                           "annotation".format(", ".join(unannotated[:5])))
    for name, ids in image_sets.items():
        unknown = sorted(set(ids) - set(images))
        if unknown:
            raise DatasetError("image set {}: ids without an image: {}".format(
                name, ", ".join(unknown[:5])))
    xmls = {}
    for image_id, pixels in images.items():
        pixels = np.asarray(pixels)
        if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
            raise DatasetError("image {}: must be (height, width, 3) uint8 RGB, got {} {}".format(
                image_id, pixels.shape, pixels.dtype))
        note = annotations[image_id]
        xmls[image_id] = annotation_xml(image_id, pixels.shape[0], pixels.shape[1],
                                        note["boxes"], note["labels"], note.get("difficult"),
                                        class_names)
    folder = os.path.join(root, FOLDER)
    for sub in ("Annotations", "JPEGImages", os.path.join("ImageSets", "Main")):
        os.makedirs(os.path.join(folder, sub), exist_ok=True)
    for image_id, pixels in images.items():
        image_module.fromarray(np.asarray(pixels)).save(
            os.path.join(folder, "JPEGImages", image_id + ".jpg"), quality=quality)
        with open(os.path.join(folder, "Annotations", image_id + ".xml"), "w") as f:
            f.write(xmls[image_id] + "\n")
    for name, ids in image_sets.items():
        with open(os.path.join(folder, "ImageSets", "Main", name + ".txt"), "w") as f:
            f.write("".join(i + "\n" for i in ids))
    return folder
