"""The TensorFlow backend's native object is a functional keras.Model of Keras layers: what a
Keras user does with it works on every model (tiny configs): the summary lists the layers, an
inner layer's output is reachable as a sub-model, a new head changes the output, the .keras
file round-trips, a SavedModel serves the same outputs, ``fit`` trains it, and the model the
backend's own training step trains is this one."""
import os

import numpy as np
import pytest

from conftest import require_framework

require_framework("tensorflow")

import tbdzoo.backends.tensorflow.framework  # noqa: F401  (sets the TF log level before the import)

# isort: split
import keras
import tensorflow as tf

from tbdzoo.backends.registry import build_native
from tbdzoo.backends.tensorflow import layers as tbd_layers
from tbdzoo.models import list_models

MODELS = list_models()
# Overrides that keep each model's run short and deterministic (no dropout masks).
OVERRIDES = {"transformer": {"dropout": 0.0}, "inception_v3": {"dropout": 0.0}}
_built = {}


def _model(name):
    if name not in _built:
        _built[name] = build_native(name, "tensorflow", config="tiny", **OVERRIDES.get(name, {}))
    return _built[name]


def native_inputs(model, batch, net=None):
    """The inputs ``net`` (default: the native model) takes, from a canonical batch (and the
    targets step's outputs, Faster R-CNN's sampled RoIs): images NHWC, everything else as it
    is; a plain tensor where it takes one input."""
    net = net or model.native
    names = [t.name for t in net.inputs]
    batch = full_batch(model, batch)
    values = {}
    for name in names:
        value = np.asarray(batch[name])
        if name in model.net.image_inputs:
            value = np.transpose(value, (0, 2, 3, 1))
        values[name] = tf.constant(value)
    return values[names[0]] if len(names) == 1 else values


def full_batch(model, batch):
    """``batch`` with the inputs its targets step writes, where the model has one."""
    program = model.program
    if program is None or program.targets_step is None or \
            all(name in batch for name in program.written_inputs()):
        return batch
    return dict(batch, **model.step_targets(batch))


def canonical(model, name, value):
    """A node's value as ``values()`` gives it (images back to NCHW)."""
    value = np.asarray(value)
    return np.transpose(value, (0, 3, 1, 2)) if model.net.layouts[name] == "nhwc" else value


def _own_layers(net):
    return [layer for layer in net.layers if not isinstance(layer, keras.layers.InputLayer)]


@pytest.mark.parametrize("name", MODELS)
def test_the_native_model_is_made_of_keras_layers_named_by_the_spec(name):
    model = _model(name)
    net = model.native
    assert isinstance(net, keras.Model)  # functional: no class of ours to import before loading
    assert type(net).__module__.startswith("keras.")
    own = _own_layers(net)
    assert own and all(isinstance(layer, keras.layers.Layer) for layer in own)
    lines = []
    net.summary(print_fn=lambda line, **_: lines.append(line), line_length=200)
    text = "\n".join(lines)
    for layer in own[:5] + own[-3:]:
        assert layer.name in text
    # every parameter of the spec is a variable of one of its layers, named by the node
    for param, spec in model.spec.params().items():
        path = model.net.keras_path(param)
        assert path.split("/")[0] == spec.owner.replace("@", "-")
    # Keras' own classes where Keras has the op
    by_op = {"conv2d": keras.layers.Conv2D, "batchnorm": keras.layers.BatchNormalization,
             "dense": keras.layers.Dense, "embedding": keras.layers.Embedding,
             "layernorm": keras.layers.LayerNormalization, "relu": keras.layers.ReLU}
    for node in model.spec.nodes.values():
        layer = model.net.plans[node.name].layer
        if node.op in by_op and not node.attrs.get("shared") and layer is not None:
            assert isinstance(layer, by_op[node.op]), (node.name, type(layer))


