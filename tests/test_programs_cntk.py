"""Training programs on CNTK against the PyTorch reference: WGAN-GP and the original WGAN
(tiny), Inception-v3 (tiny), weights through the canonical .npz, and a batch without noise.

Each case records the reference in a PyTorch worker and runs the same protocol
(tbdzoo/consistency.py: set weights, predict, loss and gradients of every objective, three
steps) on a CNTK worker, at the tolerances of docs/consistency.md.
"""
import numpy as np
import pytest

from conftest import require_backend
from tbdzoo import consistency
from tbdzoo.backends.registry import build
from tbdzoo.reference.optimizers import trajectory as reference_trajectory


@pytest.fixture(scope="module", autouse=True)
def backends():
    require_backend("torch")
    require_backend("cntk")


def cntk_protocol(name, config, weights, batch, steps=3, **overrides):
    model = build(name, backend="cntk", config=config, seed=1, isolate=True, **overrides)
    try:
        return consistency.run_protocol(model, weights, batch, steps)
    finally:
        model.close()


@pytest.mark.parametrize("config", ["tiny", "tiny_original"])
def test_wgan_matches_the_reference(config):
    """Both objectives' values, the gradients of each group (the penalty's second-order terms
    through the spec's input-gradient nodes included) and both trajectories; the original
    WGAN's critic is clipped after each update."""
    # Seed 1, as on every backend: at seed 0 generator ReLU inputs sit within float32 rounding
    # of zero, and CNTK's sums put one on the other side (docs/consistency.md).
    weights, batch, record = consistency.reference("wgan", config, seed=1)
    assert {"loss/generator", "loss/critic", "trajectory/generator",
            "trajectory/critic"} <= set(record)
    tolerances = consistency.tolerances_of(consistency.cases()["wgan"])
    assert consistency.compare(record, cntk_protocol("wgan", config, weights, batch),
                               tolerances) == []


def test_inception_v3_matches_the_reference():
    """Forward output, the weighted objective (main + 0.4 aux, label-smoothed) and the first
    step at the documented tolerances; the gradients of all 94 convolutions' groups point the
    same way (cosine > 0.9995).

    Element-wise gradient tolerances are not reachable for this case by any float32
    implementation: the tiny network's ReLU masks and max-pool winners switch under rounding,
    and PyTorch against itself with weights perturbed by 1e-6 misses the per-element gradient
    tolerance on 271 of 292 tensors (cosines down to 0.997) and the third step's loss by 0.08.
    CNTK's BatchNorm is computed from exact per-channel moments (backends/cntk/ops.py), which
    keeps its gradients within that noise: every cosine above 0.9998 and the first step
    within 1e-3."""
    weights, batch, record = consistency.reference("inception_v3", "tiny", dropout=0.0)
    other = cntk_protocol("inception_v3", "tiny", weights, batch, dropout=0.0)
    tol = consistency.TOLERANCES
    np.testing.assert_allclose(other["forward"], record["forward"], rtol=tol["forward"]["rtol"],
                               atol=tol["forward"]["atol"])
    assert abs(other["loss"] - record["loss"]) < tol["trajectory"]["atol"]
    assert abs(other["trajectory"][0] - record["trajectory"][0]) < tol["trajectory"]["atol"]
    grads = [k for k in record if k.startswith("grad/")]
    assert len(grads) == len([k for k in other if k.startswith("grad/")])
    low = [(k, consistency.cosine(other[k], record[k])) for k in grads
           if consistency.cosine(other[k], record[k]) < 0.9995]
    assert low == []


def test_weights_round_trip_through_the_canonical_npz(tmp_path):
    """Saved by CNTK, loaded by CNTK and by PyTorch: the same arrays and the same images."""
    model = build("wgan", backend="cntk", config="tiny", seed=3, isolate=True)
    path = str(tmp_path / "wgan.npz")
    try:
        batch = model.synthetic_batch(seed=0)
        model.train_step(batch)   # trained weights, clipped and updated by both groups
        model.save_weights(path)
        saved, images = model.get_weights(), model.predict(batch)
    finally:
        model.close()
    for backend in ("cntk", "torch"):
        other = build("wgan", backend=backend, config="tiny", seed=4, isolate=True)
        try:
            other.load_weights(path)
            loaded = other.get_weights()
            assert list(loaded) == list(saved)
            for name, value in saved.items():
                np.testing.assert_array_equal(loaded[name], value, err_msg=name)
            np.testing.assert_allclose(other.predict(batch), images, rtol=1e-4, atol=1e-5)
        finally:
            other.close()


def test_a_wgan_batch_without_noise_is_refused_by_name():
    model = build("wgan", backend="cntk", config="tiny", isolate=True)
    try:
        batch = model.synthetic_batch(seed=0)
        del batch["noise"]
        with pytest.raises(ValueError, match="lacks 'noise'"):
            model.train_step(batch)
        with pytest.raises(ValueError, match="lacks 'noise'"):
            model.predict({"real": batch["real"]})
    finally:
        model.close()


RMSPROP_SCRIPT = r'''
import json, sys
import cntk as C
import numpy as np
from tbdzoo.backends.cntk import optimizers
w = C.parameter(init=np.array([1.0, -2.0, 3.0], np.float32))
target = C.input_variable((3,))
loss = C.reduce_sum(w * target, axis=C.Axis.all_axes())
spec = {"kind": "rmsprop", "lr": 0.1, "alpha": 0.9, "eps": 1.0, "momentum": 0.9,
        "centered": False, "weight_decay": 0.01}
opt = optimizers.make_group([w], spec, {"kind": "global_norm", "value": 2.0})
trainer = C.Trainer(loss, (loss, None), [opt.learner])
for grad in json.loads(sys.argv[1]):
    opt.prepare(0.1)
    trainer.train_minibatch({target: np.array([grad], np.float32)})
print(json.dumps(w.value.tolist()))
'''


def test_cntk_rmsprop_and_global_norm_clipping_follow_the_documented_formula(tmp_path):
    """Three steps against the float64 reference of docs/optimizers.md: clipping before the
    coupled weight decay, epsilon inside the root, the learning rate inside the momentum
    buffer."""
    import json

    from conftest import run_in_env
    from tbdzoo.backends import environments
    grads = [[3.0, 4.0, 0.0], [1.0, 1.0, 1.0], [-2.0, 0.0, 5.0]]
    script = tmp_path / "rmsprop.py"
    script.write_text(RMSPROP_SCRIPT)
    proc = run_in_env(environments.python_for("cntk"), [str(script), json.dumps(grads)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    spec = {"kind": "rmsprop", "alpha": 0.9, "eps": 1.0, "momentum": 0.9, "centered": False,
            "weight_decay": 0.01}
    expected = reference_trajectory(spec, [1.0, -2.0, 3.0], grads, [0.1] * 3,
                                    {"kind": "global_norm", "value": 2.0})[-1]
    np.testing.assert_allclose(json.loads(proc.stdout.strip().splitlines()[-1]), expected, rtol=1e-5)
