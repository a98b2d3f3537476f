"""The spec's ops on (tensor, layout) pairs: each adapter puts its inputs into the layout its op
computes in (ops.py) and returns the op's output in the layout ``value_layouts`` gives it.

Layout rule: inside the native model every image activation (a rank-4 batch of (C, H, W)
examples) is NHWC and every conv kernel HWIO, because TensorFlow's CPU kernels are NHWC; other
values keep the canonical layout. The native model's layers (layers.py) run these adapters
where Keras has no layer of the op's semantics, and the training step runs them for the nodes
that are no layer of the model (a gradient penalty's input gradients).
"""
from . import framework  # noqa: F401  (first: TensorFlow imported as the backend needs it)

# isort: split
import functools
from collections import OrderedDict

import tensorflow as tf

from . import ops

NHWC, CANONICAL = "nhwc", "canonical"


def is_image_input(inp):
    return inp.role == "feature" and inp.dtype == "float32" and len(inp.shape) == 3


# -- layouts: which nodes hold NHWC tensors inside the native model ---------------------------------------
_NHWC_OPS = ("conv2d", "maxpool2d", "avgpool2d", "upsample_nearest", "conv2d_input_grad")
# Ops over a whole image example that compute in NHWC when their example is (C, H, W).
_NHWC_IMAGE_OPS = ("batchnorm", "channel_layernorm", "channel_layernorm_input_grad",
                   "frozen_batchnorm")
# Element-wise ops (and concat, which maps its axis): NHWC when an input is.
_PASS_THROUGH_OPS = ("relu", "dropout", "add", "tanh", "scale", "stop_gradient", "ones_like",
                     "relu_grad", "lerp", "concat", "clipped_relu")


def value_layouts(graph):
    """Name -> layout of every input and node inside the native model, decided statically: image ops
    produce NHWC, element-wise ops keep their input's layout, everything else (reshape,
    flatten, dense, ...) is canonical."""
    layouts = OrderedDict((i.name, NHWC if is_image_input(i) else CANONICAL)
                          for i in graph.inputs.values())
    for node in graph.nodes.values():
        ins = [layouts[i] for i in node.inputs]
        if (node.op in _NHWC_OPS or (node.op in _NHWC_IMAGE_OPS and len(node.shape) == 3)
                or (node.op in _PASS_THROUGH_OPS and NHWC in ins)):
            layouts[node.name] = NHWC
        else:
            layouts[node.name] = CANONICAL
    return layouts


def to_layout(value, layout):
    """Convert a (tensor, layout) pair to ``layout`` (only rank-4 tensors differ)."""
    tensor, current = value
    if current == layout or tensor.shape.rank != 4:
        return tensor
    return tf.transpose(tensor, (0, 2, 3, 1) if layout == NHWC else (0, 3, 1, 2))


# -- per-op adapters: put inputs into the layout the op computes in -------------------------------
def _conv2d(args, p, a, training, update):
    return ops.conv2d(to_layout(args[0], NHWC), p["weight"], p.get("bias"), a)


def _batchnorm(args, p, a, training, update, fused=True):
    stats = (p["gamma"], p["beta"], p.get("running_mean"), p.get("running_var"), a, training,
             update, fused)
    tensor = args[0][0]
    if tensor.shape.rank == 4:
        return ops.batchnorm(to_layout(args[0], NHWC), *stats)
    # channels are canonical axis 1: move them last and fold the rest into one spatial axis
    rank = tensor.shape.rank
    moved = tf.transpose(tensor, [0] + list(range(2, rank)) + [1]) if rank > 2 else tensor
    shape = tf.shape(moved)
    y = ops.batchnorm(tf.reshape(moved, [shape[0], 1, -1, int(tensor.shape[1])]), *stats)
    y = tf.reshape(y, shape)
    return tf.transpose(y, [0, rank - 1] + list(range(1, rank - 1))) if rank > 2 else y


def _maxpool2d(args, p, a, training, update):
    return ops.maxpool2d(to_layout(args[0], NHWC), a)


def _avgpool2d(args, p, a, training, update):
    return ops.avgpool2d(to_layout(args[0], NHWC), a)


def _global_avgpool(args, p, a, training, update):
    return ops.global_avgpool(to_layout(args[0], NHWC))


def _relu(args, p, a, training, update):
    return ops.relu(args[0][0])


def _dropout(args, p, a, training, update):
    return ops.dropout(args[0][0], a, training)


def _add(args, p, a, training, update):
    layout = NHWC if any(l == NHWC for _, l in args) else CANONICAL
    return ops.add([to_layout(v, layout) for v in args])


def _flatten(args, p, a, training, update):
    return ops.flatten(to_layout(args[0], CANONICAL))


def _dense(args, p, a, training, update):
    return ops.dense(to_layout(args[0], CANONICAL), p["weight"], p.get("bias"))


def _embedding(args, p, a, training, update):
    return ops.embedding(args[0][0], p["weight"], a)


def _positional_encoding(args, p, a, training, update):
    return ops.positional_encoding(to_layout(args[0], CANONICAL))


def _layernorm(args, p, a, training, update):
    return ops.layernorm(to_layout(args[0], CANONICAL), p["gamma"], p["beta"], a)


def _multi_head_attention(args, p, a, training, update):
    q, kv, keys = [to_layout(v, CANONICAL) for v in args]
    return ops.multi_head_attention(q, kv, keys, p, a, training)


def _common_layout(args):
    """NHWC when any of the (tensor, layout) pairs is, else canonical."""
    return NHWC if any(l == NHWC for _, l in args) else CANONICAL


