"""Training programs on the TensorFlow backend against the PyTorch reference.

Both backends run in this process (the main environment has both frameworks): the reference
takes its initial weights and a synthetic step batch, both run the consistency protocol
(tbdzoo/consistency.py: predict, the gradients of every objective, three steps) and the
results are compared at the tolerances of docs/consistency.md.

WGAN-GP runs TensorFlow's default execution (a traced function per phase); the other cases run
eagerly, the same Python code op by op, because tracing and optimising each gradient and update
graph costs more than the whole eager protocol on CI's two cores (about 100 s for the tiny
Inception-v3, 25 s for each of WGAN's).
"""
from collections import OrderedDict

import numpy as np
import pytest

from conftest import random_weights, require_framework

require_framework("tensorflow")
require_framework("torch")

import tbdzoo.backends.tensorflow.framework  # noqa: F401  (first: it orders the triton import)
from tbdzoo import consistency
from tbdzoo.backends.registry import build_native


def _consistency_failures(name, config, seed=0, execution="default", tolerances=None,
                          **overrides):
    ref = build_native(name, "torch", config=config, seed=seed, device="cpu", **overrides)
    weights, batch = ref.get_weights(), ref.synthetic_batch(seed=seed)
    record = consistency.run_protocol(ref, weights, batch)
    other = build_native(name, "tensorflow", config=config, seed=seed + 1, execution=execution,
                         **overrides)
    result = consistency.run_protocol(other, weights, batch)
    return consistency.compare(record, result, tolerances), record, result


def test_inception_v3_matches_the_reference_auxiliary_loss_rmsprop_and_clipping():
    """Learning rate 0.0045 instead of 0.045: at 0.045 the tiny network's third loss is
    ill-conditioned (PyTorch in float32 lands 7e-3 from PyTorch in float64: after one step,
    rounding carries 44 ReLU inputs across zero; docs/consistency.md), so no float32
    implementation could be held to the trajectory's 1e-3 there. Without dropout, whose masks
    no two frameworks draw alike."""
    failures, record, result = _consistency_failures(
        "inception_v3", "tiny", execution="eager", dropout=0.0, lr=0.0045,
        tolerances=consistency.tolerances_of(consistency.cases()["inception_v3"]))
    # Forward, objective and the three-step trajectory at the tolerances. A gradient may miss
    # the element-wise tolerance by float32 noise (PyTorch against itself, weights perturbed by
    # 1e-6, misses it on most tensors of this tiny network: docs/consistency.md), never the
    # direction: each such gradient keeps a cosine above 0.9995 to the reference (CNTK's bound).
    # How many miss depends on the CPU's kernels: 3 on one machine, 251 on another, where
    # rounding carries a ReLU input across zero already at the first step.
    assert [f for f in failures if not f.startswith("grad/")] == []
    for failure in failures:
        key = failure.split(":")[0]
        assert consistency.cosine(result[key], record[key]) > 0.9995, failure
    assert record["trajectory"].shape == (3,)


# Seed 1 for the WGAN cases on every backend: at seed 0 the generator holds ReLU inputs within
# float32 rounding of zero (docs/consistency.md), and which side of zero they land on follows
# the order of float32 sums: TensorFlow's critic trajectory then moves by 1% at the third step.
WGAN_SEED = 1


def test_wgan_gp_matches_the_reference_penalty_included():
    failures, record, _ = _consistency_failures("wgan", "tiny", seed=WGAN_SEED)
    assert failures == []
    # one loss and one trajectory per objective: the generator's and the critic's
    assert {k for k in record if k.startswith(("loss", "trajectory"))} == {
        "loss/generator", "loss/critic", "trajectory/generator", "trajectory/critic"}
    assert record["trajectory/critic"].shape == (3,)


def test_original_wgan_matches_the_reference():
    failures, _, _ = _consistency_failures("wgan", "tiny_original", seed=WGAN_SEED, execution="eager")
    assert failures == []


def test_original_wgan_clips_every_critic_weight_after_its_updates():
    model = build_native("wgan", "tensorflow", config="tiny_original", execution="eager")
    model.set_weights(random_weights(model))
    model.train_step(model.synthetic_batch())
    weights = model.get_weights()
    critic = [n for n in model.trainable_names() if n.startswith("critic.")]
    assert critic and all(np.abs(weights[n]).max() <= 0.01 + 1e-7 for n in critic)
    generator = [n for n in model.trainable_names() if n.startswith("generator.")]
    assert any(np.abs(weights[n]).max() > 0.01 for n in generator)


def test_wgan_weights_round_trip_through_the_canonical_npz(tmp_path):
    model = build_native("wgan", "tensorflow", config="tiny")
    weights = random_weights(model)
    model.set_weights(weights)
    path = str(tmp_path / "wgan.npz")
    model.save_weights(path)
    other = build_native("wgan", "tensorflow", config="tiny", seed=5)
    other.load_weights(path)
    for name, value in other.get_weights().items():
        np.testing.assert_array_equal(value, weights[name], err_msg=name)
    batch = model.synthetic_batch()
    np.testing.assert_allclose(other.predict(batch), model.predict(batch), rtol=1e-6, atol=1e-6)


def test_wgan_predicts_images_from_noise_alone():
    model = build_native("wgan", "tensorflow", config="tiny")
    noise = model.synthetic_batch()["noise"][:3]
    images = model.predict({"noise": noise})
    assert images.shape == (3, 3, 64, 64)
    assert np.abs(images).max() <= 1.0


def test_a_wgan_batch_without_noise_is_refused_by_name():
    model = build_native("wgan", "tensorflow", config="tiny")
    batch = OrderedDict((k, v) for k, v in model.synthetic_batch().items() if k != "noise")
    with pytest.raises(ValueError, match="'noise'"):
        model.train_step(batch)
    with pytest.raises(ValueError, match="'noise'"):
        model.predict(batch)


@pytest.mark.parametrize("spec, clip, rates", [
    ({"kind": "rmsprop", "lr": 0.1, "alpha": 0.9, "eps": 1.0, "momentum": 0.9, "centered": False,
      "weight_decay": 0.01}, {"kind": "global_norm", "value": 2.0}, (0.1, 0.1, 0.1)),
    ({"kind": "rmsprop", "lr": 0.01, "alpha": 0.8, "eps": 1e-3, "momentum": 0.5, "centered": True,
      "weight_decay": 0.0}, {"kind": "value", "value": 1.0}, (0.01, 0.005, 0.01)),
], ids=["global_norm_clipping_and_weight_decay", "centred_and_element_wise_clipping"])
def test_rmsprop_and_clipping_follow_the_documented_formula(spec, clip, rates):
    """One variable, three steps, against the float64 reference of docs/optimizers.md: eps
    inside the root, lr inside the momentum buffer, clipping before the coupled weight decay."""
    import tensorflow as tf

    from tbdzoo.backends.tensorflow import optimizers
    from tbdzoo.reference.optimizers import trajectory as reference_trajectory
    start, grads = [1.0, -2.0, 3.0], ([3.0, 4.0, 0.0], [1.0, 1.0, 1.0], [-2.0, 0.0, 5.0])
    w = tf.Variable(start)
    opt = optimizers.make_group([w], spec)
    expected = reference_trajectory(spec, start, grads, rates, clip)
    for grad, lr, weight in zip(grads, rates, expected):
        opt.apply(optimizers.clip_gradients([tf.constant(grad)], clip), tf.constant(lr))
        np.testing.assert_allclose(w.numpy(), weight, rtol=1e-5)
