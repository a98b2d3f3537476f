"""Pascal VOC 2007 on disk and Faster R-CNN's batches: the writer and reader agree, VOC's
coordinates become tbdzoo's, the transforms move boxes with the pixels, padding is zero and
counted, every broken file is refused by name, and synthetic batches are valid."""
import os
import re
import xml.etree.ElementTree as ElementTree

import numpy as np
import pytest

from conftest import require_backend, run_in_env
from tbdzoo.datasets import (
    DatasetError,
    VOCDetection,
    check_detection_batch,
    iterate_batches,
    synthetic_detection_batch,
    voc,
    write_voc,
)
from tbdzoo.datasets import detection_batch as db


def smooth_image(height, width, phase=0.0):
    """Red runs left to right, green top to bottom, blue waves: smooth enough for JPEG to keep
    within a few levels, and a flip, a transpose or a channel swap would show."""
    y, x = np.mgrid[0:height, 0:width]
    blue = 128 + 100 * np.sin(x / 9.0 + phase) * np.cos(y / 13.0)
    return np.stack([255.0 * x / (width - 1), 255.0 * y / (height - 1), blue], -1).astype(np.uint8)


ANNOTATIONS = {
    "000001": {"boxes": [[47, 239, 195, 371], [7, 11, 352, 500]], "labels": [12, 15],
               "difficult": [False, False]},
    "000002": {"boxes": [[138, 198, 207, 301]], "labels": [19], "difficult": [False]},
    "000003": {"boxes": [[0, 0, 1, 1], [10, 20, 200, 120]], "labels": [1, 20],
               "difficult": [True, False]},
    "000004": {"boxes": [[5, 5, 60, 90]], "labels": [5], "difficult": [True]},
}
SIZES = {"000001": (500, 353), "000002": (335, 500), "000003": (240, 320), "000004": (100, 80)}
SETS = {"train": ["000001", "000003"], "val": ["000002"],
        "trainval": ["000001", "000002", "000003"], "test": ["000004"]}


@pytest.fixture
def devkit(tmp_path):
    images = {i: smooth_image(*SIZES[i], phase=float(i)) for i in sorted(SIZES)}
    folder = write_voc(str(tmp_path / "VOCdevkit"), images, ANNOTATIONS, SETS)
    return folder, images


def rewrite(path, old, new):
    with open(path) as f:
        text = f.read()
    assert old in text
    with open(path, "w") as f:
        f.write(text.replace(old, new, 1))


# --- writer and reader ---------------------------------------------------------------------

def test_round_trip_gives_back_boxes_labels_difficult_and_pixels(devkit):
    folder, images = devkit
    assert folder.endswith(os.path.join("VOCdevkit", "VOC2007"))
    data = VOCDetection(folder, "trainval")
    assert data.ids == ["000001", "000002", "000003"] and len(data) == 3
    for i, image_id in enumerate(data.ids):
        image, boxes, labels, difficult = data[i]
        want = ANNOTATIONS[image_id]
        assert image.dtype == np.uint8 and image.shape == SIZES[image_id] + (3,)
        diff = np.abs(image.astype(int) - images[image_id].astype(int))
        assert diff.mean() < 1.5 and diff.max() <= 16
        assert boxes.dtype == np.float32 and labels.dtype == np.int64 and difficult.dtype == bool
        np.testing.assert_array_equal(boxes, np.array(want["boxes"], np.float32))
        np.testing.assert_array_equal(labels, want["labels"])
        np.testing.assert_array_equal(difficult, want["difficult"])
    assert data[-1][1].tolist() == data[2][1].tolist()
    with pytest.raises(IndexError):
        data[3]


def test_the_parent_of_voc2007_is_accepted(devkit):
    folder, _ = devkit
    assert VOCDetection(os.path.dirname(folder), "test").ids == ["000004"]


