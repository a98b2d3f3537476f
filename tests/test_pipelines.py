"""Each framework's input pipeline against the NumPy reference on tiny folders of real JPEGs:
the same examples in the same seeded order, the same crops and flips, pixels equal to within
what the decoders and resizers differ by; every pipeline names a corrupt file; and a model
trained from a folder records its data-fed figures."""
import os

import numpy as np
import pytest

from image_folders import SYNSETS, make_folder
from tbdzoo.datasets import DatasetError, ImageNetFolder
from tbdzoo.pipelines import augment, batch_plan, epoch_order, for_backend
from tbdzoo.pipelines.augment import AugmentSpec

FRAMEWORKS = ("torch", "tensorflow", "mxnet")
SIZE = 32
# Decoders (libjpeg-turbo builds, IDCT) and resizers (Pillow's and torchvision's antialiased
# bilinear, TensorFlow's antialiased bilinear, OpenCV's plain bilinear inside MXNet) differ by
# a grey level or two on these images: measured at most 1.0 (torch), 1.9 (tensorflow) and 2.0
# (mxnet) grey levels, means up to 0.001, 0.29 and 0.17 (docs/pipelines.md).
MAX_GREY_LEVELS, MEAN_GREY_LEVELS = 3.0, 0.5


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return ImageNetFolder(make_folder(str(tmp_path_factory.mktemp("images"))), "train")


def grey_levels(a, b, spec):
    """|a - b| of two normalised batches, in 0..255 pixel units."""
    std = np.asarray(spec.std, np.float32)[None, :, None, None]
    return np.abs(a - b) * std * 255.0


# -- the shared parts ----------------------------------------------------------------------
def test_crop_windows_follow_the_spec():
    rng = np.random.default_rng(0)
    for _ in range(500):
        h, w = rng.integers(8, 400, size=2)
        top, left, ch, cw = augment.crop_window(rng, h, w)
        assert top >= 0 and top + ch <= h and left >= 0 and left + cw <= w and ch > 0 and cw > 0
    # a 100 x 100 image: the area fraction and aspect ratio stay in range (up to rounding)
    windows = [augment.crop_window(rng, 100, 100) for _ in range(2000)]
    area = np.array([ch * cw for _, _, ch, cw in windows]) / 1e4
    ratio = np.array([cw / ch for _, _, ch, cw in windows])
    assert area.min() > 0.07 and area.max() <= 1.0 and ratio.min() > 0.7 and ratio.max() < 1.43
    # where every draw fits (areas up to half the image), the area is uniform on the scale
    half = [augment.crop_window(rng, 100, 100, scale=(0.08, 0.5)) for _ in range(2000)]
    assert np.mean([ch * cw / 1e4 for _, _, ch, cw in half]) == pytest.approx(0.29, abs=0.015)
    # a strip no allowed crop fits ten times: the centred fallback at the nearest ratio
    assert augment.crop_window(np.random.default_rng(0), 10, 1000, scale=(1, 1)) == (0, 493, 10, 13)


def test_draws_depend_on_seed_epoch_and_index_only():
    spec = AugmentSpec(SIZE)
    a = augment.draw(spec, 7, 2, 11, 80, 60)
    assert a == augment.draw(spec, 7, 2, 11, 80, 60)
    assert a != augment.draw(spec, 7, 3, 11, 80, 60) and a != augment.draw(spec, 7, 2, 12, 80, 60)
    flips = [augment.draw(spec, 0, 0, i, 80, 60).flip for i in range(400)]
    assert 0.4 < np.mean(flips) < 0.6
    assert augment.draw(spec.evaluation(), 7, 2, 11, 80, 60) is None
    assert augment.eval_geometry(AugmentSpec(224), 375, 500) == ((256, 341), (16, 58, 224, 224))
    assert AugmentSpec(299).resize == 342