@pytest.mark.parametrize("name", MODELS)
def test_calling_the_native_model_gives_the_output_and_an_inner_layer_is_reachable(name):
    model = _model(name)
    net = model.native
    batch = full_batch(model, model.synthetic_batch(batch_size=2))
    out = net(native_inputs(model, batch), training=False)
    output = model.spec.output  # what predict computes, before an inference hook's decoding
    np.testing.assert_allclose(canonical(model, output, out), model.values(batch, [output])[output],
                               rtol=1e-4, atol=1e-5)
    # the first parametrised node's output as a Keras sub-model, equal to values()
    inner = next(n for n in model.spec.nodes.values()
                 if model.spec.param_names(n) and model.net.plans[n.name].layer is not None
                 and n.name in model.net.tensors)
    features = keras.Model(net.inputs, net.get_layer(inner.name.replace("@", "-")).output)
    value = features(native_inputs(model, batch, features), training=False)
    np.testing.assert_allclose(canonical(model, inner.name, value),
                               model.values(batch, [inner.name])[inner.name], rtol=1e-4, atol=1e-5)


def _penultimate(net):
    """The input of the model's last layer (its head)."""
    return net.layers[-1].input


@pytest.mark.parametrize("name", [m for m in MODELS if m not in ("wgan", "faster_rcnn")])
def test_a_new_head_on_the_penultimate_layer_changes_the_output(name):
    model = _model(name)
    net = model.native
    features = _penultimate(net)
    if isinstance(features, (list, tuple)):
        features = keras.layers.Concatenate(name="new_features")(list(features))
    head = keras.Model(net.inputs, keras.layers.Dense(3, name="new_head")(features))
    batch = model.synthetic_batch(batch_size=2)
    out = head(native_inputs(model, batch, head))
    assert out.shape[-1] == 3 and out.shape[0] == 2
    assert out.shape != net(native_inputs(model, batch)).shape


@pytest.mark.parametrize("name", MODELS)
def test_keras_save_and_load_round_trip(name, tmp_path):
    model = _model(name)
    net = model.native
    batch = model.synthetic_batch(batch_size=2)
    path = str(tmp_path / "m.keras")
    net.save(path)
    loaded = keras.models.load_model(path)
    assert [layer.name for layer in loaded.layers] == [layer.name for layer in net.layers]
    assert [type(layer) for layer in loaded.layers] == [type(layer) for layer in net.layers]
    x = native_inputs(model, batch)
    # a program's model computes BatchNorm's statistics in two passes, the loaded one with
    # the fused kernel (layers.BatchNormalization): equal to rounding
    np.testing.assert_allclose(loaded(x, training=False), net(x, training=False),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["resnet50", "transformer"])
def test_export_writes_a_savedmodel_that_serves_the_same_outputs(name, tmp_path):
    model = _model(name)
    net = model.native
    batch = model.synthetic_batch(batch_size=2)
    path = str(tmp_path / "saved")
    net.export(path, verbose=False)
    assert os.path.exists(os.path.join(path, "saved_model.pb"))
    served = tf.saved_model.load(path)
    x = native_inputs(model, batch)
    out = served.serve(x)
    np.testing.assert_allclose(out, net(x, training=False), rtol=1e-5, atol=1e-5)


def test_fit_trains_the_backends_model_and_the_backend_trains_the_native_one():
    model = build_native("resnet50", "tensorflow", config="tiny")
    net = model.native
    batch = model.synthetic_batch(batch_size=2)
    before = model.get_weights()
    assert isinstance(net.loss, tbd_layers.SpecCrossEntropy)  # compiled with the spec's loss
    loss, _ = model.loss_and_gradients(batch)  # the backend's loss at the weights fit starts from
    history = net.fit(native_inputs(model, batch), batch["labels"], epochs=1, verbose=0)
    np.testing.assert_allclose(history.history["loss"][0], loss, rtol=1e-4)
    fitted = model.get_weights()
    assert not np.array_equal(fitted["fc.weight"], before["fc.weight"])
    # the backend's own step moves the same variables the native model reads
    kernel = net.get_layer("fc").kernel.numpy().copy()
    model.train_step(batch)
    assert not np.array_equal(net.get_layer("fc").kernel.numpy(), kernel)
    np.testing.assert_allclose(model.get_weights()["fc.weight"], net.get_layer("fc").kernel.numpy().T)


