"""The spec graph as a ``keras.Model`` computing images in NHWC, and the backend's Model class.

Layout rule: inside the native model every image activation (a rank-4 batch of (C, H, W)
examples) is NHWC and every conv kernel HWIO, because TensorFlow's CPU kernels are NHWC. The
native model's inputs and image outputs are therefore NHWC; ``Model`` converts canonical NumPy
batches once per prepared batch, and weights and gradients on the way in and out.
"""
import functools
from collections import OrderedDict

import keras
import numpy as np
import tensorflow as tf

from ..base import BackendModel
from . import ops, optimizers

NHWC, CANONICAL = "nhwc", "canonical"

# hparams["execution"] -> how the steps run. 'default' is TensorFlow's idiom, a tf.function
# graph run by the executor with oneDNN kernels; 'compiled' adds XLA (jit_compile=True), which
# was 1.8x slower for the ResNet-50 train step and 4-7% slower for the Transformer on this CPU
# (paper configs, batch 8); 'eager' runs op by op. The graph walk has no tensor-dependent
# Python control flow, so AutoGraph's source rewriting is switched off.
EXECUTION = {"default": {"jit_compile": False, "autograph": False},
             "compiled": {"jit_compile": True, "autograph": False}, "eager": None}


# -- pure NumPy layout conversions ----------------------------------------------------------------
def nchw_to_nhwc(x):
    return np.ascontiguousarray(np.transpose(x, (0, 2, 3, 1)))


def nhwc_to_nchw(x):
    return np.ascontiguousarray(np.transpose(x, (0, 3, 1, 2)))


def oihw_to_hwio(w):
    return np.ascontiguousarray(np.transpose(w, (2, 3, 1, 0)))


def hwio_to_oihw(w):
    return np.ascontiguousarray(np.transpose(w, (3, 2, 0, 1)))


def _is_image_input(inp):
    return inp.role == "feature" and inp.dtype == "float32" and len(inp.shape) == 3


# -- the native model ---------------------------------------------------------------------------
class SpecModel(keras.Model):
    """Walks the spec graph node by node in ``call``; holds one Keras variable per canonical
    parameter (tied parameters appear once). Image inputs and outputs are NHWC.

    ``call(inputs, training=False)`` takes a dict of the graph's feature inputs and returns the
    output node; running statistics move only when ``training`` (or ``update_stats``) is set.
    """

    def __init__(self, graph, weights):
        super(SpecModel, self).__init__(name=graph.name.replace("/", "_"))
        self.graph = graph
        self.conv_kernels = set(conv_kernel_names(graph))
        self.image_inputs = set(i.name for i in graph.inputs.values() if _is_image_input(i))
        self.layouts = value_layouts(graph)
        variables = OrderedDict()
        for name, spec in graph.params().items():
            value = self.to_internal(name, weights[name])
            variables[name] = self.add_weight(
                shape=value.shape, dtype="float32", trainable=spec.trainable, name=name,
                initializer=lambda shape, dtype, value=value: tf.constant(value, dtype))
        self._params = variables
        self.built = True

    # parameters in the native layout
    def to_internal(self, name, value):
        value = np.asarray(value, np.float32)
        return oihw_to_hwio(value) if name in self.conv_kernels else value

    def to_canonical(self, name, value):
        value = np.asarray(value, np.float32)
        return hwio_to_oihw(value) if name in self.conv_kernels else value

    def variable(self, name):
        """The tf.Variable behind a canonical parameter name."""
        return self._params[name].value

    # the graph
    def call(self, inputs, training=False, update_stats=None):
        """The output node (NHWC when it is an image: see ``self.layouts``)."""
        return self.forward(inputs, training, update_stats)[self.graph.output][0]

    def forward(self, inputs, training, update_stats=None):
        """Every node's (tensor, layout); ``update_stats`` defaults to ``training``."""
        update = bool(training) if update_stats is None else update_stats
        values = OrderedDict()
        for inp in self.graph.feature_inputs():
            values[inp.name] = (inputs[inp.name], self.layouts[inp.name])
        for node in self.graph.nodes.values():
            params = OrderedDict((s, self.variable(n))
                                 for s, n in self.graph.param_names(node).items())
            args = [values[i] for i in node.inputs]
            tensor = _RUN[node.op](args, params, node.attrs, bool(training), update)
            values[node.name] = (tensor, self.layouts[node.name])
        return values


