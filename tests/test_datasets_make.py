"""`tbd data make`: the image sets made offline from Fashion-MNIST and real photographs, their
manifest and determinism, and the downsampled-ImageNet reader's errors (docs/datasets.md)."""
import gzip
import json
import os
import pathlib
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from PIL import Image

from tbdzoo.datasets import imagenet64, make_images, makers
from tbdzoo.datasets.errors import DatasetError
from tbdzoo.datasets.voc import VOCDetection, parse_annotation
from tbdzoo.errors import UnknownNameError

TINY_IMAGENET = {"size": 32, "train_per_class": 2, "val_per_class": 1}
TINY_64 = {"train_per_class": 2, "val_per_class": 1, "train_batches": 2}
TINY_VOC = {"images": 6, "long_side": 128, "min_side": 16, "max_objects": 3}


def _sums(folder):
    return makers.read_manifest(folder)["files"]["sha256"]


def test_the_registry_lists_the_image_makers_with_their_options():
    names = [m.name for m in makers.list_makers()]
    assert names == sorted(names)
    assert {"fashion-mnist-imagenet", "fashion-mnist-64", "voc-composed"} <= set(names)
    options = makers.get_maker("fashion-mnist-imagenet").options
    assert options["size"] == 64 and options["train_per_class"] == 100
    with pytest.raises(UnknownNameError, match="unknown data set 'mnist'; known: .*fashion-mnist-64"):
        makers.get_maker("mnist")


def test_fashion_mnist_imagenet_is_imagenet_layout_with_the_source_pixels(tmp_path):
    out = str(tmp_path / "fm")
    manifest = makers.make("fashion-mnist-imagenet", out, seed=3, options=TINY_IMAGENET)
    assert sorted(os.listdir(out)) == ["LOC_synset_mapping.txt", "tbdzoo-dataset.json", "train",
                                       "val"]
    assert sorted(os.listdir(os.path.join(out, "train"))) == list(make_images.SYNSETS)
    assert sorted(os.listdir(os.path.join(out, "val"))) == list(make_images.SYNSETS)
    source, labels = make_images.load_fashion_mnist("train")
    for label, synset in enumerate(make_images.SYNSETS):
        names = sorted(os.listdir(os.path.join(out, "train", synset)))
        assert len(names) == 2
        for name in names:
            assert name.startswith(synset + "_") and name.endswith(".JPEG")
            index = int(name[len(synset) + 1:-5])
            assert labels[index] == label
            with Image.open(os.path.join(out, "train", synset, name)) as im:
                assert (im.format, im.mode, im.size) == ("JPEG", "RGB", (32, 32))
                pixels = np.asarray(im, np.float32)
            expected = make_images._rgb(source[index], 32).astype(np.float32)
            assert np.abs(pixels - expected).mean() < 4.0     # JPEG at quality 95
        assert len(os.listdir(os.path.join(out, "val", synset))) == 1
    with open(os.path.join(out, "LOC_synset_mapping.txt")) as f:
        assert f.readline() == "n00000000 T-shirt/top\n"
    assert manifest["name"] == "fashion-mnist-imagenet" and manifest["seed"] == 3
    assert manifest["facts"]["images"] == {"train": 20, "val": 10}
    assert manifest["files"]["by_extension"] == {".JPEG": 30, ".txt": 1}
    assert manifest["options"]["size"] == 32
    assert makers.read_manifest(out) == json.loads(json.dumps(manifest))


@pytest.mark.parametrize("name,options", [("fashion-mnist-64", TINY_64),
                                          ("voc-composed", TINY_VOC)])
def test_the_same_seed_gives_the_same_bytes_and_another_seed_others(tmp_path, name, options):
    first = makers.make(name, str(tmp_path / "a"), seed=7, options=options)
    again = makers.make(name, str(tmp_path / "b"), seed=7, options=options)
    other = makers.make(name, str(tmp_path / "c"), seed=8, options=options)
    assert first["files"]["sha256"] == again["files"]["sha256"] == _sums(str(tmp_path / "b"))
    assert other["files"]["sha256"] != first["files"]["sha256"]


