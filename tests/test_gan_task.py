"""WGAN to a target (tbdzoo/training/gan_task.py, frechet.py): the Fréchet distance itself, the
feature network's determinism, a few steps on PyTorch and MXNet from the same weights, the
evaluation the same on both from the same weights, and the errors of bad input."""
import numpy as np
import pytest

from conftest import require_backend
from tbdzoo.cli import main
from tbdzoo.datasets.makers import make
from tbdzoo.training import TrainingError, parse_target, train_to_target
from tbdzoo.training.frechet import FeatureNetwork, frechet_distance, grey_grid
from tbdzoo.training.gan_task import GanTask, scale

# A narrow WGAN-GP (the proxy's program: one generator and n_critic critic updates a step).
TINY = {"dim": 2, "z_dim": 8, "batch_size": 4, "n_critic": 2}


@pytest.fixture(scope="module")
def fm64(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("data") / "fm64")
    make("fashion-mnist-64", out, seed=0, options={"train_per_class": 10, "val_per_class": 5})
    return out


def test_distance_of_a_set_with_itself_is_zero_and_grows_with_a_shift():
    rng = np.random.RandomState(0)
    a = rng.standard_normal((400, 6)) @ rng.standard_normal((6, 6))
    assert abs(frechet_distance(a, a)) < 1e-6
    distances = [frechet_distance(a + s, a) for s in (0.5, 1.0, 2.0)]
    # The same covariance: the distance is the squared shift of the means, 6 s^2.
    assert np.allclose(distances, [6 * 0.25, 6 * 1.0, 6 * 4.0], rtol=1e-6)
    # The same mean, covariance times 4: tr(S + 4 S - 2 (4 S^2)^(1/2)) = tr(S).
    assert frechet_distance(2 * a, a) == pytest.approx(
        np.trace(np.cov(a, rowvar=False)) + np.sum(a.mean(0) ** 2), rel=1e-6)
    assert frechet_distance(a, rng.standard_normal((400, 6))) > 1.0


def test_grey_grid_and_its_errors():
    images = np.full((2, 3, 64, 64), 0.5, np.float32)
    images[1, :, :4, :4] = -1.0           # one black 4 x 4 block: one dark cell
    grid = grey_grid(images)
    assert grid.shape == (2, 256) and np.allclose(grid[0], 0.75)
    assert grid[1, 0] == pytest.approx(0.0) and np.allclose(grid[1, 1:], 0.75)
    with pytest.raises(ValueError, match="expected \\(N, 3, S, S\\)"):
        grey_grid(np.zeros((2, 64, 64, 3)))


def test_feature_network_is_deterministic_and_learns_the_classes(fm64):
    from tbdzoo.datasets.imagenet64 import read_npz_folder
    images, labels = read_npz_folder(fm64 + "/Imagenet64_train_npz", size=64)
    first, second = FeatureNetwork().fit(scale(images), labels), FeatureNetwork().fit(
        scale(images), labels)
    features = first.features(scale(images))
    assert features.shape == (100, 64) and (features >= 0).all()
    assert np.array_equal(features, second.features(scale(images)))
    assert first.accuracy(scale(images), labels) > 0.5      # ten classes: chance is 0.1
    other = FeatureNetwork(random_state=1).fit(scale(images), labels)
    assert not np.array_equal(features, other.features(scale(images)))


@pytest.fixture(scope="module")
def torch_run(fm64, one_torch_thread):
    import tbdzoo
    model = tbdzoo.build("wgan", backend="torch", config="paper", seed=0, **TINY)
    result = train_to_target(model, data_dir=fm64, target="frechet=1", seed=0, eval_every=2,
                             max_steps=4)
    yield model, result
    model.close()


def test_a_few_steps_on_torch(torch_run):
    _, result = torch_run
    record = result.record()
    assert not result.reached and result.stop_reason == "max_steps (4) ran out"
    assert [h["step"] for h in record["history"]] == [2, 4]
    assert all(0 < h["value"] < 1000 for h in record["history"])
    assert record["examples"] == {"train": 100, "valid": 50, "generated": 500}
    assert record["dataset"].startswith("fashion-mnist-64[")
    assert len(record["losses"]) == 4 and set(record["losses"][0]) == {"generator", "critic"}


def test_mxnet_trains_alike_and_scores_the_same_weights_alike(fm64, torch_run):
    """Four steps on MXNet from the same seed follow PyTorch's evaluations; PyTorch's weights
    on MXNet give PyTorch's distance: the backend enters the metric only through the pixels."""
    require_backend("mxnet")
    import tbdzoo
    reference, torch_result = torch_run
    model = tbdzoo.build("wgan", backend="mxnet", config="paper", seed=0, **TINY)
    try:
        result = train_to_target(model, data_dir=fm64, target="frechet=1", seed=0,
                                 eval_every=2, max_steps=4)
        for mine, theirs in zip(result.history, torch_result.history):
            assert mine["value"] == pytest.approx(theirs["value"], rel=1e-2)
        model.set_weights(reference.get_weights())
        mine = GanTask(model, fm64).evaluate()["frechet"]
        theirs = GanTask(reference, fm64).evaluate()["frechet"]
        assert mine == pytest.approx(theirs, rel=1e-4)
        assert theirs == pytest.approx(torch_result.history[-1]["value"], rel=1e-9)
    finally:
        model.close()


def test_bad_input_names_the_problem_and_the_fix(fm64, tmp_path, capsys):
    with pytest.raises(TrainingError, match="top1 is not a metric of wgan; its metrics: frechet"):
        parse_target("wgan", "top1=0.5")
    with pytest.raises(TrainingError, match="met before any training"):
        parse_target("wgan", "frechet=1000")
    (tmp_path / "train").mkdir()       # an ImageNet layout, not the downsampled one
    code = main(["train", "wgan", "--backend", "torch", "--data", str(tmp_path),
                 "-o", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and "train_64x64" in err and "tbd data make fashion-mnist-64" in err
    assert not (tmp_path / "r.jsonl").exists()
    with pytest.raises(TrainingError, match="DIR/valid_64x64"):
        train_to_target("wgan", "torch", str(tmp_path / "missing"), "frechet=10")