# -- layouts: which nodes hold NHWC tensors inside SpecModel ---------------------------------------
_NHWC_OPS = ("conv2d", "maxpool2d", "avgpool2d")
_PASS_THROUGH_OPS = ("relu", "dropout", "add")


def value_layouts(graph):
    """Name -> layout of every input and node inside SpecModel, decided statically: image ops
    produce NHWC, element-wise ops keep their input's layout, everything else is canonical."""
    layouts = OrderedDict((i.name, NHWC if _is_image_input(i) else CANONICAL)
                          for i in graph.inputs.values())
    for node in graph.nodes.values():
        ins = [layouts[i] for i in node.inputs]
        if node.op in _NHWC_OPS or (node.op == "batchnorm" and len(node.shape) == 3):
            layouts[node.name] = NHWC
        elif node.op in _PASS_THROUGH_OPS and NHWC in ins:
            layouts[node.name] = NHWC
        else:
            layouts[node.name] = CANONICAL
    return layouts


def _to(value, layout):
    """Convert a (tensor, layout) pair to ``layout`` (only rank-4 tensors differ)."""
    tensor, current = value
    if current == layout or tensor.shape.rank != 4:
        return tensor
    return tf.transpose(tensor, (0, 2, 3, 1) if layout == NHWC else (0, 3, 1, 2))


# -- per-op adapters: put inputs into the layout the op computes in -------------------------------
def _conv2d(args, p, a, training, update):
    return ops.conv2d(_to(args[0], NHWC), p["weight"], p.get("bias"), a)


def _batchnorm(args, p, a, training, update):
    stats = (p["gamma"], p["beta"], p["running_mean"], p["running_var"], a, training, update)
    tensor = args[0][0]
    if tensor.shape.rank == 4:
        return ops.batchnorm(_to(args[0], NHWC), *stats)
    # channels are canonical axis 1: move them last and fold the rest into one spatial axis
    rank = tensor.shape.rank
    moved = tf.transpose(tensor, [0] + list(range(2, rank)) + [1]) if rank > 2 else tensor
    shape = tf.shape(moved)
    y = ops.batchnorm(tf.reshape(moved, [shape[0], 1, -1, int(tensor.shape[1])]), *stats)
    y = tf.reshape(y, shape)
    return tf.transpose(y, [0, rank - 1] + list(range(1, rank - 1))) if rank > 2 else y


def _maxpool2d(args, p, a, training, update):
    return ops.maxpool2d(_to(args[0], NHWC), a)


def _avgpool2d(args, p, a, training, update):
    return ops.avgpool2d(_to(args[0], NHWC), a)


def _global_avgpool(args, p, a, training, update):
    return ops.global_avgpool(_to(args[0], NHWC))


def _relu(args, p, a, training, update):
    return ops.relu(args[0][0])


def _dropout(args, p, a, training, update):
    return ops.dropout(args[0][0], a, training)


def _add(args, p, a, training, update):
    layout = NHWC if any(l == NHWC for _, l in args) else CANONICAL
    return ops.add([_to(v, layout) for v in args])


def _flatten(args, p, a, training, update):
    return ops.flatten(_to(args[0], CANONICAL))


def _dense(args, p, a, training, update):
    return ops.dense(_to(args[0], CANONICAL), p["weight"], p.get("bias"))


def _embedding(args, p, a, training, update):
    return ops.embedding(args[0][0], p["weight"], a)


def _positional_encoding(args, p, a, training, update):
    return ops.positional_encoding(_to(args[0], CANONICAL))


def _layernorm(args, p, a, training, update):
    return ops.layernorm(_to(args[0], CANONICAL), p["gamma"], p["beta"], a)


def _multi_head_attention(args, p, a, training, update):
    q, kv, keys = [_to(v, CANONICAL) for v in args]
    return ops.multi_head_attention(q, kv, keys, p, a, training)


_RUN = {
    "conv2d": _conv2d, "batchnorm": _batchnorm, "relu": _relu, "add": _add,
    "maxpool2d": _maxpool2d, "avgpool2d": _avgpool2d, "global_avgpool": _global_avgpool,
    "flatten": _flatten, "dense": _dense, "embedding": _embedding,
    "positional_encoding": _positional_encoding, "layernorm": _layernorm, "dropout": _dropout,
    "multi_head_attention": _multi_head_attention,
}


def conv_kernel_names(graph):
    """Canonical names of conv kernels: the parameters stored OIHW outside, HWIO inside."""
    return [name for name, spec in graph.params().items()
            if graph.nodes[spec.owner].op == "conv2d" and name == spec.owner + ".weight"]


