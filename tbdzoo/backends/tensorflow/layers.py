"""The Keras layers the native models are built from where ``keras.layers`` has none of the
spec's semantics; each is registered as ``tbdzoo>ClassName``, so ``keras.models.load_model``
rebuilds a saved model once tbdzoo.backends.tensorflow has been imported.

- ``BatchNormalization``: Keras' own layer (its weights ``gamma``, ``beta``, ``moving_mean``,
  ``moving_variance``; ``trainable = False`` freezes it into inference mode), computing with
  TensorFlow's fused kernel and moving the running variance by the *unbiased* batch variance,
  as PyTorch and the spec do (Keras' own moves it by the biased one).
- ``Conv2D``: Keras' own layer for padding that neither 'same' nor 'valid' gives (PyTorch's
  symmetric padding on a stride-2 convolution), handed to the kernel as explicit paddings.
- ``ScaledEmbedding``: Keras' Embedding times a constant, whose table can also be read in
  reverse (``layer(x, reverse=True)``: ``x @ embeddings^T``), the tied output projection of
  a Transformer.
- One layer per remaining op (``MultiHeadAttention``, ``StackedLSTM``, ``RoIAlign``, ...):
  ``SpecOpLayer`` subclasses holding the op's parameters under their canonical suffixes and
  running the op's adapter (adapters.py).

Every custom layer reads ``update_stats`` (default True: a training call moves running
statistics) and ``adapter`` (the function computing it; data-parallel training swaps in the
synchronised BatchNorm) from its instance; neither is part of its configuration.
"""
from . import framework  # noqa: F401  (first: TensorFlow imported as the backend needs it)

# isort: split
import keras
import tensorflow as tf

from ...spec.ops import conv_out
from . import adapters, ops
from .adapters import CANONICAL, NHWC

PACKAGE = "tbdzoo"


def _register(cls):
    return keras.saving.register_keras_serializable(package=PACKAGE, name=cls.__name__)(cls)


