"""The spec graph as a ``keras.Model`` computing images in NHWC, and the backend's Model class.

Layout rule: inside the native model every image activation (a rank-4 batch of (C, H, W)
examples) is NHWC and every conv kernel HWIO, because TensorFlow's CPU kernels are NHWC. The
native model's inputs and image outputs are therefore NHWC; ``Model`` converts canonical NumPy
batches once per prepared batch, and weights and gradients on the way in and out.
"""
from . import framework  # noqa: F401  (first: TensorFlow imported as the backend needs it)

# isort: split
import functools
from collections import OrderedDict

import keras
import numpy as np
import tensorflow as tf

from ..base import BackendModel
from ..programs import values_read
from . import (
    ops,
    optimizers,
)

NHWC, CANONICAL = "nhwc", "canonical"

# hparams["execution"] -> how the steps run. 'default' is TensorFlow's idiom, a tf.function
# graph run by the executor with oneDNN kernels; 'compiled' adds XLA (jit_compile=True), which
# was 1.8x slower for the ResNet-50 train step and 4-7% slower for the Transformer on this CPU
# (paper configs, batch 8); 'eager' runs op by op. The graph walk has no tensor-dependent
# Python control flow, so AutoGraph's source rewriting is switched off.
EXECUTION = {"default": {"jit_compile": False, "autograph": False},
             "compiled": {"jit_compile": True, "autograph": False}, "eager": None}


# A parameter the loss does not reach (behind a stop_gradient, or read only through a mask) gets a
# zero gradient, so weight decay and momentum still move it, as on every backend.
_ZERO = tf.UnconnectedGradients.ZERO


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

    def __init__(self, graph, weights, fused_batchnorm=True):
        super().__init__(name=graph.name.replace("/", "_"))
        # Training-mode BatchNorm: the fused kernel (fast), or statistics from tf.nn.moments
        # (ten times closer to float64; ops.py ``_two_pass_batchnorm`` says when that matters).
        self._run = _RUN if fused_batchnorm else dict(
            _RUN, batchnorm=functools.partial(_batchnorm, fused=False))
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
        self._plans = {}
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
    def nodes_for(self, outputs):
        """The graph's nodes that ``outputs`` depend on, in order (all of them for None)."""
        if outputs is None:
            return list(self.graph.nodes.values())
        key = tuple(outputs)
        if key not in self._plans:
            needed = values_read(self.graph, key)
            self._plans[key] = [n for n in self.graph.nodes.values() if n.name in needed]
        return self._plans[key]

    def call(self, inputs, training=False, update_stats=None):
        """The output node (NHWC when it is an image: see ``self.layouts``)."""
        return self.forward(inputs, training, update_stats)[self.graph.output][0]

    def forward(self, inputs, training, update_stats=None, outputs=None):
        """(tensor, layout) of every input given and every node that ``outputs`` (default:
        every node) need; ``update_stats`` defaults to ``training``. A training program asks
        for its objectives' values, so an update reads only the inputs its objective needs."""
        update = bool(training) if update_stats is None else update_stats
        values = OrderedDict()
        for name in self.graph.inputs:
            if name in inputs:
                values[name] = (inputs[name], self.layouts[name])
        for node in self.nodes_for(outputs):
            params = OrderedDict((s, self.variable(n))
                                 for s, n in self.graph.param_names(node).items())
            args = [values[i] for i in node.inputs]
            tensor = self._run[node.op](args, params, node.attrs, bool(training), update)
            values[node.name] = (tensor, self.layouts[node.name])
        return values


# -- layouts: which nodes hold NHWC tensors inside SpecModel ---------------------------------------
_NHWC_OPS = ("conv2d", "maxpool2d", "avgpool2d", "upsample_nearest", "conv2d_input_grad")
# Ops over a whole image example that compute in NHWC when their example is (C, H, W).
_NHWC_IMAGE_OPS = ("batchnorm", "channel_layernorm", "channel_layernorm_input_grad",
                   "frozen_batchnorm")
# Element-wise ops (and concat, which maps its axis): NHWC when an input is.
_PASS_THROUGH_OPS = ("relu", "dropout", "add", "tanh", "scale", "stop_gradient", "ones_like",
                     "relu_grad", "lerp", "concat", "clipped_relu")