def test_written_xml_holds_voc_one_based_inclusive_coordinates(devkit):
    folder, _ = devkit
    root = ElementTree.parse(os.path.join(folder, "Annotations", "000001.xml")).getroot()
    assert root.find("size/width").text == "353" and root.find("size/height").text == "500"
    objects = root.findall("object")
    assert [o.find("name").text for o in objects] == ["dog", "person"]
    assert [o.find("difficult").text for o in objects] == ["0", "0"]
    box = objects[0].find("bndbox")
    assert [box.find(t).text for t in ("xmin", "ymin", "xmax", "ymax")] == ["48", "240", "195",
                                                                             "371"]


def test_a_voc_box_becomes_zero_based_with_exclusive_ends(devkit):
    folder, _ = devkit
    path = os.path.join(folder, "Annotations", "000002.xml")
    rewrite(path, "<xmin>139</xmin>", "<xmin>1</xmin>")   # the first column
    rewrite(path, "<xmax>207</xmax>", "<xmax>500</xmax>")  # the last column of 500
    note = voc.parse_annotation(path)
    assert note.boxes.tolist() == [[0.0, 198.0, 500.0, 301.0]]
    assert (note.height, note.width) == (335, 500)


def test_image_sets_are_read_in_order_and_a_missing_set_lists_the_others(devkit):
    folder, _ = devkit
    assert VOCDetection(folder, "train").ids == ["000001", "000003"]
    assert VOCDetection(folder, "val").ids == ["000002"]
    with pytest.raises(DatasetError, match=r"test2007\.txt: no such image set file; image sets "
                                           r"here: test, train, trainval, val"):
        VOCDetection(folder, "test2007")


def test_a_per_class_list_is_refused_with_the_main_sets_named(devkit):
    folder, _ = devkit
    with open(os.path.join(folder, "ImageSets", "Main", "dog_train.txt"), "w") as f:
        f.write("000001  1\n000003 -1\n")
    with pytest.raises(DatasetError, match=r"dog_train\.txt, line 1: .*train, val, trainval, test"):
        VOCDetection(folder, "dog_train")


def test_an_id_listed_twice_is_refused(devkit):
    folder, _ = devkit
    path = os.path.join(folder, "ImageSets", "Main", "val.txt")
    with open(path, "a") as f:
        f.write("000002\n")
    with pytest.raises(DatasetError, match=re.escape(path) + r": image ids listed twice: 000002"):
        VOCDetection(folder, "val")


def test_difficult_objects_can_be_left_out(devkit):
    folder, _ = devkit
    data = VOCDetection(folder, "train", keep_difficult=False)
    assert data[1].labels.tolist() == [20] and data[1].difficult.tolist() == [False]
    assert data.annotation(1).boxes.tolist() == [[10, 20, 200, 120]]


def test_an_image_left_without_objects_is_an_error_or_skipped_and_counted(devkit):
    folder, _ = devkit
    xml = os.path.join(folder, "Annotations", "000004.xml")
    with pytest.raises(DatasetError, match=re.escape(xml) + ": no objects once difficult"):
        VOCDetection(folder, "test", keep_difficult=False)
    with pytest.warns(UserWarning, match=r"skipped 1 of 1 images without objects"):
        skipping = VOCDetection(folder, "test", keep_difficult=False, empty="skip")
    assert len(skipping) == 0 and skipping.skipped == ["000004"]
    keeping = VOCDetection(folder, "test", keep_difficult=False, empty="keep")
    assert keeping[0].boxes.shape == (0, 4) and keeping.skipped == []


def test_person_parts_are_not_objects(devkit):
    """VOC's person layout nests <part> elements, each with its own name and bndbox."""
    folder, _ = devkit
    path = os.path.join(folder, "Annotations", "000001.xml")
    rewrite(path, "</bndbox>\n\t</object>\n</annotation>",
            "</bndbox><part><name>head</name><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>2</xmax>"
            "<ymax>2</ymax></bndbox></part></object></annotation>")
    assert voc.parse_annotation(path).labels.tolist() == [12, 15]


