"""The backend's Model class, training the functional ``keras.Model`` of native.py.

Layout rule: inside the native model every image activation (a rank-4 batch of (C, H, W)
examples) is NHWC and every conv kernel HWIO, because TensorFlow's CPU kernels are NHWC. The
native model's inputs and image outputs are therefore NHWC; ``Model`` converts canonical NumPy
batches once per prepared batch, and weights and gradients on the way in and out
(``NativeNet.to_internal`` / ``to_canonical``).
"""
from . import framework  # noqa: F401  (first: TensorFlow imported as the backend needs it)

# isort: split
import functools
from collections import OrderedDict

import numpy as np
import tensorflow as tf

from ..base import BackendModel
from . import (
    ops,
    optimizers,
)
from .adapters import CANONICAL
from .adapters import to_layout as _to
from .native import NativeNet, compile_for_fit

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
        self.net = NativeNet(self.spec, weights, fused_batchnorm=self.program is None)
        self.native = self.net.model
        self.native_parts = self.net.parts
        self._trainable = [self.net.variable(n) for n in self.trainable_names()]
        self._statistics = [self.net.variable(n) for n, p in self.spec.params().items()
                            if not p.trainable]
        execution = self.hparams["execution"]
        self._xla = bool((EXECUTION[execution] or {}).get("jit_compile"))
        self._predict_fn = _compiled(self._infer, execution)
        if self.program is not None:
            self._build_program(execution)
            return
        self.optimizer = optimizers.make(self._trainable, self.hparams)
        if self._logits_is_output():
            compile_for_fit(self.native, self.spec.loss, self.hparams, self.learning_rate())
        self._logits = self.spec.loss["logits"]
        self._labels = self.spec.loss["labels"]
        self._train_fn, self._grad_fn = [_compiled(fn, execution)
                                         for fn in (self._train, self._gradients)]

    def _logits_is_output(self):
        """Whether ``fit`` can train the native model on the spec's loss: the loss reads
        the model's output, with labels that are an input of the graph."""
        return self.spec.loss["logits"] == self.spec.output and \
            self.spec.loss["kind"] == "softmax_cross_entropy"

    # -- compiled functions ----------------------------------------------------------------
    def _loss(self, inputs, update_stats):
        values = self.net.forward(inputs, training=True, update_stats=update_stats)
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
        return [self.net.variable(n) for n in self.spec.params()] + \
            [v for o in every for v in optimizers.state_variables(o)]

    def _gradients(self, inputs):
        with tf.GradientTape() as tape:
            loss = self._loss(inputs, update_stats=False)
        grads = tape.gradient(loss, self._trainable, unconnected_gradients=_ZERO)
        return loss, [tf.convert_to_tensor(g) for g in grads]

    def _infer(self, inputs):
        """The output node from the inputs it reads (a program's step batch may hold more)."""
        output = self.spec.output
        values = self.net.forward(inputs, training=False, outputs=(output,))
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
            (g, [self.net.variable(n) for n in names]) for g, names in self._group_names.items())
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
        values = self.net.forward(inputs, training=True, update_stats=update_stats,
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
                grads[name] = self.net.to_canonical(name, g.numpy())
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
                if name in self.net.image_inputs:
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
                values = self.net.forward(inputs, training=False, outputs=key)
                return [_to(values[n], CANONICAL) for n in key]
            functions[key] = _compiled(values_of, self.hparams["execution"])
        return OrderedDict((n, v.numpy()) for n, v in zip(key, functions[key](prepared.native)))

    def _loss_and_gradients(self, prepared):
        loss, grads = self._grad_fn(prepared.native)
        names = self.trainable_names()
        return float(loss), OrderedDict(
            (n, self.net.to_canonical(n, g.numpy())) for n, g in zip(names, grads))

    def _get_weights(self):
        return OrderedDict((n, self.net.to_canonical(n, self.net.variable(n).numpy()))
                           for n in self.spec.params())

    def _set_weights(self, weights):
        for n, value in weights.items():
            self.net.variable(n).assign(self.net.to_internal(n, value))

    # -- measuring -------------------------------------------------------------------------
    def measure_memory(self, prepared):
        """Weights (every variable of the model's state, running statistics included) and the
        optimizer's slot variables, read off the variables themselves. Gradients live only
        inside a step here, so they stay analytic."""
        def size(v):
            return v.shape.num_elements() * v.dtype.size
        every = list(self._optimizers.values()) if self.program is not None else [self.optimizer]
        slots = [v for optimizer in every for v in optimizer.slots()]
        return {"weights": sum(size(self.net.variable(n)) for n in self.spec.params()),
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