def value_layouts(graph):
    """Name -> layout of every input and node inside SpecModel, decided statically: image ops
    produce NHWC, element-wise ops keep their input's layout, everything else (reshape,
    flatten, dense, ...) is canonical."""
    layouts = OrderedDict((i.name, NHWC if _is_image_input(i) else CANONICAL)
                          for i in graph.inputs.values())
    for node in graph.nodes.values():
        ins = [layouts[i] for i in node.inputs]
        if (node.op in _NHWC_OPS or (node.op in _NHWC_IMAGE_OPS and len(node.shape) == 3)
                or (node.op in _PASS_THROUGH_OPS and NHWC in ins)):
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


def _batchnorm(args, p, a, training, update, fused=True):
    stats = (p["gamma"], p["beta"], p.get("running_mean"), p.get("running_var"), a, training,
             update, fused)
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


def _common_layout(args):
    """NHWC when any of the (tensor, layout) pairs is, else canonical."""
    return NHWC if any(l == NHWC for _, l in args) else CANONICAL


# NHWC axis of each canonical example axis of an image (C, H, W).
_NHWC_AXIS = {0: 3, 1: 1, 2: 2}


def _concat(args, p, a, training, update):
    layout = _common_layout(args)
    axis = _NHWC_AXIS[a["axis"]] if layout == NHWC else a["axis"] + 1
    return ops.concat([_to(v, layout) for v in args], axis)


def _tanh(args, p, a, training, update):
    return ops.tanh(args[0][0])


def _upsample_nearest(args, p, a, training, update):
    return ops.upsample_nearest(_to(args[0], NHWC), a)


def _reshape(args, p, a, training, update):
    return ops.reshape(_to(args[0], CANONICAL), a)


def _image_or_canonical(value):
    """(tensor, channel axis): an image example moved to NHWC, anything else canonical."""
    tensor = _to(value, NHWC)
    return (tensor, 3) if tensor.shape.rank == 4 else (tensor, 1)


def _channel_layernorm(args, p, a, training, update):
    x, axis = _image_or_canonical(args[0])
    return ops.channel_layernorm(x, p["gamma"], p["beta"], a, axis)


def _lerp(args, p, a, training, update):
    layout = _common_layout(args[:2])
    return ops.lerp(_to(args[0], layout), _to(args[1], layout), args[2][0])


def _scale(args, p, a, training, update):
    return ops.scale(args[0][0], a)


def _stop_gradient(args, p, a, training, update):
    return ops.stop_gradient(args[0][0])


def _ones_like(args, p, a, training, update):
    return ops.ones_like(args[0][0])


def _conv2d_input_grad(args, p, a, training, update):
    return ops.conv2d_input_grad(_to(args[0], NHWC), p["weight"], a)


def _dense_input_grad(args, p, a, training, update):
    return ops.dense_input_grad(_to(args[0], CANONICAL), p["weight"])


def _relu_grad(args, p, a, training, update):
    layout = _common_layout(args)
    return ops.relu_grad(_to(args[0], layout), _to(args[1], layout))


def _channel_layernorm_input_grad(args, p, a, training, update):
    dy, axis = _image_or_canonical(args[0])
    x, _ = _image_or_canonical(args[1])
    return ops.channel_layernorm_input_grad(dy, x, p["gamma"], a, axis)


# -- recurrent models: sequences are canonical (N, T, D), lengths (N,) int32 ---------------------
def _lstm(args, p, a, training, update):
    return ops.lstm(_to(args[0], CANONICAL), args[1][0], p, a)


def _gru(args, p, a, training, update):
    return ops.gru(_to(args[0], CANONICAL), args[1][0], p, a)


def _additive_attention(args, p, a, training, update):
    return ops.additive_attention(_to(args[0], CANONICAL), _to(args[1], CANONICAL), args[2][0], p)


def _sequence_batchnorm(args, p, a, training, update):
    return ops.sequence_batchnorm(_to(args[0], CANONICAL), args[1][0], p["gamma"], p["beta"],
                                  p.get("running_mean"), p.get("running_var"), a, training,
                                  update)


def _clipped_relu(args, p, a, training, update):
    return ops.clipped_relu(args[0][0], a)


def _transpose(args, p, a, training, update):
    return ops.transpose(_to(args[0], CANONICAL), a)


def _lengths_after_conv(args, p, a, training, update):
    return ops.lengths_after_conv(args[0][0], a)


# -- detection: roi_align reads NHWC features and writes canonical (N, R, C, oh, ow) ------------
def _roi_align(args, p, a, training, update):
    # the weights (R, S, 4) look like an image input, so they may arrive NHWC
    return ops.roi_align(_to(args[0], NHWC), args[1][0], _to(args[2], CANONICAL), a)