def test_synthetic_images_written_as_voc_give_valid_batches(tmp_path):
    images, annotations = {}, {}
    for k in range(3):
        image, boxes, labels = db.synthetic_image(k, 30 + 10 * k, 50, num_classes=20,
                                                  max_boxes=4)
        images["{:06d}".format(k)] = image
        annotations["{:06d}".format(k)] = {"boxes": boxes, "labels": labels}
    folder = write_voc(str(tmp_path), images, annotations, {"trainval": sorted(images)})
    data = VOCDetection(folder)
    for k, image_id in enumerate(data.ids):
        np.testing.assert_array_equal(data[k].boxes, annotations[image_id]["boxes"])
        assert not data[k].difficult.any()
    for batch in data.batches(2, canvas=64, max_boxes=4, short_side=32, max_long_side=64):
        check_detection_batch(batch, num_classes=20)


# --- every broken file is named ----------------------------------------------------------

def test_a_folder_without_the_layout_is_refused(tmp_path):
    with pytest.raises(DatasetError, match=r"no Annotations/ here or in VOC2007/"):
        VOCDetection(str(tmp_path))


def test_malformed_xml_is_named_with_the_reason(devkit):
    folder, _ = devkit
    path = os.path.join(folder, "Annotations", "000002.xml")
    rewrite(path, "</annotation>", "</annotatio>")
    with pytest.raises(DatasetError, match=re.escape(path) + ": malformed XML: mismatched tag"):
        VOCDetection(folder, "val")


def test_a_missing_field_is_named(devkit):
    folder, _ = devkit
    path = os.path.join(folder, "Annotations", "000002.xml")
    rewrite(path, "<ymax>301</ymax>", "")
    with pytest.raises(DatasetError, match=re.escape(path) + r": <object> 1 <bndbox> has no "
                                                             r"<ymax>"):
        VOCDetection(folder, "val")


@pytest.mark.parametrize("missing", ["JPEGImages/000002.jpg", "Annotations/000002.xml"])
def test_a_listed_image_that_is_missing_is_named(devkit, missing):
    folder, _ = devkit
    path = os.path.join(folder, *missing.split("/"))
    os.remove(path)
    with pytest.raises(DatasetError, match=re.escape(path) + r": missing, but ImageSets/Main/"
                                                             r"val\.txt lists 000002"):
        VOCDetection(folder, "val")


def test_an_unknown_class_is_named(devkit):
    folder, _ = devkit
    path = os.path.join(folder, "Annotations", "000002.xml")
    rewrite(path, "<name>train</name>", "<name>tram</name>")
    with pytest.raises(DatasetError, match=re.escape(path) + r": <object> 1 has unknown class "
                                                             r"'tram'; VOC's classes are aero"):
        VOCDetection(folder, "val")


@pytest.mark.parametrize("old, new", [("<xmax>207</xmax>", "<xmax>501</xmax>"),
                                      ("<ymin>199</ymin>", "<ymin>0</ymin>")])
def test_a_box_outside_the_image_is_named(devkit, old, new):
    folder, _ = devkit
    path = os.path.join(folder, "Annotations", "000002.xml")
    rewrite(path, old, new)
    with pytest.raises(DatasetError, match=re.escape(path) + r": <object> 1 \(train\) box .* "
                                                             r"outside the 500 x 335 image"):
        VOCDetection(folder, "val")


def test_an_empty_box_is_named(devkit):
    folder, _ = devkit
    path = os.path.join(folder, "Annotations", "000002.xml")
    rewrite(path, "<xmax>207</xmax>", "<xmax>138</xmax>")   # xmin is 139
    with pytest.raises(DatasetError, match=re.escape(path) + r": <object> 1 \(train\) has "
                                                             r"xmin=139 xmax=138 .*an empty box"):
        VOCDetection(folder, "val")


def test_an_image_of_another_size_than_its_annotation_is_named(devkit):
    folder, _ = devkit
    path = os.path.join(folder, "Annotations", "000002.xml")
    rewrite(path, "<height>335</height>", "<height>336</height>")
    data = VOCDetection(folder, "val")
    with pytest.raises(DatasetError, match=r"000002\.jpg: the image is 335 x 500 .* but .*"
                                           r"000002\.xml says 336 x 500"):
        data[0]