def test_replacing_a_layers_weights_natively_changes_predict():
    model = _model("resnet50")
    batch = model.synthetic_batch(batch_size=2)
    before = model.predict(batch)
    fc = model.native.get_layer("fc")
    saved = [w.numpy() for w in fc.weights]
    try:
        fc.bias.assign(fc.bias.numpy() + 1.0)
        np.testing.assert_allclose(model.predict(batch), before + 1.0, rtol=1e-5, atol=1e-5)
    finally:
        for w, value in zip(fc.weights, saved):
            w.assign(value)


def test_frozen_batchnorm_layers_keep_their_statistics_in_training_calls():
    model = build_native("resnet50", "tensorflow", config="tiny")
    net = model.native
    batch = model.synthetic_batch(batch_size=2)
    for layer in net.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.trainable = False
    before = model.get_weights()["bn1.running_mean"]
    net(native_inputs(model, batch), training=True)
    np.testing.assert_array_equal(model.get_weights()["bn1.running_mean"], before)


@pytest.mark.parametrize("name,parts", [("wgan", ["generator", "critic"]),
                                        ("faster_rcnn", ["backbone", "rpn", "roi_heads"])])
def test_programs_expose_their_parts_as_keras_models(name, parts):
    model = _model(name)
    for part in parts:
        sub = model.native_parts[part]
        assert isinstance(sub, keras.Model) and _own_layers(sub)
    if name == "wgan":
        batch = model.synthetic_batch(batch_size=2)
        generator, critic = model.native_parts["generator"], model.native_parts["critic"]
        images = generator(tf.constant(batch["noise"][:2]), training=False)
        assert tuple(images.shape[1:]) == (64, 64, 3)  # NHWC
        scores = critic(images, training=False)
        assert tuple(scores.shape) == (2, 1)
        # the critic is the one the backend trains: its layers hold the spec's parameters
        assert critic.get_layer("critic.input").kernel.value is \
            model.net.variable("critic.input.weight")


def test_custom_layers_are_registered_for_loading():
    for cls in [tbd_layers.BatchNormalization, tbd_layers.Conv2D, tbd_layers.ScaledEmbedding] + \
            list(tbd_layers.SPEC_OP_LAYERS.values()):
        registered = keras.saving.get_registered_name(cls)
        assert registered == "tbdzoo>" + cls.__name__
        assert keras.saving.get_registered_object(registered) is cls


def test_fit_takes_named_inputs_and_the_specs_loss_with_ignored_positions():
    model = _model("transformer")
    net = model.native
    batch = model.synthetic_batch(batch_size=2)
    loss, _ = model.loss_and_gradients(batch)  # label smoothing, padding positions ignored
    saved = model.get_weights()
    try:
        history = net.fit(native_inputs(model, batch), batch["labels"], epochs=1, verbose=0)
        np.testing.assert_allclose(history.history["loss"][0], loss, rtol=1e-4)
    finally:
        model.set_weights(saved)


_LOAD_ALONE = """
import sys
import numpy as np
import tbdzoo.backends.tensorflow.layers  # registers the tbdzoo> layers, builds no model
import keras
net = keras.models.load_model(sys.argv[1], compile=False)
x = np.load(sys.argv[2])
np.save(sys.argv[3], keras.ops.convert_to_numpy(net(x, training=False)))
"""


def test_a_saved_model_loads_in_a_process_that_imports_only_the_layers(tmp_path):
    import subprocess
    import sys
    model = _model("resnet50")
    batch = model.synthetic_batch(batch_size=2)
    x = native_inputs(model, batch).numpy()
    paths = [str(tmp_path / n) for n in ("m.keras", "x.npy", "y.npy")]
    model.native.save(paths[0])
    np.save(paths[1], x)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", _LOAD_ALONE] + paths, capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    np.testing.assert_allclose(np.load(paths[2]), model.native(x, training=False),
                               rtol=1e-6, atol=1e-6)
