"""What every backend promises, checked on all four the same way: canonical weights that round
trip exactly (tied ones included), and BatchNorm running statistics that follow the spec
whatever the framework's own convention."""
import numpy as np
import pytest

import tbdzoo

from conftest import random_weights, require_backend

BACKENDS = ["torch", "tensorflow", "mxnet", "cntk"]


@pytest.mark.parametrize("name", ["resnet50", "probe/tied_dense"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_round_trip(backend, name, tmp_path):
    require_backend(backend)
    path = tmp_path / "w.npz"
    with tbdzoo.build(name, backend=backend, config="tiny", isolate=True) as model:
        weights = random_weights(model)
        model.set_weights(weights)
        got = model.get_weights()
        assert list(got) == list(model.spec.params())
        for key, value in got.items():
            np.testing.assert_array_equal(value, weights[key])
        model.save_weights(path)
    with tbdzoo.build(name, backend=backend, config="tiny", seed=7, isolate=True) as other:
        other.load_weights(path)
        for key, value in other.get_weights().items():
            np.testing.assert_array_equal(value, weights[key])


@pytest.mark.parametrize("backend", BACKENDS)
def test_running_statistics_follow_the_spec(backend):
    require_backend(backend)
    with tbdzoo.build("probe/batchnorm", backend=backend, config="tiny", isolate=True) as model:
        batch = model.synthetic_batch()
        before = model.get_weights()
        model.loss_and_gradients(batch)
        for key, value in model.get_weights().items():
            np.testing.assert_array_equal(value, before[key])
        model.train_step(batch)
        after = model.get_weights()
    x = batch["x"].astype(np.float64)
    m = model.spec.nodes["bn"].attrs["momentum"]
    np.testing.assert_allclose(after["bn.running_mean"], m * x.mean(axis=(0, 2, 3)), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(after["bn.running_var"],
                               (1 - m) + m * x.var(axis=(0, 2, 3), ddof=1), rtol=1e-5)