def test_the_writer_refuses_boxes_off_whole_pixels_and_unknown_labels(tmp_path):
    image = {"a": np.zeros((10, 10, 3), np.uint8)}
    with pytest.raises(DatasetError, match=r"image a: box .* not on whole pixels"):
        write_voc(str(tmp_path), image, {"a": {"boxes": [[0.5, 0, 4, 4]], "labels": [1]}}, {})
    with pytest.raises(DatasetError, match=r"image a: label 21 is not in 1\.\.20"):
        write_voc(str(tmp_path), image, {"a": {"boxes": [[0, 0, 4, 4]], "labels": [21]}}, {})
    assert not os.path.exists(str(tmp_path / "VOC2007"))


# --- transforms ---------------------------------------------------------------------------

@pytest.mark.parametrize("hw, resized", [((500, 353), (850, 600)), ((375, 500), (600, 800)),
                                         ((100, 200), (500, 1000)), ((300, 1000), (300, 1000)),
                                         ((600, 600), (600, 600))])
def test_resize_short_side_600_long_side_at_most_1000(hw, resized):
    assert db.resized_shape(*hw) == resized


def test_resize_scales_boxes_by_each_sides_ratio():
    boxes = np.array([[0, 0, 353, 500], [47, 239, 195, 371]], np.float32)
    scaled = db.scale_boxes(boxes, (500, 353), (850, 600))
    np.testing.assert_allclose(scaled[0], [0, 0, 600, 850])
    np.testing.assert_allclose(scaled[1], [47 * 600 / 353., 239 * 1.7, 195 * 600 / 353., 371 * 1.7],
                               rtol=1e-6)


def test_flip_mirrors_boxes_within_the_width():
    boxes = np.array([[0, 1, 3, 4], [7, 0, 10, 2]], np.float32)
    flipped = db.flip_boxes(boxes, 10)
    assert flipped.tolist() == [[7, 1, 10, 4], [0, 0, 3, 2]]
    assert db.flip_boxes(flipped, 10).tolist() == boxes.tolist()


def test_transformed_boxes_still_cover_their_pixels():
    """A white rectangle on black, resized x2 and flipped: the box moves with the pixels."""
    image = np.zeros((10, 20, 3), np.uint8)
    image[3:7, 2:8] = 255                          # box (2, 3, 8, 7)
    for flip, want in ((False, [4, 6, 16, 14]), (True, [24, 6, 36, 14])):
        pixels, boxes, size = db.transform(image, [[2, 3, 8, 7]], flip, short_side=20,
                                           max_long_side=40)
        assert size == (20, 40) and pixels.shape == (3, 20, 40)
        assert boxes.tolist() == [want]
        x1, y1, x2, y2 = want
        white = (1 - np.array(db.IMAGENET_MEAN)) / np.array(db.IMAGENET_STD)
        inner = pixels[:, y1 + 1:y2 - 1, x1 + 1:x2 - 1]   # bilinear blurs the edge pixel only
        np.testing.assert_allclose(inner, np.broadcast_to(white[:, None, None], inner.shape),
                                   rtol=1e-5)
        outside = np.ones((20, 40), bool)
        outside[y1 - 1:y2 + 1, x1 - 1:x2 + 1] = False
        black = -np.array(db.IMAGENET_MEAN) / np.array(db.IMAGENET_STD)
        np.testing.assert_allclose(pixels[:, outside], np.broadcast_to(
            black[:, None], (3, int(outside.sum()))), rtol=1e-5)