def _to_batch(args, p, a, training, update):
    return ops.to_batch(_to(args[0], CANONICAL))


def _frozen_batchnorm(args, p, a, training, update):
    x, axis = _image_or_canonical(args[0])
    return ops.frozen_batchnorm(x, p["gamma"], p["beta"], p["running_mean"], p["running_var"], a,
                                axis)


_RUN = {
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
    RUNS_PROGRAMS = True
    OPTIONS = {"precision": ("fp32",), "execution": tuple(EXECUTION),
               "memory_format": ("auto", "channels_last")}

    def _build(self, weights):
        # Training programs (Inception-v3, WGAN) take the precise BatchNorm statistics; the
        # single-loss models keep the fused kernel they were measured with.
        self.native = SpecModel(self.spec, weights, fused_batchnorm=self.program is None)
        self._trainable = [self.native.variable(n) for n in self.trainable_names()]
        self._statistics = [self.native.variable(n) for n, p in self.spec.params().items()
                            if not p.trainable]
        execution = self.hparams["execution"]
        self._xla = bool((EXECUTION[execution] or {}).get("jit_compile"))
        self._predict_fn = _compiled(self._infer, execution)
        if self.program is not None:
            self._build_program(execution)
            return
        self.optimizer = optimizers.make(self._trainable, self.hparams)
        self._logits = self.spec.loss["logits"]
        self._labels = self.spec.loss["labels"]
        self._train_fn, self._grad_fn = [_compiled(fn, execution)
                                         for fn in (self._train, self._gradients)]

    # -- compiled functions ----------------------------------------------------------------
    def _loss(self, inputs, update_stats):
        values = self.native.forward(inputs, training=True, update_stats=update_stats)
        logits = _to(values[self._logits], CANONICAL)
        return ops.softmax_cross_entropy(logits, inputs[self._labels], self.spec.loss)

    def _train(self, inputs, lr):
        saved = self._read_statistics()
        with tf.GradientTape() as tape:
            loss = self._loss(inputs, update_stats=True)
        grads = tape.gradient(loss, self._trainable, unconnected_gradients=_ZERO)
        grads = self._reduce_gradients(grads)
        return loss, self._guarded(loss, grads, saved, lambda: self.optimizer.apply(grads, lr))

    # -- atomic steps (docs/backends.md) -----------------------------------------------------
    def _read_statistics(self):
        """The statistics' values before a step (None with the guard off), inside its function."""
        if not self.guard_steps:
            return None
        return [tf.identity(v.read_value()) for v in self._statistics]

    def _guarded(self, loss, grads, saved, update):
        """``update()`` under tf.cond: run where the loss and the gradients' global norm are
        finite, else the statistics put back from ``saved``; returns the finite flag."""
        if saved is None:
            update()
            return tf.constant(True)
        total = tf.add_n([tf.reduce_sum(tf.square(optimizers.dense(g))) for g in grads]) \
            if grads else tf.constant(0.0)
        finite = tf.math.is_finite(tf.cast(loss, tf.float32) + total)

        def apply():
            update()
            return tf.constant(True)

        def restore():
            for variable, value in zip(self._statistics, saved):
                variable.assign(value)
            return tf.constant(False)
        return tf.cond(finite, apply, restore)

    def _undone_on_failure(self, call, *args):
        """``call(*args)`` (a step's function), its writes put back from a host copy if it
        fails part-way: a failing op ends the function after the ops before it ran."""
        saved = self._save_state() if self.guard_steps else None
        try:
            return call(*args)
        except BaseException:
            if saved is not None:
                self._restore_state(saved)
            raise

    def _save_state(self):
        """Host copies of every variable a step writes: weights, statistics, optimizer slots."""
        return [(v, v.numpy()) for v in self._state_variables()]

    def _restore_state(self, saved, where=None):
        for variable, value in saved:
            variable.assign(value)

    def _state_variables(self):
        every = [self.optimizer] if self.program is None else list(self._optimizers.values())
        return [self.native.variable(n) for n in self.spec.params()] + \
            [v for o in every for v in optimizers.state_variables(o)]

    def _gradients(self, inputs):
        with tf.GradientTape() as tape:
            loss = self._loss(inputs, update_stats=False)
        grads = tape.gradient(loss, self._trainable, unconnected_gradients=_ZERO)
        return loss, [tf.convert_to_tensor(g) for g in grads]

    def _infer(self, inputs):
        """The output node from the inputs it reads (a program's step batch may hold more)."""
        output = self.spec.output
        values = self.native.forward(inputs, training=False, outputs=(output,))
        return _to(values[output], CANONICAL)

    # -- training programs -------------------------------------------------------------------
    def _build_program(self, execution):
        """One optimizer per parameter group (each with its own state and step counter) and,
        per phase, a compiled update and a compiled gradient function."""
        program = self.program
        owner = program.assignment(self.spec)
        self._group_names = OrderedDict(
            (g, [n for n, o in owner.items() if o == g]) for g in program.groups)
        self._group_variables = OrderedDict(
            (g, [self.native.variable(n) for n in names]) for g, names in self._group_names.items())
        self._optimizers = OrderedDict(
            (g, optimizers.make_group(self._group_variables[g], spec["optimizer"]))
            for g, spec in program.groups.items())
        self._update_fns = [_compiled(functools.partial(self._phase_update, i), execution)
                            for i in range(len(program.phases))]
        self._gradient_fns = [_compiled(functools.partial(self._phase_gradients, i), execution)
                              for i in range(len(program.phases))]

    def _objective(self, phase_index, inputs, update_stats):
        """The phase's objective: its losses' weighted sum, from only the values they read."""
        program = self.program
        terms = [(program.losses[name], weight) for name, weight in
                 program.objectives[program.phases[phase_index]["objective"]]]
        outputs = tuple(OrderedDict.fromkeys(v for loss, _ in terms for v in loss["inputs"].values()))
        values = self.native.forward(inputs, training=True, update_stats=update_stats,
                                     outputs=outputs)
        total = None
        for loss, weight in terms:
            value = weight * _loss_value(loss, values, self._xla)
            total = value if total is None else total + value
        return total

    def _phase_objective_and_gradients(self, phase_index, inputs, update_stats):
        """The objective and its gradients w.r.t. the phase's group only: the tape watches
        nothing else, so the other networks' forward passes record no backward. A parameter
        the objective does not reach gets a zero gradient."""
        variables = self._group_variables[self.program.phases[phase_index]["update"]]
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(variables)
            loss = self._objective(phase_index, inputs, update_stats)
        grads = tape.gradient(loss, variables, unconnected_gradients=_ZERO)
        return loss, [optimizers.dense(g) for g in grads]

    def _phase_update(self, phase_index, inputs, lr):
        phase = self.program.phases[phase_index]
        group = phase["update"]
        saved = self._read_statistics()
        loss, grads = self._phase_objective_and_gradients(phase_index, inputs, True)
        grads = self._reduce_gradients(grads)

        def update():
            clipped = optimizers.clip_gradients(grads, self.program.groups[group]["clip"])
            self._optimizers[group].apply(clipped, lr)
            for hook in phase["hooks"]:  # clip_weights, the only hook kind
                optimizers.clip_weights(self._group_variables[hook["group"]], hook["value"])
        return loss, self._guarded(loss, grads, saved, update)

    def _phase_gradients(self, phase_index, inputs):
        return self._phase_objective_and_gradients(phase_index, inputs, False)

    def _update(self, phase_index, native, lr):
        loss, finite = self._undone_on_failure(self._update_call, phase_index, native, lr)
        if not bool(finite):
            raise self._nonfinite_error([self.program.phases[phase_index]["objective"]])
        return loss

    def _update_call(self, phase_index, native, lr):
        """(objective, finite flag) of one update's compiled function."""
        return self._update_fns[phase_index](native, tf.constant(lr, tf.float32))

    def _program_gradients(self, prepared):
        """Each phase's objective and its group's gradients on the phase's first batch."""
        losses, grads = OrderedDict(), OrderedDict()
        for phase_index, native in prepared.native:
            phase = self.program.phases[phase_index]
            if phase["objective"] in losses:
                continue
            loss, values = self._gradient_fns[phase_index](native)
            losses[phase["objective"]] = float(loss)
            for name, g in zip(self._group_names[phase["update"]], values):
                grads[name] = self.native.to_canonical(name, g.numpy())
        return losses, grads

    # -- the BackendModel contract -------------------------------------------------------------
    def _prepare(self, batch):
        """Tensors keyed by input name, for the inputs ``batch`` holds (an update of a training
        program reads only some); image features transposed to NHWC here, once. Lengths and
        CTC labels were checked before (BackendModel._check_batch): TensorFlow's kernels would
        clamp some bad lengths silently and fail on others with a message naming no input."""
        out = OrderedDict()
        for name, inp in self.spec.inputs.items():
            if name not in batch:
                continue
            if inp.dtype == "int32":
                value = np.asarray(batch[name], np.int32)
            else:
                value = np.asarray(batch[name], np.float32)
                if name in self.native.image_inputs:
                    value = nchw_to_nhwc(value)
            out[name] = tf.constant(value)
        return out

    def _train_step_async(self, prepared, lr):
        """Run one step's function; returns the loss tensor without copying it to the host.
        Its finite flag is read at the next synchronisation."""
        loss, finite = self._undone_on_failure(self._train_call, prepared, lr)
        if self.guard_steps:
            self._defer_nonfinite(self.step_count + 1, tf.logical_not(finite), ["loss"])
        return loss

    def _train_call(self, prepared, lr):
        """(loss, finite flag) of one step's compiled function."""
        return self._train_fn(prepared.native, tf.constant(lr, tf.float32))

    def _train_step(self, prepared, lr):
        """One step, returned only when its update has run: on a GPU the kernels a step
        launches may still be running when its function returns."""
        loss, finite = self._undone_on_failure(self._train_call, prepared, lr)
        self.synchronize()
        if not bool(finite):
            raise self._nonfinite_error(["loss"])
        return loss.numpy()

    def synchronize(self):
        """Wait for every device's queued kernels and TensorFlow's own queue of pending ops;
        raises the NonFiniteStepError of the first queued step that was skipped."""
        tf.test.experimental.sync_devices()
        self._raise_deferred()

    def _predict(self, prepared):
        return self._predict_fn(prepared.native).numpy()

    def _values(self, prepared, names):
        """Inference-mode values of graph nodes ``names`` in canonical layout (a program's
        targets step reads them); one function per set of names, compiled like ``_infer``."""
        key = tuple(names)
        functions = self.__dict__.setdefault("_values_fns", {})
        if key not in functions:
            def values_of(inputs):
                values = self.native.forward(inputs, training=False, outputs=key)
                return [_to(values[n], CANONICAL) for n in key]
            functions[key] = _compiled(values_of, self.hparams["execution"])
        return OrderedDict((n, v.numpy()) for n, v in zip(key, functions[key](prepared.native)))

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
        every = list(self._optimizers.values()) if self.program is not None else [self.optimizer]
        slots = [v for optimizer in every for v in optimizer.slots()]
        return {"weights": sum(size(self.native.variable(n)) for n in self.spec.params()),
                "optimizer_state": sum(size(v) for v in slots)}


def _loss_value(loss, values, xla=False):
    """One loss term of a program (tbdzoo/spec/losses.py) from the graph's (tensor, layout);
    ``xla``: the step is XLA-compiled (only some TensorFlow kernels compile)."""
    kind, attrs = loss["kind"], loss["attrs"]
    if kind == "softmax_cross_entropy":
        x = {role: _to(values[name], CANONICAL) for role, name in loss["inputs"].items()}
        return ops.softmax_cross_entropy(x["logits"], x["labels"], attrs)
    # a mean and a per-example norm do not see the element order: no transpose
    x = {role: values[name][0] for role, name in loss["inputs"].items()}
    if kind == "mean":
        return ops.mean_loss(x["x"])
    if kind == "norm_penalty":
        return ops.norm_penalty(x["x"], attrs["target"])
    if kind in ("smooth_l1", "sigmoid_cross_entropy"):  # element-wise: canonical order
        x = {role: _to(values[name], CANONICAL) for role, name in loss["inputs"].items()}
        if kind == "smooth_l1":
            return ops.smooth_l1_loss(x["prediction"], x["target"], x["weight"], attrs)
        return ops.sigmoid_cross_entropy_loss(x["logits"], x["labels"], x["weight"])
    if kind in ("policy_gradient", "entropy", "squared_error"):  # (N, A) and per-example values
        x = {role: _to(values[name], CANONICAL) for role, name in loss["inputs"].items()}
        return getattr(ops, kind)(**x)
    if kind == "ctc":
        return ops.ctc_loss(_to(values[loss["inputs"]["logits"]], CANONICAL), x["labels"],
                            x["input_lengths"], x["label_lengths"], xla)
    raise ValueError("loss kind {!r} has no TensorFlow implementation".format(kind))