# NHWC axis of each canonical example axis of an image (C, H, W).
_NHWC_AXIS = {0: 3, 1: 1, 2: 2}


def _concat(args, p, a, training, update):
    layout = _common_layout(args)
    axis = _NHWC_AXIS[a["axis"]] if layout == NHWC else a["axis"] + 1
    return ops.concat([to_layout(v, layout) for v in args], axis)


def _tanh(args, p, a, training, update):
    return ops.tanh(args[0][0])


def _upsample_nearest(args, p, a, training, update):
    return ops.upsample_nearest(to_layout(args[0], NHWC), a)


def _reshape(args, p, a, training, update):
    return ops.reshape(to_layout(args[0], CANONICAL), a)


def _image_or_canonical(value):
    """(tensor, channel axis): an image example moved to NHWC, anything else canonical."""
    tensor = to_layout(value, NHWC)
    return (tensor, 3) if tensor.shape.rank == 4 else (tensor, 1)


def _channel_layernorm(args, p, a, training, update):
    x, axis = _image_or_canonical(args[0])
    return ops.channel_layernorm(x, p["gamma"], p["beta"], a, axis)


def _lerp(args, p, a, training, update):
    layout = _common_layout(args[:2])
    return ops.lerp(to_layout(args[0], layout), to_layout(args[1], layout), args[2][0])


def _scale(args, p, a, training, update):
    return ops.scale(args[0][0], a)


def _stop_gradient(args, p, a, training, update):
    return ops.stop_gradient(args[0][0])


def _ones_like(args, p, a, training, update):
    return ops.ones_like(args[0][0])


def _conv2d_input_grad(args, p, a, training, update):
    return ops.conv2d_input_grad(to_layout(args[0], NHWC), p["weight"], a)


def _dense_input_grad(args, p, a, training, update):
    return ops.dense_input_grad(to_layout(args[0], CANONICAL), p["weight"])


def _relu_grad(args, p, a, training, update):
    layout = _common_layout(args)
    return ops.relu_grad(to_layout(args[0], layout), to_layout(args[1], layout))


def _channel_layernorm_input_grad(args, p, a, training, update):
    dy, axis = _image_or_canonical(args[0])
    x, _ = _image_or_canonical(args[1])
    return ops.channel_layernorm_input_grad(dy, x, p["gamma"], a, axis)


# -- recurrent models: sequences are canonical (N, T, D), lengths (N,) int32 ---------------------
def _lstm(args, p, a, training, update):
    return ops.lstm(to_layout(args[0], CANONICAL), args[1][0], p, a)


def _gru(args, p, a, training, update):
    return ops.gru(to_layout(args[0], CANONICAL), args[1][0], p, a)


def _additive_attention(args, p, a, training, update):
    return ops.additive_attention(to_layout(args[0], CANONICAL), to_layout(args[1], CANONICAL), args[2][0], p)


def _sequence_batchnorm(args, p, a, training, update):
    return ops.sequence_batchnorm(to_layout(args[0], CANONICAL), args[1][0], p["gamma"], p["beta"],
                                  p.get("running_mean"), p.get("running_var"), a, training,
                                  update)


def _clipped_relu(args, p, a, training, update):
    return ops.clipped_relu(args[0][0], a)


def _transpose(args, p, a, training, update):
    return ops.transpose(to_layout(args[0], CANONICAL), a)


def _lengths_after_conv(args, p, a, training, update):
    return ops.lengths_after_conv(args[0][0], a)


# -- detection: roi_align reads NHWC features and writes canonical (N, R, C, oh, ow) ------------
def _roi_align(args, p, a, training, update):
    # the weights (R, S, 4) look like an image input, so they may arrive NHWC
    return ops.roi_align(to_layout(args[0], NHWC), args[1][0], to_layout(args[2], CANONICAL), a)


def _to_batch(args, p, a, training, update):
    return ops.to_batch(to_layout(args[0], CANONICAL))


def _frozen_batchnorm(args, p, a, training, update):
    x, axis = _image_or_canonical(args[0])
    return ops.frozen_batchnorm(x, p["gamma"], p["beta"], p["running_mean"], p["running_var"], a,
                                axis)


RUN = {
    "roi_align": _roi_align, "to_batch": _to_batch, "frozen_batchnorm": _frozen_batchnorm,
    "conv2d": _conv2d, "batchnorm": _batchnorm, "relu": _relu, "add": _add,
    "maxpool2d": _maxpool2d, "avgpool2d": _avgpool2d, "global_avgpool": _global_avgpool,
    "flatten": _flatten, "dense": _dense, "embedding": _embedding,
    "positional_encoding": _positional_encoding, "layernorm": _layernorm, "dropout": _dropout,
    "multi_head_attention": _multi_head_attention,
    "concat": _concat, "tanh": _tanh, "upsample_nearest": _upsample_nearest, "reshape": _reshape,
    "channel_layernorm": _channel_layernorm, "lerp": _lerp, "scale": _scale,
    "stop_gradient": _stop_gradient, "ones_like": _ones_like,
    "conv2d_input_grad": _conv2d_input_grad, "dense_input_grad": _dense_input_grad,
    "relu_grad": _relu_grad, "channel_layernorm_input_grad": _channel_layernorm_input_grad,
    "lstm": _lstm, "gru": _gru, "additive_attention": _additive_attention,
    "sequence_batchnorm": _sequence_batchnorm, "clipped_relu": _clipped_relu,
    "transpose": _transpose, "lengths_after_conv": _lengths_after_conv,
}



def batchnorm_adapter(fused):
    """The batchnorm adapter with the fused kernel or with its statistics written out."""
    return _batchnorm if fused else functools.partial(_batchnorm, fused=False)
