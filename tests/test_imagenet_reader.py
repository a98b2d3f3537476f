"""The ImageNet-layout reader on tiny folders of real JPEGs: classes, both val/ forms, and an
error naming the file for every malformed or partial data set."""
import os
import pathlib
import shutil

import numpy as np
import pytest

from image_folders import SYNSETS, gradient_image, make_folder, write_jpeg
from tbdzoo.datasets import DatasetError, ImageNetFolder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(str(tmp_path_factory.mktemp("imagenet")))


def test_train_classes_labels_and_images(folder):
    data = ImageNetFolder(folder, "train")
    assert data.classes == list(SYNSETS)
    assert len(data) == 12
    assert list(data.labels) == [0] * 4 + [1] * 4 + [2] * 4
    image, label = data[5]
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    assert label == 1 and os.path.basename(data.paths[5]).startswith(SYNSETS[1])
    assert image.shape[:2] == (64, 48)   # make_folder's second size: (height, width)
    assert data.example(5)["label"] == 1
    data.check()


def test_val_in_class_folders(folder):
    val = ImageNetFolder(folder, "val")
    assert len(val) == 6 and list(val.labels) == [0, 0, 1, 1, 2, 2]
    assert val.ground_truth is None


def test_flat_val_with_one_synset_a_line(tmp_path):
    root = make_folder(str(tmp_path), flat_val=True)
    val = ImageNetFolder(root, "val")
    assert val.ground_truth.endswith("val_labels.txt")
    assert list(val.labels) == [0, 0, 1, 1, 2, 2]
    assert [os.path.basename(p) for p in val.paths] == sorted(os.path.basename(p) for p in val.paths)


def test_flat_val_with_class_indices_and_a_given_file(tmp_path):
    root = make_folder(str(tmp_path), flat_val=True)
    os.remove(os.path.join(root, "val", "val_labels.txt"))
    labels = os.path.join(str(tmp_path), "mine.txt")
    with open(labels, "w") as f:
        f.write("2\n2\n1\n1\n0\n0\n")
    val = ImageNetFolder(root, "val", ground_truth=labels)
    assert list(val.labels) == [2, 2, 1, 1, 0, 0]


def test_flat_val_with_loc_solution_csv(tmp_path):
    root = make_folder(str(tmp_path), flat_val=True)
    os.remove(os.path.join(root, "val", "val_labels.txt"))
    stems = sorted(os.path.splitext(n)[0] for n in os.listdir(os.path.join(root, "val")))
    with open(os.path.join(root, "LOC_val_solution.csv"), "w") as f:
        f.write("ImageId,PredictionString\n")
        for stem, synset in reversed(list(zip(stems, [SYNSETS[i // 2] for i in range(6)]))):
            f.write("{},{} 10 20 30 40 {} 1 2 3 4\n".format(stem, synset, synset))
    val = ImageNetFolder(root, "val")
    assert val.ground_truth.endswith("LOC_val_solution.csv")
    assert list(val.labels) == [0, 0, 1, 1, 2, 2]


def _error(root, split="train", **kw):
    with pytest.raises(DatasetError) as e:
        data = ImageNetFolder(root, split, **kw)
        data.check()
    return str(e.value)


def test_ground_truth_count_mismatch_names_the_file(tmp_path):
    root = make_folder(str(tmp_path), flat_val=True)
    path = os.path.join(root, "val", "val_labels.txt")
    with open(path, "a") as f:
        f.write(SYNSETS[0] + "\n")
    message = _error(root, "val")
    assert path in message and "7 labels for the 6 images" in message


def test_csv_missing_an_image_names_it(tmp_path):
    root = make_folder(str(tmp_path), flat_val=True)
    os.remove(os.path.join(root, "val", "val_labels.txt"))
    gt = os.path.join(root, "LOC_val_solution.csv")
    with open(gt, "w") as f:
        f.write("ImageId,PredictionString\nILSVRC2012_val_00000001,n01440764 1 2 3 4\n")
    message = _error(root, "val")
    assert gt in message and "ILSVRC2012_val_00000002" in message


def test_unknown_label_and_devkit_file_are_refused(tmp_path):
    root = make_folder(str(tmp_path), flat_val=True)
    path = os.path.join(root, "val", "val_labels.txt")
    with open(path, "w") as f:
        f.write("n00000001\n" * 6)
    assert "line 1" in _error(root, "val") and "n00000001" in _error(root, "val")
    devkit = os.path.join(str(tmp_path), "ILSVRC2012_validation_ground_truth.txt")
    with open(devkit, "w") as f:
        f.write("1\n" * 6)
    assert "ILSVRC2012_ID" in _error(root, "val", ground_truth=devkit)


def test_flat_val_without_ground_truth(tmp_path):
    root = make_folder(str(tmp_path), flat_val=True)
    os.remove(os.path.join(root, "val", "val_labels.txt"))
    assert "no ground-truth file" in _error(root, "val")


@pytest.mark.parametrize("damage, words", [
    ("empty", "the file is empty"),
    ("truncated", "corrupt or truncated"),
    ("garbage", "not a decodable JPEG"),
    ("png", "not a JPEG but a PNG"),
])
def test_bad_images_are_named(tmp_path, damage, words):
    root = make_folder(str(tmp_path), per_class=2, val_per_class=0)
    path = os.path.join(root, "train", SYNSETS[1], "{}_1.JPEG".format(SYNSETS[1]))
    data = pathlib.Path(path).read_bytes()
    if damage == "empty":
        pathlib.Path(path).write_bytes(b"")
    elif damage == "truncated":
        pathlib.Path(path).write_bytes(data[:len(data) // 2])
    elif damage == "garbage":
        pathlib.Path(path).write_bytes(b"\x00" * 500)
    else:
        from PIL import Image
        Image.fromarray(gradient_image(np.random.RandomState(0), 8, 8, 0)).save(path, format="PNG")
    message = _error(root)
    assert path in message and words in message


def test_partial_layouts_are_named(tmp_path):
    root = make_folder(str(tmp_path / "a"), per_class=1, val_per_class=0)
    assert "no val/ folder" in _error(root, "val")
    stray = os.path.join(root, "train", SYNSETS[0], "notes.txt")
    pathlib.Path(stray).write_text("x")
    assert stray in _error(root) and "not a JPEG file" in _error(root)
    os.remove(stray)
    empty = os.path.join(root, "train", "n09999999")
    os.makedirs(empty)
    assert empty in _error(root) and "empty class folder" in _error(root)
    shutil.rmtree(empty)
    beside = os.path.join(root, "train", "README")
    pathlib.Path(beside).write_text("x")
    assert beside in _error(root)
    os.remove(beside)
    write_jpeg(os.path.join(root, "val", "n07777777", "x.JPEG"),
               gradient_image(np.random.RandomState(0), 8, 8, 0))
    assert "not one of train/'s 3 classes" in _error(root, "val")
    os.makedirs(str(tmp_path / "b" / "train"))
    assert "no class folders" in _error(str(tmp_path / "b"), "train")
