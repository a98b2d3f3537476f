"""The canonical checkpoint: validation before assignment, clear errors, no pickles."""
import numpy as np
import pytest

import tbdzoo
from tbdzoo import weights as weights_io
from tbdzoo.errors import WeightsError


@pytest.fixture
def model():
    return tbdzoo.build("resnet50", backend="torch", config="tiny")


def _unchanged(model, before):
    after = model.get_weights()
    return all((before[k] == after[k]).all() for k in before)


def test_round_trip_with_manifest(tmp_path, model):
    path = tmp_path / "w.npz"
    model.save_weights(path)
    manifest, arrays = weights_io.read(path)
    assert manifest["spec_hash"] == model.spec.hash() and manifest["layout"] == "canonical-v1"
    assert [t["name"] for t in manifest["tensors"]] == list(model.spec.params())
    assert all(v.dtype == np.float32 for v in arrays.values())


@pytest.mark.parametrize("damage,match", [
    (lambda w: w.pop("fc.bias"), "missing: fc.bias"),
    (lambda w: w.__setitem__("fc.extra", np.zeros(3, np.float32)), "not in the model: fc.extra"),
    (lambda w: w.__setitem__("conv1.weight", np.zeros((8, 3, 3, 3), np.float32)),
     r"conv1.weight has shape \(8, 3, 3, 3\) but the model needs \(8, 3, 7, 7\)"),
    (lambda w: w.__setitem__("fc.bias", np.zeros(10, np.int64)), "fc.bias has dtype int64"),
])
def test_bad_weights_are_refused_and_nothing_is_loaded(model, damage, match):
    before = model.get_weights()
    bad = dict(before)
    bad["bn1.gamma"] = bad["bn1.gamma"] + 1  # a good change that must not land either
    damage(bad)
    with pytest.raises(WeightsError, match=match):
        model.set_weights(bad)
    assert _unchanged(model, before)


def test_bad_files_give_clear_errors(tmp_path, model):
    before = model.get_weights()
    not_npz = tmp_path / "junk.npz"
    not_npz.write_bytes(b"this is not a zip file")
    with pytest.raises(WeightsError, match="not a readable .npz"):
        model.load_weights(not_npz)
    plain = tmp_path / "plain.npz"
    np.savez(plain, **before)
    with pytest.raises(WeightsError, match="no tbdzoo manifest"):
        model.load_weights(plain)
    truncated = tmp_path / "cut.npz"
    model.save_weights(truncated)
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightsError):
        model.load_weights(truncated)
    with pytest.raises(WeightsError, match="no weights file"):
        model.load_weights(tmp_path / "absent.npz")
    assert _unchanged(model, before)


def test_pickled_objects_are_never_loaded(tmp_path, model):
    path = tmp_path / "evil.npz"
    arrays = dict(model.get_weights())
    arrays["fc.bias"] = np.array([{"x": 1}] * 10, dtype=object)
    np.savez(path, **arrays)
    with pytest.raises(WeightsError, match="not a readable"):
        weights_io.read(path)


def test_weights_of_another_model_are_refused(tmp_path, model):
    other = tbdzoo.build("transformer", backend="torch", config="tiny")
    other.save_weights(tmp_path / "t.npz")
    with pytest.raises(WeightsError, match="model 'transformer', not 'resnet50'"):
        model.load_weights(tmp_path / "t.npz")


def test_save_is_atomic_and_keeps_the_suffix(tmp_path, model):
    with pytest.raises(WeightsError, match="end in .npz"):
        model.save_weights(tmp_path / "w.bin")
    model.save_weights(tmp_path / "w.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.npz"]