def _compiled(fn, execution):
    """``fn`` as a tf.function (or as it is, for eager execution). The partial gives each model
    a key of its own: TensorFlow counts traces per code object, and would report several models,
    each traced once, as one function retracing too often."""
    options = EXECUTION[execution]
    return fn if options is None else tf.function(functools.partial(fn), **options)


# -- the backend ----------------------------------------------------------------------------------
class Model(BackendModel):
    backend = "tensorflow"
    OPTIONS = {"precision": ("fp32",), "execution": tuple(EXECUTION),
               "memory_format": ("auto", "channels_last")}

    def _build(self, weights):
        self.native = SpecModel(self.spec, weights)
        self._trainable = [self.native.variable(n) for n in self.trainable_names()]
        self.optimizer = optimizers.make(self._trainable, self.hparams)
        self._logits = self.spec.loss["logits"]
        self._labels = self.spec.loss["labels"]
        self._train_fn, self._grad_fn, self._predict_fn = [
            _compiled(fn, self.hparams["execution"])
            for fn in (self._train, self._gradients, self._infer)]

    # -- compiled functions ----------------------------------------------------------------
    def _loss(self, inputs, update_stats):
        values = self.native.forward(inputs, training=True, update_stats=update_stats)
        logits = _to(values[self._logits], CANONICAL)
        return ops.softmax_cross_entropy(logits, inputs[self._labels], self.spec.loss)

    def _train(self, inputs, lr):
        with tf.GradientTape() as tape:
            loss = self._loss(inputs, update_stats=True)
        grads = tape.gradient(loss, self._trainable)
        self.optimizer.apply(grads, lr)
        return loss

    def _gradients(self, inputs):
        with tf.GradientTape() as tape:
            loss = self._loss(inputs, update_stats=False)
        grads = tape.gradient(loss, self._trainable)
        return loss, [tf.convert_to_tensor(g) for g in grads]

    def _infer(self, inputs):
        out = self.native(inputs, training=False)
        return _to((out, self.native.layouts[self.spec.output]), CANONICAL)

    # -- the BackendModel contract -------------------------------------------------------------
    def _prepare(self, batch):
        """Tensors keyed by input name; image features transposed to NHWC here, once."""
        out = OrderedDict()
        for name, inp in self.spec.inputs.items():
            if inp.dtype == "int32":
                value = np.asarray(batch[name], np.int32)
            else:
                value = np.asarray(batch[name], np.float32)
                if name in self.native.image_inputs:
                    value = nchw_to_nhwc(value)
            out[name] = tf.constant(value)
        return out

    def _train_step_async(self, prepared, lr):
        """Run one step's function; returns the loss tensor without copying it to the host."""
        return self._train_fn(prepared.native, tf.constant(lr, tf.float32))

    def _train_step(self, prepared, lr):
        """One step, returned only when its update has run: on a GPU the kernels a step
        launches may still be running when its function returns."""
        loss = self._train_step_async(prepared, lr)
        self.synchronize()
        return loss.numpy()

    def synchronize(self):
        """Wait for every device's queued kernels and TensorFlow's own queue of pending ops."""
        tf.test.experimental.sync_devices()

    def _predict(self, prepared):
        return self._predict_fn(prepared.native).numpy()

    def _loss_and_gradients(self, prepared):
        loss, grads = self._grad_fn(prepared.native)
        names = self.trainable_names()
        return float(loss), OrderedDict(
            (n, self.native.to_canonical(n, g.numpy())) for n, g in zip(names, grads))

    def _get_weights(self):
        return OrderedDict((n, self.native.to_canonical(n, self.native.variable(n).numpy()))
                           for n in self.spec.params())

    def _set_weights(self, weights):
        for n, value in weights.items():
            self.native.variable(n).assign(self.native.to_internal(n, value))

    # -- measuring -------------------------------------------------------------------------
    def measure_memory(self, prepared):
        """Weights (every variable of the model's state, running statistics included) and the
        optimizer's slot variables, read off the variables themselves. Gradients live only
        inside a step here, so they stay analytic."""
        def size(v):
            return v.shape.num_elements() * v.dtype.size
        slots = [v for name in ("buffers", "m", "v") for v in getattr(self.optimizer, name, None) or []]
        return {"weights": sum(size(self.native.variable(n)) for n in self.spec.params()),
                "optimizer_state": sum(size(v) for v in slots)}
