"""TensorFlow backend specifics: the native keras.Model, NHWC layouts at the boundary, weights,
running statistics, the compiled step and the normalized optimizers, checked against NumPy
(cross-framework checks live in the consistency tests). Tiny configs only; skipped where this
interpreter has no tensorflow."""

import numpy as np
import pytest

from conftest import random_weights, require_framework

require_framework("tensorflow")

import tbdzoo.backends.tensorflow.framework  # noqa: F401  (sets the TF log level before the import)

# isort: split
import keras
import tensorflow as tf

from tbdzoo.backends.registry import build_native
from tbdzoo.backends.tensorflow import model as tf_model
from tbdzoo.backends.tensorflow import optimizers
from tbdzoo.models.registry import ModelDef
from tbdzoo.reference.optimizers import trajectory as reference_trajectory
from tbdzoo.spec import Graph


def _model(name, **overrides):
    return build_native(name, "tensorflow", config="tiny", **overrides)


def test_native_is_a_keras_model_with_one_variable_per_parameter():
    model = _model("transformer", dropout=0.0)
    assert isinstance(model.native, keras.Model)
    params = model.spec.params()
    paths = [model.net.keras_path(n) for n in params]
    assert sorted(v.path for v in model.native.weights) == sorted(paths)  # tied: stored once
    assert model.net.keras_path("embed.weight") == "embed/embeddings"
    trainable = [model.net.keras_path(n) for n, p in params.items() if p.trainable]
    assert sorted(v.path for v in model.native.trainable_weights) == sorted(trainable)


@pytest.mark.parametrize("name,overrides", [("resnet50", {}), ("transformer", {"dropout": 0.0})])
def test_call_in_inference_equals_predict(name, overrides):
    model = _model(name, **overrides)
    model.set_weights(random_weights(model))
    batch = model.synthetic_batch()
    prepared = model.prepare_batch(batch)
    names = [t.name for t in model.native.inputs]  # a single input is a plain tensor
    x = {n: prepared.native[n] for n in names} if len(names) > 1 else prepared.native[names[0]]
    native = model.native(x, training=False).numpy()  # eager, layer by layer
    # predict runs the same call in a tf.function, where grappler fuses ops for oneDNN: the
    # results agree to rounding, not bit for bit
    np.testing.assert_allclose(model.predict(batch), native, rtol=1e-5, atol=1e-5)
    assert native.shape == (len(batch["labels"]),) + model.spec.nodes[model.spec.output].shape


def test_layout_conversions_round_trip():
    rng = np.random.RandomState(0)
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    np.testing.assert_array_equal(tf_model.nhwc_to_nchw(tf_model.nchw_to_nhwc(x)), x)
    assert tf_model.nchw_to_nhwc(x)[1, 4, 6, 2] == x[1, 2, 4, 6]
    w = rng.standard_normal((4, 3, 2, 5)).astype(np.float32)  # O, I, kh, kw
    assert tf_model.oihw_to_hwio(w).shape == (2, 5, 3, 4)
    assert tf_model.oihw_to_hwio(w)[1, 4, 2, 3] == w[3, 2, 1, 4]
    np.testing.assert_array_equal(tf_model.hwio_to_oihw(tf_model.oihw_to_hwio(w)), w)


def test_images_are_nhwc_inside_and_kernels_hwio():
    model = _model("probe/conv2d")
    batch = model.synthetic_batch()
    inside = model.prepare_batch(batch).native["x"].numpy()
    np.testing.assert_array_equal(inside, np.transpose(batch["x"], (0, 2, 3, 1)))
    kernel = model.get_weights()["conv.weight"]
    np.testing.assert_array_equal(model.native.get_layer("conv").kernel.numpy(),
                                  np.transpose(kernel, (2, 3, 1, 0)))