def test_fashion_mnist_64_pngs_and_npz_hold_the_same_images(tmp_path):
    out = str(tmp_path / "f64")
    makers.make("fashion-mnist-64", out, seed=0, options=TINY_64)
    assert sorted(os.listdir(os.path.join(out, "train_64x64")))[:2] == ["0000001.png",
                                                                        "0000002.png"]
    assert sorted(os.listdir(os.path.join(out, "Imagenet64_train_npz"))) == [
        "train_data_batch_1.npz", "train_data_batch_2.npz"]
    pngs = imagenet64.read_png_folder(os.path.join(out, "train_64x64"))
    images, labels = imagenet64.read_npz_folder(os.path.join(out, "Imagenet64_train_npz"))
    assert pngs.shape == images.shape == (20, 64, 64, 3) and pngs.dtype == np.uint8
    assert np.array_equal(pngs, images)                   # PNG is lossless, same order
    assert np.array_equal(np.bincount(labels, minlength=10), [2] * 10)
    assert labels.dtype == np.int64 and labels.min() == 0  # 1-based on disk
    with np.load(os.path.join(out, "Imagenet64_train_npz", "train_data_batch_1.npz")) as npz:
        assert sorted(npz.files) == ["data", "labels", "mean"]
        assert npz["data"].shape == (10, 12288) and npz["labels"].min() >= 1
        # one row: the red plane, then green, then blue
        assert np.array_equal(npz["data"][0, :4096].reshape(64, 64), images[0, :, :, 0])
    all_rows = make_images._chw_rows(images)
    for k in (1, 2):
        with np.load(os.path.join(out, "Imagenet64_train_npz",
                                  "train_data_batch_{}.npz".format(k))) as npz:
            assert np.allclose(npz["mean"], all_rows.mean(axis=0))  # the whole training set's
    val_pngs = imagenet64.read_png_folder(os.path.join(out, "valid_64x64"))
    val_images, val_labels = imagenet64.read_npz(
        os.path.join(out, "Imagenet64_val_npz", "val_data.npz"))
    assert np.array_equal(val_pngs, val_images) and sorted(val_labels) == list(range(10))


def test_voc_composed_reads_back_through_vocdetection(tmp_path):
    out = str(tmp_path / "voc")
    manifest = makers.make("voc-composed", out, seed=1, options=TINY_VOC)
    facts = manifest["facts"]
    assert facts["images"] == {"train": 3, "val": 1, "test": 2, "trainval": 4}
    for image_set, count in (("trainval", 4), ("test", 2)):
        data = VOCDetection(out, image_set, class_names=make_images.CLASS_TOKENS)
        assert len(data) == count
        for i in range(count):
            sample = data[i]
            height, width = sample.image.shape[:2]
            assert sorted((height, width)) == [96, 128]
            assert 1 <= len(sample.labels) <= 3 and sample.labels.min() >= 1
            assert np.all(sample.boxes[:, :2] >= 0) and np.all(sample.boxes[:, 2] <= width)
            assert np.all(sample.boxes[:, 3] <= height)
            sides = np.minimum(sample.boxes[:, 2] - sample.boxes[:, 0],
                               sample.boxes[:, 3] - sample.boxes[:, 1])
            assert np.all(sample.difficult[sides < 24])          # small objects are difficult
    main = os.path.join(out, "VOC2007", "ImageSets", "Main")
    assert pathlib.Path(main, "trainval.txt").read_text().split() == [
        "000001", "000002", "000003", "000004"]
    objects, difficult = 0, 0
    for name in sorted(os.listdir(os.path.join(out, "VOC2007", "Annotations"))):
        note = parse_annotation(os.path.join(out, "VOC2007", "Annotations", name),
                                make_images.CLASS_TOKENS)
        objects += len(note.labels)
        difficult += int(note.difficult.sum())
        image_id = note.image_id
        for label, token in enumerate(make_images.CLASS_TOKENS, 1):
            for image_set in ("train", "val", "test"):
                lines = dict(line.split() for line in pathlib.Path(
                    main, "{}_{}.txt".format(token, image_set)).read_text().splitlines())
                if image_id in lines:
                    present = note.labels == label
                    want = -1 if not present.any() else (0 if note.difficult[present].all() else 1)
                    assert int(lines[image_id]) == want
    assert (objects, difficult) == (facts["objects"], facts["difficult"])
    assert sum(facts["objects_per_class"].values()) == objects