def test_normalise_uses_torchvisions_imagenet_statistics_in_chw():
    image = np.array([[[0, 128, 255]]], np.uint8)
    out = db.normalize(image)
    assert out.shape == (3, 1, 1) and out.dtype == np.float32
    want = (np.array([0, 128, 255]) / 255.0 - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
    np.testing.assert_allclose(out[:, 0, 0], want, rtol=1e-6)


def test_normalising_by_lookup_gives_the_bits_of_the_arithmetic():
    levels = np.repeat(np.arange(256, dtype=np.uint8)[None, :, None], 3, axis=2)  # (1, 256, 3)
    arithmetic = ((levels.astype(np.float32) / np.float32(255.0)
                   - np.array(db.IMAGENET_MEAN, np.float32))
                  / np.array(db.IMAGENET_STD, np.float32)).transpose(2, 0, 1)
    np.testing.assert_array_equal(db.normalize(levels), arithmetic)
    canvas = np.zeros((3, 2, 300), np.float32)
    db.normalize(levels, out=canvas[:, :1, :256], flip=True)
    np.testing.assert_array_equal(canvas[:, :1, :256], arithmetic[:, :, ::-1])
    assert not canvas[:, 1:].any() and not canvas[:, :, 256:].any()


# --- batches -------------------------------------------------------------------------------

def test_a_batch_pads_images_and_boxes_and_counts_them(devkit):
    folder, _ = devkit
    data = VOCDetection(folder, "trainval")
    batch = db.make_batch([data[0], data[2]], flips=[False, True], canvas=(120, 100),
                          max_boxes=3, short_side=60, max_long_side=100)
    check_detection_batch(batch, num_classes=20)
    assert batch["images"].shape == (2, 3, 120, 100)
    assert batch["image_hw"].tolist() == [[85, 60], [60, 80]]
    assert batch["original_hw"].tolist() == [[500, 353], [240, 320]]
    assert batch["flipped"].tolist() == [False, True]
    assert batch["gt_count"].tolist() == [2, 2]
    assert batch["gt_labels"].tolist() == [[12, 15, 0], [1, 20, 0]]
    assert batch["difficult"].tolist() == [[False, False, False], [True, False, False]]
    assert batch["gt_boxes"][1, 2].tolist() == [0, 0, 0, 0]
    np.testing.assert_allclose(batch["gt_boxes"][1, 1], [80 - 200 / 4., 5, 80 - 10 / 4., 30])
    assert not batch["images"][0, :, 85:].any() and not batch["images"][0, :, :, 60:].any()
    assert not batch["images"][1, :, 60:].any() and not batch["images"][1, :, :, 80:].any()
    assert batch["images"][1, :, :60, :80].std() > 0.5


def test_the_paper_defaults_fit_voc_sized_images_on_the_1000_canvas():
    landscape, portrait = smooth_image(375, 500), smooth_image(500, 375)
    box = np.array([[0, 0, 375, 375]], np.float32)
    batch = db.make_batch([(landscape, box, [1], [False]), (portrait, box, [2], [False])])
    check_detection_batch(batch, num_classes=20)
    assert batch["images"].shape == (2, 3, 1000, 1000) and batch["gt_boxes"].shape == (2, 64, 4)
    assert batch["image_hw"].tolist() == [[600, 800], [800, 600]]
    assert batch["gt_boxes"][:, 0].tolist() == [[0, 0, 600, 600], [0, 0, 600, 600]]


def test_too_many_boxes_or_a_small_canvas_is_refused_naming_the_image(devkit):
    folder, _ = devkit
    data = VOCDetection(folder, "train")
    with pytest.raises(DatasetError, match=r"000001\.jpg: 2 boxes but the batch holds "
                                           r"max_boxes=1; raise max_boxes"):
        next(iterate_batches(data, 2, shuffle=False, max_boxes=1, canvas=200, short_side=60,
                             max_long_side=100))
    with pytest.raises(DatasetError, match=r"000001\.jpg: the resized image is 85 x 60 but the "
                                           r"canvas is 64 x 64"):
        next(data.batches(2, shuffle=False, canvas=64, short_side=60, max_long_side=100))


def test_an_epoch_is_seeded_and_holds_every_image_once(devkit):
    folder, _ = devkit
    data = VOCDetection(folder, "trainval")
    options = dict(canvas=(100, 100), short_side=60, max_long_side=100)

    def epoch(seed):
        return list(data.batches(2, seed=seed, **options))

    first, again = epoch(3), epoch(3)
    assert [b["images"].shape[0] for b in first] == [2, 1]
    for a, b in zip(first, again):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    seen = sorted(tuple(hw) for b in first for hw in b["original_hw"].tolist())
    assert seen == sorted(SIZES[i] for i in data.ids)
    flips = [f for seed in range(8) for b in epoch(seed) for f in b["flipped"]]
    assert 0 < sum(flips) < len(flips)
    assert len(list(data.batches(2, drop_last=True, **options))) == 1


# --- synthetic batches ----------------------------------------------------------------------

def test_synthetic_batches_are_valid():
    for seed in range(5):
        batch = synthetic_detection_batch(seed, 4, (48, 64), num_classes=20, max_boxes=5)
        check_detection_batch(batch, num_classes=20)
        assert batch["images"].shape == (4, 3, 48, 64)
        assert batch["image_hw"][0].tolist() == [48, 64]
        assert (batch["image_hw"] >= [24, 32]).all()
        for i in range(4):
            h, w = batch["image_hw"][i]
            n = batch["gt_count"][i]
            boxes, labels = batch["gt_boxes"][i, :n], batch["gt_labels"][i, :n]
            assert 1 <= n <= 5
            assert (boxes >= 0).all() and (boxes[:, 2] <= w).all() and (boxes[:, 3] <= h).all()
            assert (boxes[:, 2] > boxes[:, 0]).all() and (boxes[:, 3] > boxes[:, 1]).all()
            assert ((labels >= 1) & (labels <= 20)).all()


def test_synthetic_batches_depend_on_the_seed_alone():
    a = synthetic_detection_batch(np.random.RandomState(7), 2, 32, 3, 4)
    b = synthetic_detection_batch(7, 2, 32, 3, 4)
    c = synthetic_detection_batch(8, 2, 32, 3, 4)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["images"], c["images"])
    check_detection_batch(synthetic_detection_batch(np.random.default_rng(0), 2, 32, 3, 4), 3)