def jsonable(value):
    """Attributes as JSON values (tuples become lists)."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def tupled(value):
    """JSON values back as the spec's attributes (lists become tuples)."""
    if isinstance(value, dict):
        return {k: tupled(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(tupled(v) for v in value)
    return value


def _layout_of(tensor):
    """The layout a BatchNormalization input arrives in: images NHWC, anything else canonical."""
    return NHWC if tensor.shape.rank == 4 else CANONICAL


@_register
class BatchNormalization(keras.layers.BatchNormalization):
    """Keras' BatchNormalization with the spec's statistics (see the module docstring).
    ``momentum`` is Keras' (the running statistics keep that fraction of themselves at each
    step: one minus PyTorch's momentum); without ``track_running_stats`` there are no running
    statistics and the batch's own normalise in inference too."""

    def __init__(self, axis=-1, momentum=0.9, epsilon=1e-5, track_running_stats=True, **kwargs):
        super().__init__(axis=axis, momentum=momentum, epsilon=epsilon, **kwargs)
        self.track_running_stats = track_running_stats
        self.update_stats = True
        self.adapter = adapters.batchnorm_adapter(True)

    def build(self, input_shape):
        channels = int(input_shape[self.axis])
        self.gamma = self.add_weight(shape=(channels,), name="gamma", initializer="ones")
        self.beta = self.add_weight(shape=(channels,), name="beta", initializer="zeros")
        self.moving_mean = self.moving_variance = None
        if self.track_running_stats:
            self.moving_mean = self.add_weight(shape=(channels,), name="moving_mean",
                                               initializer="zeros", trainable=False)
            self.moving_variance = self.add_weight(shape=(channels,), name="moving_variance",
                                                   initializer="ones", trainable=False)

    def call(self, inputs, training=None, mask=None):
        training = bool(training) and self.trainable
        params = {"gamma": self.gamma.value, "beta": self.beta.value}
        if self.track_running_stats:
            params.update(running_mean=self.moving_mean.value,
                          running_var=self.moving_variance.value)
        attrs = {"eps": self.epsilon, "momentum": 1.0 - self.momentum}
        return self.adapter([(inputs, _layout_of(inputs))], params, attrs, training,
                            training and self.update_stats)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config["track_running_stats"] = self.track_running_stats
        return config


@_register
class Conv2D(keras.layers.Conv2D):
    """Keras' Conv2D with ``explicit_padding`` ((top, bottom), (left, right)); its
    ``padding`` stays 'valid'. Also runs dilated and grouped convolutions, which TensorFlow's
    CPU kernels lack (ops.conv2d)."""

    def __init__(self, *args, explicit_padding=((0, 0), (0, 0)), **kwargs):
        kwargs["padding"] = "valid"
        super().__init__(*args, **kwargs)
        self.explicit_padding = tupled(jsonable(explicit_padding))

    def _attrs(self):
        return {"stride": tuple(self.strides), "padding": self.explicit_padding,
                "dilation": tuple(self.dilation_rate), "groups": self.groups,
                "kernel": tuple(self.kernel_size)}

    def call(self, inputs):
        bias = self.bias if self.use_bias else None
        return ops.conv2d(inputs, self.kernel, bias, self._attrs())

    def compute_output_shape(self, input_shape):
        a = self._attrs()
        hw = [None if input_shape[i + 1] is None else
              conv_out(input_shape[i + 1], a["kernel"][i], a["stride"][i], a["padding"][i],
                       a["dilation"][i]) for i in range(2)]
        return (input_shape[0], hw[0], hw[1], self.filters)

    def get_config(self):
        config = super().get_config()
        config["explicit_padding"] = jsonable(self.explicit_padding)
        return config


@_register
class ScaledEmbedding(keras.layers.Embedding):
    """Keras' Embedding times ``scale``; ``layer(x, reverse=True)`` multiplies features x by
    the transposed table instead, giving one logit per row (a tied output projection)."""

    def __init__(self, input_dim, output_dim, scale=1.0, **kwargs):
        super().__init__(input_dim, output_dim, **kwargs)
        self.scale = float(scale)

    def call(self, inputs, reverse=False):
        if reverse:
            return ops.dense(inputs, self.embeddings, None)
        return ops.embedding(tf.cast(inputs, tf.int32), self.embeddings, {"scale": self.scale})

    def compute_output_spec(self, inputs, reverse=False):
        if reverse:
            return keras.KerasTensor(tuple(inputs.shape[:-1]) + (self.input_dim,), "float32")
        return keras.KerasTensor(tuple(inputs.shape) + (self.output_dim,), "float32")

    def get_config(self):
        config = super().get_config()
        config["scale"] = self.scale
        return config


class _Untracked:
    """A holder Keras does not look into (a layer's reference to another layer's weights)."""

    def __init__(self, value):
        self.value = value


class SpecOpLayer(keras.layers.Layer):
    """One spec op as a layer: ``attrs`` its attributes, ``layouts`` the layout each input
    arrives in, ``params`` suffix -> [shape, trainable] of the parameters it holds (in the
    canonical layout, named by their canonical suffix). Called with the list of its inputs.

    ``tied`` (suffix -> function giving a tensor) are parameters it reads from another layer
    (a gradient penalty's input gradient reads its convolution's kernel). They are no part of
    its configuration, so a model holding such a layer does not round-trip through a file."""

    OP = None

    def __init__(self, attrs=None, layouts=(), params=None, tied=None, **kwargs):
        super().__init__(**kwargs)
        self._tied = _Untracked(dict(tied or {}))
        self.attrs = tupled(jsonable(attrs or {}))
        self.layouts = list(layouts)
        self.params = {s: [list(shape), bool(trainable)]
                       for s, (shape, trainable) in (params or {}).items()}
        self.spec_weights = {}
        self.update_stats = True
        self.adapter = adapters.RUN[self.OP]

    def build(self, input_shape=None):
        for suffix, (shape, trainable) in self.params.items():
            self.spec_weights[suffix] = self.add_weight(
                shape=tuple(shape), name=suffix, initializer="zeros", trainable=trainable)

    def call(self, inputs, training=False):
        inputs = inputs if isinstance(inputs, (list, tuple)) else [inputs]
        params = {s: v.value for s, v in self.spec_weights.items()}
        params.update((s, read()) for s, read in self._tied.value.items())
        return self.adapter(list(zip(inputs, self.layouts)), params, self.attrs,
                            bool(training), bool(training) and self.update_stats)

    def get_config(self):
        config = super().get_config()
        config.update(attrs=jsonable(self.attrs), layouts=list(self.layouts),
                      params=jsonable(self.params))
        return config


# op -> class name of its layer, for the ops Keras has no layer of
SPEC_OP_CLASSES = {
    "multi_head_attention": "MultiHeadAttention", "positional_encoding": "PositionalEncoding",
    "lstm": "StackedLSTM", "gru": "StackedGRU", "additive_attention": "AdditiveAttention",
    "sequence_batchnorm": "SequenceBatchNormalization", "clipped_relu": "ClippedReLU",
    "lengths_after_conv": "LengthsAfterConv", "roi_align": "RoIAlign", "to_batch": "ToBatch",
    "frozen_batchnorm": "FrozenBatchNormalization", "scale": "Scale", "lerp": "Lerp",
    "ones_like": "OnesLike", "stop_gradient": "StopGradient",
    "channel_layernorm": "ChannelLayerNormalization", "maxpool2d": "PaddedMaxPooling2D",
    "avgpool2d": "PaddedAveragePooling2D", "conv2d_input_grad": "Conv2DInputGradient",
    "dense_input_grad": "DenseInputGradient", "relu_grad": "ReLUGradient",
    "channel_layernorm_input_grad": "ChannelLayerNormalizationInputGradient",
    "transpose": "Transpose", "flatten": "SpecFlatten", "dense": "SpecDense",
    "embedding": "SpecEmbedding", "layernorm": "SpecLayerNormalization",
    "global_avgpool": "SpecGlobalAveragePooling", "concat": "SpecConcatenate", "add": "SpecAdd",
    "relu": "SpecReLU", "dropout": "SpecDropout", "tanh": "SpecTanh", "reshape": "SpecReshape",
    "upsample_nearest": "SpecUpSampling2D", "conv2d": "SpecConv2D", "batchnorm": "SpecBatchNorm",
}


def _spec_op_class(op, name):
    cls = type(name, (SpecOpLayer,), {
        "OP": op, "__module__": __name__,
        "__doc__": "The spec's ``{}`` op as a layer (see SpecOpLayer).".format(op)})
    return _register(cls)


SPEC_OP_LAYERS = {op: _spec_op_class(op, name) for op, name in SPEC_OP_CLASSES.items()}
globals().update((cls.__name__, cls) for cls in SPEC_OP_LAYERS.values())


@keras.saving.register_keras_serializable(package=PACKAGE, name="SpecCrossEntropy")
class SpecCrossEntropy(keras.losses.Loss):
    """The spec's softmax cross-entropy on logits and integer labels: label smoothing
    (q = (1 - eps) onehot + eps / K) and, with ``ignore_index``, the mean over the positions
    whose label is not that id (Keras' losses have one or the other, not both)."""

    def __init__(self, label_smoothing=0.0, ignore_index=None, name="spec_cross_entropy",
                 **kwargs):
        super().__init__(name=name, **kwargs)
        self.label_smoothing, self.ignore_index = float(label_smoothing), ignore_index

    def call(self, y_true, y_pred):
        return ops.softmax_cross_entropy(y_pred, y_true, {
            "label_smoothing": self.label_smoothing, "ignore_index": self.ignore_index})

    def get_config(self):
        config = super().get_config()
        config.update(label_smoothing=self.label_smoothing, ignore_index=self.ignore_index)
        return config
