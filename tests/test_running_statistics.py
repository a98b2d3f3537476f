"""BatchNorm's running statistics follow the spec on every backend, whatever the framework's
own convention: running = (1 - m) running + m batch, with the unbiased batch variance; and
computing gradients alone changes nothing."""
import numpy as np
import pytest

import tbdzoo

from conftest import require_backend


@pytest.mark.parametrize("backend", ["torch", "tensorflow", "mxnet", "cntk"])
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