def test_synthetic_boxes_are_drawn_in_their_class_colour():
    batch = synthetic_detection_batch(1, 3, (40, 40), num_classes=4, max_boxes=1)
    colours = db.class_colours(4)
    for i in range(3):
        x1, y1, x2, y2 = batch["gt_boxes"][i, 0].astype(int)
        pixels = batch["images"][i, :, y1:y2, x1:x2].mean(axis=(1, 2))
        rgb = (pixels * np.array(db.IMAGENET_STD) + np.array(db.IMAGENET_MEAN)) * 255
        np.testing.assert_allclose(rgb, colours[batch["gt_labels"][i, 0]], atol=12)


def test_the_batch_check_catches_a_box_outside_its_image():
    batch = synthetic_detection_batch(0, 2, 32, 3, 2)
    batch["gt_boxes"][1, 0, 2] = batch["image_hw"][1, 1] + 1
    with pytest.raises(DatasetError, match=r"example 1: box 0 .* outside its"):
        check_detection_batch(batch)


def test_synthetic_batches_need_neither_pillow_nor_python_above_36():
    require_backend("cntk")
    from tbdzoo.backends import environments
    code = ("from tbdzoo.datasets import synthetic_detection_batch, check_detection_batch\n"
            "b = synthetic_detection_batch(0, 2, 32, 20, 3)\n"
            "check_detection_batch(b, 20)\n"
            "print(float(b['images'].sum()))\n")
    proc = run_in_env(environments.python_of("cntk"), ["-c", code])
    assert proc.returncode == 0, proc.stderr
    here = synthetic_detection_batch(0, 2, 32, 20, 3)
    assert abs(float(proc.stdout) - float(here["images"].sum())) < 1e-3


# --- bad input, refused by name -------------------------------------------------------------