def test_an_existing_folder_is_refused_and_a_failed_make_leaves_nothing(tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(DatasetError, match="exists and is not empty"):
        makers.make("fashion-mnist-64", str(out))
    assert os.listdir(str(out)) == ["keep.txt"]
    # a source whose training labels are truncated: the make fails, naming the file
    source = tmp_path / "source"
    source.mkdir()
    for name in os.listdir(make_images.FASHION_MNIST_DIR):
        data = pathlib.Path(make_images.FASHION_MNIST_DIR, name).read_bytes()
        (source / name).write_bytes(data[:len(data) // 2] if name.startswith("train-labels")
                                    else data)
    target = tmp_path / "data" / "new"  # its parent is made for it, and removed on failure
    with pytest.raises(DatasetError, match="train-labels-idx1-ubyte.gz: the gzip stream ends"):
        makers.make("fashion-mnist-64", str(target), options={"source": str(source)})
    assert sorted(os.listdir(str(tmp_path))) == ["source", "taken"]   # no partial folder
    # interrupted half-way (Ctrl-C arrives during a progress report): nothing is left either
    def interrupt(what, done=None, total=None):
        if done and done >= 5:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        makers.make("fashion-mnist-64", str(target), options=TINY_64, progress=interrupt)
    assert sorted(os.listdir(str(tmp_path))) == ["source", "taken"]
    # a path through a file is refused before anything is made
    with pytest.raises(DatasetError, match="keep.txt is not a folder"):
        makers.make("fashion-mnist-64", str(out / "keep.txt" / "new"), options=TINY_64)
    assert sorted(os.listdir(str(tmp_path))) == ["source", "taken"]
    # an empty folder is taken
    target.parent.mkdir()
    target.mkdir()
    makers.make("fashion-mnist-64", str(target), options=TINY_64)
    assert sorted(os.listdir(str(target)))[0] == "Imagenet64_train_npz"


def test_bad_options_and_a_missing_package_say_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(DatasetError, match="voc-composed has no option 'size'; its options: "
                                           "images=48"):
        makers.make("voc-composed", str(tmp_path / "v"), options={"size": "3"})
    with pytest.raises(DatasetError, match="option images='many' is not an integer"):
        makers.make("voc-composed", str(tmp_path / "v"), options=[("images", "many")])
    with pytest.raises(DatasetError, match="1001 images of class T-shirt/top asked for, "
                                           "Fashion-MNIST has"):
        makers.make("fashion-mnist-64", str(tmp_path / "v"), options={"val_per_class": 1001})
    missing = str(tmp_path / "not-installed")
    monkeypatch.setattr(make_images, "FASHION_MNIST_DIR", missing)
    with pytest.raises(makers.SystemPackageMissing,
                       match="apt-get install dataset-fashion-mnist"):
        make_images.load_fashion_mnist("train", missing)
    assert not os.path.exists(str(tmp_path / "v"))


@pytest.mark.parametrize("content,message", [
    (b"\x00\x00\x0d\x01" + b"\x00" * 8, "not an idx file of unsigned bytes"),
    (b"\x00\x00\x08\x03\x00\x00\x00\x02", "the header promises 3 dimensions"),
    (b"\x00\x00\x08\x01\x00\x00\x00\x05\x01\x02", "the header says 5 \\(5 bytes of data\\) but 2"),
])
def test_bad_idx_files_are_named(tmp_path, content, message):
    path = str(tmp_path / "bad-idx.gz")
    with gzip.open(path, "wb") as f:
        f.write(content)
    with pytest.raises(DatasetError, match="bad-idx.gz: " + message):
        make_images.read_idx(path)


# -- the downsampled-ImageNet reader's errors ------------------------------------------------
def _rows(n, side=64):
    return np.arange(n * 3 * side * side, dtype=np.int64).astype(np.uint8).reshape(n, -1)


def test_pickled_files_are_refused_by_name_never_unpickled(tmp_path):
    class Boom:
        def __reduce__(self):
            return (os.mkdir, (str(tmp_path / "unpickled"),))

    batch = tmp_path / "train_data_batch_1"
    batch.write_bytes(pickle.dumps({"data": _rows(2), "labels": [1, 2], "boom": Boom()},
                                   protocol=2))
    for path in (str(batch), str(tmp_path)):
        with pytest.raises(DatasetError, match="train_data_batch_1: a pickled file; tbdzoo "
                                               "never unpickles"):
            (imagenet64.read_npz if path == str(batch) else imagenet64.read_npz_folder)(path)
    disguised = tmp_path / "val_data.npz"
    disguised.write_bytes(batch.read_bytes())
    with pytest.raises(DatasetError, match="val_data.npz: a pickled file"):
        imagenet64.read_npz(str(disguised))
    objects = tmp_path / "objects.npz"
    np.savez(str(objects), data=np.array([{"a": 1}], dtype=object), labels=np.array([1]))
    with pytest.raises(DatasetError, match="objects.npz: cannot load without unpickling"):
        imagenet64.read_npz(str(objects))
    assert not (tmp_path / "unpickled").exists()


def test_malformed_or_partial_npz_sets_name_the_file(tmp_path):
    folder = tmp_path / "Imagenet64_train_npz"
    folder.mkdir()
    for k in (1, 3):
        make_images.write_npz(str(folder / "train_data_batch_{}.npz".format(k)),
                              {"data": _rows(2), "labels": np.array([1, 5])})
    with pytest.raises(DatasetError, match="train_data_batch_2.npz is missing .*up to 3"):
        imagenet64.read_npz_folder(str(folder))
    os.remove(str(folder / "train_data_batch_3.npz"))
    images, labels = imagenet64.read_npz_folder(str(folder))
    assert images.shape == (2, 64, 64, 3) and list(labels) == [0, 4]
    (folder / "notes.txt").write_text("x")
    with pytest.raises(DatasetError, match="notes.txt: not a data file of this layout"):
        imagenet64.read_npz_folder(str(folder))
    cases = {
        "nolabels.npz": ({"data": _rows(2)}, "no labels in the file \\(it holds data\\)"),
        "zero.npz": ({"data": _rows(2), "labels": np.array([0, 1])}, "labels run 0..1; "
                     "Chrabaszcz et al.'s are 1-based"),
        "short.npz": ({"data": _rows(2), "labels": np.array([1])}, "labels are \\(1,\\) int64, "
                      "not 2 integers"),
        "width.npz": ({"data": _rows(2)[:, :100], "labels": np.array([1, 2])},
                      "rows of 100 values are not 3 x s x s images"),
    }
    for name, (arrays, message) in cases.items():
        make_images.write_npz(str(tmp_path / name), arrays)
        with pytest.raises(DatasetError, match=name + ": " + message):
            imagenet64.read_npz(str(tmp_path / name))
    good = (tmp_path / "zero.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(good[:len(good) // 2])
    with pytest.raises(DatasetError, match="cut.npz: not a readable .npz \\(zip\\) file"):
        imagenet64.read_npz(str(tmp_path / "cut.npz"))
    assert zipfile.is_zipfile(str(tmp_path / "zero.npz"))


def test_malformed_png_folders_name_the_file(tmp_path):
    folder = tmp_path / "valid_64x64"
    folder.mkdir()
    pixels = np.random.RandomState(0).randint(0, 256, (64, 64, 3)).astype(np.uint8)
    for number in (1, 2, 10):
        Image.fromarray(pixels).save(str(folder / "{:07d}.png".format(number)))
    data = imagenet64.PNGFolder(str(folder))
    assert [os.path.basename(p) for p in data.paths] == ["0000001.png", "0000002.png",
                                                         "0000010.png"]
    assert np.array_equal(data[2], pixels)
    Image.fromarray(pixels[:32]).save(str(folder / "0000002.png"))
    with pytest.raises(DatasetError, match="0000002.png: 32 x 64 pixels"):
        data.array()
    Image.fromarray(pixels[:, :, 0]).save(str(folder / "0000002.png"))
    with pytest.raises(DatasetError, match="0000002.png: colour mode L, not RGB"):
        data[1]
    whole = (folder / "0000001.png").read_bytes()
    (folder / "0000002.png").write_bytes(whole[:len(whole) // 2])
    with pytest.raises(DatasetError, match="0000002.png: cannot read the PNG .*truncated"):
        data[1]
    (folder / "README").write_text("x")
    with pytest.raises(DatasetError, match="not PNGs, first .*README"):
        imagenet64.PNGFolder(str(folder))


# -- the command line ------------------------------------------------------------------------
def tbd(*args):
    return subprocess.run([sys.executable, "-m", "tbdzoo.cli"] + list(args),
                          capture_output=True, text=True, timeout=300)


def test_tbd_data_list_and_make(tmp_path):
    listed = tbd("data", "list")
    assert listed.returncode == 0
    for word in ("fashion-mnist-imagenet", "fashion-mnist-64", "voc-composed", "size=64"):
        assert word in listed.stdout
    out = str(tmp_path / "data" / "made")  # data/ does not exist yet: it is made
    made = tbd("data", "make", "fashion-mnist-imagenet", "--out", out, "--seed", "2",
               "--set", "train_per_class=1", "--set", "val_per_class=1", "--set", "size=28")
    assert made.returncode == 0, made.stderr
    assert "20 files" not in made.stdout and "21 files" in made.stdout
    assert makers.read_manifest(out)["seed"] == 2
    again = tbd("data", "make", "fashion-mnist-imagenet", "--out", out)
    assert again.returncode == 2 and "exists and is not empty" in again.stderr
    unknown = tbd("data", "make", "imagenet", "--out", str(tmp_path / "x"))
    assert unknown.returncode == 2 and "unknown data set 'imagenet'; known:" in unknown.stderr