def _conv_output_model():
    """A graph whose output is an image (N, C, H, W): predict must hand it back as NCHW."""
    def build(hp):
        g = Graph("conv_output")
        x = g.input("x", (2, 5, 6))
        y = g.add("conv", "conv2d", x, filters=3, kernel=3, padding=((1, 0), (2, 1)), use_bias=True)
        g.input("labels", (3, 4), dtype="int32", role="target")
        g.set_output(y)
        g.set_loss("softmax_cross_entropy", logits=y, labels="labels", label_smoothing=0.0,
                   ignore_index=None)
        return g

    def batch(hp, batch_size, seed):
        rng = np.random.RandomState(seed)
        return {"x": rng.standard_normal((batch_size, 2, 5, 6)).astype(np.float32),
                "labels": rng.randint(0, 5, size=(batch_size, 3, 4)).astype(np.int32)}

    hp = {"optimizer": "sgd", "lr": 0.1, "momentum": 0.0, "nesterov": False, "weight_decay": 0.0,
          "lr_schedule": "constant", "batch_size": 2}
    definition = ModelDef("conv_output", "test", {"tiny": hp}, build, batch, "examples/s",
                          lambda hp, b: len(b["x"]))
    return tf_model.Model(definition, definition.hparams("tiny"))


def test_an_image_output_comes_back_in_canonical_layout_with_asymmetric_pads():
    model = _conv_output_model()
    batch = model.synthetic_batch()
    w, b = model.get_weights()["conv.weight"], model.get_weights()["conv.bias"]
    x = np.pad(batch["x"], ((0, 0), (0, 0), (1, 0), (2, 1)))
    expected = np.zeros((2, 3, 4, 7), np.float64)  # H: 5 + 1 - 3 + 1, W: 6 + 3 - 3 + 1
    for i in range(4):
        for j in range(7):
            expected[:, :, i, j] = np.einsum("ncij,ocij->no", x[:, :, i:i + 3, j:j + 3], w) + b
    np.testing.assert_allclose(model.predict(batch), expected, rtol=1e-5, atol=1e-5)


def test_a_changing_learning_rate_does_not_retrace_the_step():
    model = _model("transformer", dropout=0.0)  # inverse_sqrt: a new rate every step
    batch = model.prepare_batch(model.synthetic_batch())
    rates = []
    for _ in range(3):
        rates.append(model.learning_rate())
        model.train_step(batch)
    assert len(set(rates)) == 3
    assert model._train_fn.experimental_get_tracing_count() == 1


def test_the_native_model_trains_in_a_plain_keras_loop():
    """What a user importing ``.native`` does: a Keras loss and optimizer on NHWC images."""
    model = _model("resnet50")
    batch = model.synthetic_batch()
    before = model.get_weights()
    net = model.native
    images = tf.constant(np.transpose(batch["images"], (0, 2, 3, 1)))
    optimizer = keras.optimizers.SGD(0.1)
    with tf.GradientTape() as tape:
        logits = net(images, training=True)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(batch["labels"], logits)
    grads = tape.gradient(loss, net.trainable_weights)
    optimizer.apply_gradients(zip(grads, net.trainable_weights))
    after = model.get_weights()
    assert not np.array_equal(after["conv1.weight"], before["conv1.weight"])
    assert not np.array_equal(after["bn1.running_mean"], before["bn1.running_mean"])


def _run_optimizer(hp, value, grads, rates):
    w = tf.Variable(value)
    opt = optimizers.make([w], hp)
    for g, lr in zip(grads, rates):
        opt.apply([tf.constant(g)], tf.constant(lr, tf.float32))
    return w.numpy()


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_is_the_normalized_formula(nesterov):
    hp = {"optimizer": "sgd", "momentum": 0.9, "nesterov": nesterov, "weight_decay": 0.01}
    rng = np.random.RandomState(1)
    w = rng.standard_normal(6).astype(np.float32)
    grads = [rng.standard_normal(6).astype(np.float32) for _ in range(3)]
    rates = [0.1, 0.05, 0.02]
    expected = reference_trajectory(hp, w, grads, rates)[-1]
    np.testing.assert_allclose(_run_optimizer(hp, w, grads, rates), expected, rtol=1e-5, atol=1e-6)


def test_adam_is_the_normalized_formula():
    hp = {"optimizer": "adam", "beta1": 0.9, "beta2": 0.98, "eps": 1e-6, "weight_decay": 0.01}
    rng = np.random.RandomState(2)
    w = rng.standard_normal(6).astype(np.float32)
    grads = [rng.standard_normal(6).astype(np.float32) * 1e-3 for _ in range(3)]
    rates = [1e-2, 2e-2, 3e-2]
    expected = reference_trajectory(hp, w, grads, rates)[-1]
    np.testing.assert_allclose(_run_optimizer(hp, w, grads, rates), expected, rtol=1e-5, atol=1e-6)