def test_an_image_without_boxes_is_refused_where_boxes_are_required(devkit):
    folder, _ = devkit
    path = os.path.join(folder, "Annotations", "000004.xml")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(re.sub(r"<object>.*</object>", "", text, flags=re.S))
    data = VOCDetection(folder, "test", empty="keep")
    options = dict(shuffle=False, canvas=200, short_side=60, max_long_side=100)
    batch = next(data.batches(1, **options))  # kept: a batch may hold an image without boxes
    assert batch["gt_count"].tolist() == [0]
    with pytest.raises(DatasetError, match=r"example 0: no boxes, but this configuration"):
        check_detection_batch(batch, require_boxes=True)
    with pytest.raises(DatasetError, match=re.escape(data.image_path("000004")) +
                       r": no boxes, but this configuration trains on ground truth .*"
                       r"empty='skip'"):
        next(data.batches(1, require_boxes=True, **options))


@pytest.mark.parametrize("box, message", [
    ([0, 0, 81, 50], r"box 0 \[0\.0, 0\.0, 81\.0, 50\.0\] reaches outside the 100 x 80 "
                     r"\(height x width\) image"),
    ([-1, 0, 10, 10], r"box 0 .* reaches outside the 100 x 80"),
    ([5, 5, 5, 9], r"box 0 \[5\.0, 5\.0, 5\.0, 9\.0\] is empty"),
    ([5, 5, np.nan, 9], r"box 0 .* is not finite"),
])
def test_a_box_outside_its_image_or_empty_is_refused_naming_the_image(box, message):
    sample = (smooth_image(100, 80), np.array([box], np.float32), [3], [False])
    with pytest.raises(DatasetError, match=r"cat\.jpg: " + message):
        db.make_batch([sample], canvas=200, short_side=60, max_long_side=100, names=["cat.jpg"])


def test_a_box_on_the_image_border_stays_inside_after_the_resize():
    """Scaling in float32 can put an edge a rounding error past the resized image; the batch
    holds it at the edge."""
    sample = (smooth_image(333, 487), np.array([[0, 0, 487, 333]], np.float32), [1], [False])
    batch = db.make_batch([sample], canvas=(700, 1000))
    check_detection_batch(batch, num_classes=20, require_boxes=True)
    h, w = batch["image_hw"][0]
    assert batch["gt_boxes"][0, 0].tolist() == [0, 0, w, h]


@pytest.mark.parametrize("labels, num_classes, message", [
    ([21], 20, r"box 0 has class id 21, outside 1\.\.20 \(0 is the background"),
    ([0], None, r"box 0 has class id 0, outside 1\.\.num_classes"),
    ([1, 2], 20, r"1 boxes but 2 labels"),
])
def test_a_class_id_out_of_range_is_refused_naming_the_image(labels, num_classes, message):
    sample = (smooth_image(100, 80), np.array([[1, 2, 30, 40]], np.float32), labels, [False])
    with pytest.raises(DatasetError, match=r"dog\.jpg: " + message):
        db.make_batch([sample], canvas=200, short_side=60, max_long_side=100, names=["dog.jpg"],
                      num_classes=num_classes)
    with pytest.raises(DatasetError, match=r"example 0: " + message):  # an epoch's batches too
        next(iterate_batches([sample], 1, shuffle=False, canvas=200, short_side=60,
                             max_long_side=100, num_classes=num_classes))


@pytest.mark.parametrize("content, message", [
    ("", r"malformed XML: no element found"),
    ("\x00\xff garbage", r"malformed XML"),
    (None, r"<object> 1 <bndbox> <xmax> is 'nan', not a finite number"),
    ("width", r"<size> <width> is 'abc', not a finite number"),
])
def test_an_annotation_file_that_does_not_parse_is_named(devkit, content, message):
    folder, _ = devkit
    path = os.path.join(folder, "Annotations", "000002.xml")
    if content is None:
        rewrite(path, "<xmax>207</xmax>", "<xmax>nan</xmax>")
    elif content == "width":
        rewrite(path, "<width>500</width>", "<width>abc</width>")
    else:
        with open(path, "w", encoding="latin-1") as f:
            f.write(content)
    with pytest.raises(DatasetError, match=re.escape(path) + ": " + message):
        VOCDetection(folder, "val")