def test_reference_crops_flips_and_normalises():
    image = np.zeros((40, 40, 3), np.uint8)
    image[:, :20] = 255                          # left half white
    spec = AugmentSpec(20, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    plain = augment.reference(image, spec, augment.CropParams(0, 0, 40, 40, False))
    flipped = augment.reference(image, spec, augment.CropParams(0, 0, 40, 40, True))
    assert plain.shape == (3, 20, 20) and plain.dtype == np.float32
    assert plain[0, 0, 0] == pytest.approx(1.0) and plain[0, 0, -1] == pytest.approx(-1.0)
    np.testing.assert_array_equal(flipped, plain[:, :, ::-1])
    corner = augment.reference(image, spec, augment.CropParams(0, 0, 10, 10, False))
    assert np.allclose(corner, 1.0)              # a crop inside the white half


def test_one_permutation_per_epoch_and_even_shards():
    a, b = epoch_order(10, seed=3, epoch=0), epoch_order(10, seed=3, epoch=1)
    assert sorted(a) == list(range(10)) and list(a) != list(b)
    np.testing.assert_array_equal(a, np.random.default_rng([3, 0]).permutation(10))
    shards = [epoch_order(10, 3, 0, rank=r, world_size=3) for r in range(3)]
    assert [len(s) for s in shards] == [4, 4, 4]
    assert set(np.concatenate(shards)) == set(range(10))   # 12 slots: two examples twice
    plan = list(batch_plan(10, 4, seed=3, epochs=2))
    assert len(plan) == 4 and {e for batch in plan for e, _ in batch} == {0, 1}
    with pytest.raises(ValueError, match="rank 3"):
        epoch_order(10, rank=3, world_size=3)


def test_ranks_read_disjoint_shards_of_one_epoch(source):
    ref = for_backend("numpy")
    spec = AugmentSpec(SIZE, train=False)
    whole = np.concatenate([b["images"] for b in ref.loader(source, spec, 2, seed=4)])
    shards = [np.concatenate([b["images"] for b in ref.loader(source, spec, 2, seed=4, rank=r,
                                                              world_size=2)]) for r in range(2)]
    assert [len(s) for s in shards] == [6, 6]
    np.testing.assert_array_equal(shards[0], whole[0::2])   # rank r: positions r, r + 2, ...
    np.testing.assert_array_equal(shards[1], whole[1::2])


# -- every framework against the reference ---------------------------------------------------
@pytest.fixture(scope="module")
def reference_batches(source):
    ref = for_backend("numpy")
    return {train: list(ref.loader(source, AugmentSpec(SIZE, train=train), 4, seed=5, epochs=2,
                                   workers=2))
            for train in (True, False)}


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_batches_match_the_reference(source, reference_batches, framework):
    module = for_backend(framework)
    for train in (True, False):
        spec = AugmentSpec(SIZE, train=train)
        got = [module.as_numpy(b) for b in module.loader(
            source, spec, 4, seed=5, epochs=2, workers=0, deterministic=True)]
        expected = reference_batches[train]
        assert len(got) == len(expected) == 6
        for g, e in zip(got, expected):
            np.testing.assert_array_equal(g["labels"], e["labels"])
            assert g["images"].shape == (4, 3, SIZE, SIZE) and g["images"].dtype == np.float32
            diff = grey_levels(g["images"], e["images"], spec)
            assert diff.max() <= MAX_GREY_LEVELS and diff.mean() <= MEAN_GREY_LEVELS, \
                (framework, train, diff.max(), diff.mean())


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_workers_give_the_same_batches(source, framework):
    module = for_backend(framework)
    spec = AugmentSpec(SIZE)
    one = [module.as_numpy(b) for b in module.loader(source, spec, 3, seed=1, workers=0)]
    two = [module.as_numpy(b) for b in module.loader(source, spec, 3, seed=1, workers=2,
                                                     deterministic=True)]
    assert len(one) == len(two) == 4
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a["labels"], b["labels"])
        np.testing.assert_array_equal(a["images"], b["images"])


@pytest.mark.parametrize("framework", FRAMEWORKS + ("numpy",))
def test_a_corrupt_file_is_named_by_every_pipeline(tmp_path, framework):
    root = make_folder(str(tmp_path), per_class=2, val_per_class=0)
    bad = os.path.join(root, "train", SYNSETS[2], "{}_0.JPEG".format(SYNSETS[2]))
    with open(bad, "r+b") as f:
        data = f.read()
        f.seek(0)
        f.write(b"\xff\xd8" + b"\x00" * (len(data) - 2))  # a JPEG marker, then nothing valid
    module = for_backend(framework)
    with pytest.raises(DatasetError) as e:
        for _ in module.loader(ImageNetFolder(root), AugmentSpec(SIZE), 2,
                               workers=2 if framework != "tensorflow" else 0):
            pass
    assert bad in str(e.value)


# -- data-fed training -------------------------------------------------------------------
def test_tbd_run_with_data_records_data_fed_figures_beside_the_synthetic_ones(source, tmp_path):
    import json
    import subprocess
    import sys
    out = tmp_path / "r.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "tbdzoo.cli", "run", "resnet50", "--backend", "torch", "--config",
         "tiny", "--set", "image_size={}".format(SIZE), "--set", "num_classes=3", "--data",
         source.root, "--data-workers", "1", "--warmup", "1", "--steps", "2", "--repeats", "2",
         "-o", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "fed from {}".format(source.root) in " ".join(proc.stdout.split())
    record = json.loads(out.read_text())
    assert record["status"] == "ok" and record["throughput"]["unit"] == "images/s"
    fed = record["data"]
    assert fed["examples"] == 12 and fed["classes"] == 3 and fed["augment"] is True
    assert fed["pipeline"].startswith("torch.utils.data.DataLoader") and fed["workers"] == 1
    assert fed["throughput"]["items_per_step"] == 4 and fed["throughput"]["value"] > 0
    assert fed["vs_synthetic"] == pytest.approx(
        fed["throughput"]["value"] / record["throughput"]["value"])
    assert 0 <= fed["input_wait_fraction"] < 1 and fed["input_bound"] == (
        fed["input_wait_fraction"] > 0.1)
    assert fed["cpu"]["process_tree_cores_busy"] > 0 and all(np.isfinite(fed["losses"]))


def test_tbd_run_refuses_bad_data_before_building(source, capsys):
    from tbdzoo.cli import main
    code = main(["run", "resnet50", "--backend", "torch", "--config", "tiny", "--data",
                 source.root, "--set", "num_classes=2"])
    assert code == 2 and "3 classes, but the model's config has 2: set --set num_classes=3" in \
        capsys.readouterr().err


def test_tbd_run_refuses_a_negative_worker_count_as_it_parses(source, capsys):
    from tbdzoo.cli import main
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "resnet50", "--backend", "torch", "--config", "tiny", "--data",
              source.root, "--data-workers", "-1"])
    assert exit_info.value.code == 2
    assert "--data-workers: '-1' is not a non-negative integer (0 or more)" in \
        capsys.readouterr().err


def test_tbd_run_names_a_missing_folder_and_a_model_without_a_reader(tmp_path, capsys):
    from tbdzoo.cli import main
    assert main(["run", "resnet50", "--backend", "torch", "--data", str(tmp_path)]) == 2
    assert "no train/ folder" in capsys.readouterr().err
    assert main(["run", "transformer", "--backend", "torch", "--data", str(tmp_path)]) == 2
    assert "transformer needs a reader" in capsys.readouterr().err
