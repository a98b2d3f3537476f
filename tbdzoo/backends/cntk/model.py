"""The spec graph as a ``cntk.Function`` plus its training step.

``native`` is the output's function, named by the model's class (``ResNet``) and made of
block functions, one per block of the spec's tree and per layer, named by their paths, with
the parameters under their canonical names (blocks.py); ``block_function(path)`` gives any
block on its own. A plain graph's loss reads that function, so the trainer trains it.

Every input is a ``C.input_variable`` of the per-example shape with CNTK's dynamic batch axis
and no sequence axis (sequences are padded to fixed lengths, so every shape is static; token
ids and lengths travel as float32, exact below 2**24; the recurrent ops make sequence axes of
their own inside the graph, ops.py). Parameters are ``C.parameter`` objects created from
the NumPy initial values in canonical layout, which is also CNTK's layout for every op used
here; BatchNorm running statistics are ``C.constant`` objects the BN op updates in place.
The train step is CNTK's own ``Trainer.train_minibatch`` (forward, backward and the update in
C++), with the normalized optimizer as a universal learner.

A training program gets one trainer per phase (its objective, its group's learner), BatchNorm
from exact moments whose running statistics the model updates from each step's fetched
moments, and an inference graph of its own for ``predict`` (docs/backends.md): ``native``,
made of blocks, while the objectives are graphs of single nodes, whose moments are outputs
a step can fetch (inside a block they would not be); both read the same parameters. A plain
graph with ``sequence_batchnorm`` (statistics over valid steps, which CNTK's native op cannot
take) does the same: each step fetches its moments, and ``predict`` has its own graph.
Valid Python 3.6.
"""
from . import framework  # noqa: F401  (first: CNTK imported quietly)

# isort: split
from collections import OrderedDict

import cntk as C
import numpy as np

from ...errors import UnknownNameError
from .. import programs
from ..base import BackendModel
from . import (
    blocks,
    ops,
    optimizers,
)


class Model(BackendModel):
    backend = "cntk"

    # -- building ---------------------------------------------------------------------------------
    def _build(self, weights):
        graph = self.spec
        self._ctx = ops.Context(self.seed, exact_statistics=self.program is not None)
        self._inputs = OrderedDict(
            (i.name, C.input_variable(i.shape, np.float32, name=i.name)) for i in graph.inputs.values())
        self._vars = OrderedDict()
        for name, param in graph.params().items():
            value = np.asarray(weights[name], np.float32)
            if param.trainable:
                self._vars[name] = C.parameter(shape=value.shape, init=value, name=name)
            else:
                self._vars[name] = C.constant(value, shape=value.shape, name=name)
        self._statistics = [self._vars[n] for n, p in graph.params().items() if not p.trainable]
        self._blocks = blocks.Builder(graph, self._node, self._inputs)
        if self.program is not None:
            self._build_program(self._values_of(graph.nodes.values()))
            self._ctx.inference = True
            self.native = self._native(self._blocks.values([graph.output]))
            return
        # Ops whose batch moments the model folds into running statistics (sequence_batchnorm)
        # are fetched by each step from a graph of single nodes (a block's inside is not an
        # output of the model); inference is then a graph of its own. Otherwise the model's
        # function, made of blocks, is what the loss reads and the trainer trains.
        flat = any(ops.fetches_moments(node, self._ctx) for node in graph.nodes.values())
        values = self._values_of(graph.nodes.values()) if flat else self._blocks.values()
        loss = graph.loss
        self._loss = ops.softmax_cross_entropy(values[loss["logits"]], self._inputs[loss["labels"]], loss)
        self._trainable = [self._vars[n] for n in self.trainable_names()]
        self.optimizer = optimizers.make(self._trainable, self.hparams)
        self._step_moments = list(self._ctx.moments.items())
        if flat:
            fetched = C.combine([self._loss] + [v for _, pair in self._step_moments for v in pair])
            self._ctx.inference = True
            self.native = self._native(self._blocks.values([graph.output]))
        else:
            fetched = self.native = self._native(values)
        self._trainer = C.Trainer(*self._reduce_gradients(
            (fetched, (self._loss, None), [self.optimizer.learner])))

    def _native(self, values):
        """The model's function: the graph's output, named by the model's class (its
        top-level blocks, layers and nodes are inside, by their paths)."""
        return C.combine([values[self.spec.output]], name=self._blocks.root.kind)

    # -- the model's blocks -----------------------------------------------------------------
    def block_function(self, path):
        """Block ``path`` of the model's tree (``'layer1.0'``, WGAN's ``'critic'``, Faster
        R-CNN's ``'backbone'``) as a ``cntk.Function`` of its own: the block function itself,
        reading one input variable per value it reads, named by that value, in inference
        mode, with the model's parameters (training the model trains it, and the reverse).
        A block a program's output does not read (the critic) is found here too."""
        known = [b.name for b in self._blocks.root.walk() if b.name]
        if path not in known:
            raise UnknownNameError("block of " + self.name, path, known)
        block = self._blocks.root.find(path)
        inputs = OrderedDict((n, C.input_variable(self.spec.shape_of(n), np.float32, name=n))
                             for n in block.inputs)
        inference, self._ctx.inference = self._ctx.inference, True
        try:
            outputs = self._blocks.block(block, inputs)
        finally:
            self._ctx.inference = inference
        return C.as_composite(next(iter(outputs.values())).owner)

    # -- training programs ---------------------------------------------------------------------
    RUNS_PROGRAMS = True

    def _build_program(self, values):
        """One optimizer per parameter group and, per phase, its objective as one scalar
        ``cntk.Function`` with a trainer whose learner covers the phase's group only, so an
        update differentiates with respect to that group alone (in CNTK's native step)."""
        program = self.program
        owner = program.assignment(self.spec)
        self._group_names = OrderedDict(
            (g, [n for n, o in owner.items() if o == g]) for g in program.groups)
        self._group_vars = OrderedDict(
            (g, [self._vars[n] for n in names]) for g, names in self._group_names.items())
        self._optimizers = OrderedDict(
            (g, optimizers.make_group(self._group_vars[g], spec["optimizer"], spec["clip"]))
            for g, spec in program.groups.items())
        losses = OrderedDict((name, losses_of(loss, values, self._inputs))
                             for name, loss in program.losses.items())
        self._objectives, self._trainers, self._moments, learned = [], [], [], set()
        for phase in program.phases:
            group = phase["update"]
            objective = objective_function(program.objectives[phase["objective"]], losses,
                                           self._group_vars[group])
            optimizer = self._optimizers[group]
            learner = optimizer.new_learner() if group in learned else optimizer.learner
            learned.add(group)
            read = programs.values_read(self.spec, programs.objective_values(
                program, phase["objective"]))
            moments = [(name, m) for name, m in self._ctx.moments.items() if name in read]
            fetched = [objective] + [v for _, pair in moments for v in pair]
            self._objectives.append(objective)
            self._moments.append(moments)
            self._trainers.append(C.Trainer(*self._reduce_gradients((
                C.combine(fetched) if moments else objective, (objective, None), [learner]))))

    def _update(self, phase_index, native, lr):
        phase = self.program.phases[phase_index]
        objective = self._objectives[phase_index]
        moments = self._moments[phase_index]
        wanted = [objective.output] + [v.output for _, pair in moments for v in pair]
        optimizer = self._optimizers[phase["update"]]
        saved = self._save_state([optimizer]) if self.guard_steps else None
        try:
            optimizer.prepare(lr)
            _, outputs = self._trainers[phase_index].train_minibatch(
                _arguments(objective, native), outputs=wanted)
            value = float(outputs[objective.output])
            self._check_finite(value, optimizer, phase["objective"])
            rows = len(next(iter(native.values())))
            for name, (mean, variance) in moments:
                self._update_statistics(self.spec.nodes[name], rows, outputs[mean.output],
                                        outputs[variance.output])
            for hook in phase["hooks"]:
                clip_weights(self._group_vars[hook["group"]], hook["value"])
        except BaseException:
            if saved is not None:
                self._restore_state(saved)
            raise
        return value

    # -- atomic steps (docs/backends.md) -------------------------------------------------------
    def _check_finite(self, loss, optimizer, objective):
        """Raise NonFiniteStepError when the loss, or the gradients' global norm that the
        update's learner recorded (``optimizer.finite``), is not finite; the caller then puts
        back its copy of the state."""
        if self.guard_steps and not (np.isfinite(loss) and float(optimizer.finite.value) == 1.0):
            raise self._nonfinite_error([objective])

    def _save_state(self, optimizers_held=None):
        """Host copies of everything a step writes: every parameter and statistic, the
        optimizers' slots and step counters. CNTK's trainer updates in place inside one
        native call, so a step that fails or comes out non-finite is undone from these."""
        if optimizers_held is None:
            optimizers_held = list(self._optimizers.values()) if self.program is not None \
                else [self.optimizer]
        variables = list(self._vars.values()) + [c for o in optimizers_held for c in o.state()]
        return ([(v, np.array(v.value)) for v in variables],
                [(o, o.steps) for o in optimizers_held])

    def _restore_state(self, saved, where=None):
        variables, steps = saved
        for variable, value in variables:
            variable.value = value
        for optimizer, count in steps:
            optimizer.steps = count

    def _update_statistics(self, node, rows, mean, variance):
        """running = (1 - m) running + m batch, with the unbiased variance (the spec's rule),
        in float32 as PyTorch updates its buffers. sequence_batchnorm's graph gives the
        unbiased variance over its valid steps already."""
        m = np.float32(node.attrs["momentum"])
        if m <= 0:
            return
        x_shape = self.spec.shape_of(node.inputs[0])
        if node.op == "sequence_batchnorm":
            channels, correction = x_shape[-1], np.float32(1.0)
        else:
            count = rows * int(np.prod(x_shape[1:]))
            channels, correction = x_shape[0], np.float32(count / max(count - 1.0, 1.0))
        batch = (np.reshape(mean, (channels,)).astype(np.float32),
                 np.reshape(variance, (channels,)).astype(np.float32) * correction)
        for suffix, value in zip(("running_mean", "running_var"), batch):
            constant = self._vars[self.spec.param_names(node)[suffix]]
            constant.value = (np.float32(1.0) - m) * constant.value + m * value

    def _program_gradients(self, prepared):
        """Each phase's objective and its group's gradients on the phase's first batch, in
        training mode, with no update; running statistics are restored afterwards."""
        saved = [s.value.copy() for s in self._statistics]
        losses, grads, seen = OrderedDict(), OrderedDict(), set()
        for phase_index, native in prepared.native:
            if phase_index in seen:
                continue
            seen.add(phase_index)
            phase = self.program.phases[phase_index]
            value, named = self._gradients(self._objectives[phase_index], native,
                                           self._group_names[phase["update"]])
            losses[phase["objective"]] = value
            grads.update(named)
        for constant, value in zip(self._statistics, saved):
            constant.value = value
        return losses, grads

    def _gradients(self, function, native, names):
        """(value, {name: gradient}) of a scalar function w.r.t. the named parameters."""
        self._set_batchnorm_counts(len(next(iter(native.values()))))
        variables = [self._vars[n] for n in names]
        state, outputs = function.forward(_arguments(function, native), outputs=[function.output],
                                          keep_for_backward=set([function.output]))
        root = {function.output: np.ones((), np.float32)}
        grads = function.backward(state, root, variables=set(variables))
        return float(outputs[function.output]), OrderedDict(
            (n, np.asarray(grads[v], np.float32)) for n, v in zip(names, variables))

    def _values_of(self, nodes):
        """{input or node name: CNTK variable} for ``nodes`` (in graph order) from the inputs."""
        values = dict(self._inputs)
        for node in nodes:
            values[node.name] = self._node(node, values)
        return values

    def _node(self, node, values):
        self._ctx.node = node.name
        params = OrderedDict((suffix, self._vars[full])
                             for suffix, full in self.spec.param_names(node).items())
        inputs = [values[i] for i in node.inputs]
        if node.op == "roi_align" and node.inputs[1] not in self.spec.inputs:
            raise ValueError("roi_align on CNTK reads its indices from a graph input (the model "
                             "offsets them per example as it prepares the batch); node {!r} "
                             "computes them".format(node.name))
        if node.op == "batchnorm":
            # Non-zero from the start: CNTK refuses inference (and discards imported statistics
            # in training) while a BN node's sample count is zero.
            count = C.constant(1.0, shape=(), dtype=np.float32,
                               name=node.name + ".running_count")
            out = ops.batchnorm(inputs, params, node.attrs, self._ctx, count)
        else:
            out = getattr(ops, node.op)(inputs, params, node.attrs, self._ctx)
        return out.output if isinstance(out, C.Function) and len(out.outputs) == 1 else out

    # -- batches ----------------------------------------------------------------------------------
    def _prepare(self, batch):
        """Only the inputs the batch holds: an update or a prediction may read a part of them.
        Lengths and CTC labels were checked before (BackendModel._check_batch): CNTK would
        read a bad length as garbage."""
        batch = ops.offset_roi_indices(self.spec, batch)  # roi_align gathers over the batch
        return OrderedDict((var, np.ascontiguousarray(batch[name], np.float32))
                           for name, var in self._inputs.items() if name in batch)

    def _features(self, prepared):
        wanted = set(self.native.arguments)
        return {var: value for var, value in prepared.native.items() if var in wanted}

    def _batch_size(self, prepared):
        return len(next(iter(prepared.native.values())))

    def _set_batchnorm_counts(self, batch_size):
        """CNTK blends the new batch with weight N / (N + count): count = N (1 - m) / m gives m."""
        for count, momentum in self._ctx.batchnorms:
            count.value = np.array(batch_size * (1.0 - momentum) / momentum, np.float32)

    # -- steps ------------------------------------------------------------------------------------
    def _train_step(self, prepared, lr):
        self._set_batchnorm_counts(self._batch_size(prepared))
        saved = self._save_state([self.optimizer]) if self.guard_steps else None
        try:
            self.optimizer.prepare(lr)
            moments = self._step_moments
            wanted = [self._loss.output] + [v.output for _, pair in moments for v in pair]
            _, outputs = self._trainer.train_minibatch(prepared.native, outputs=wanted)
            loss = float(outputs[self._loss.output])
            self._check_finite(loss, self.optimizer, "loss")
            rows = self._batch_size(prepared)
            for name, (mean, variance) in moments:
                self._update_statistics(self.spec.nodes[name], rows, outputs[mean.output],
                                        outputs[variance.output])
        except BaseException:
            if saved is not None:
                self._restore_state(saved)
            raise
        return loss

    def synchronize(self):
        """Nothing to wait for: ``train_minibatch`` returns after the forward pass, backward pass
        and update have run (CNTK queues no work past the call), and this backend runs on the CPU."""

    def _predict(self, prepared):
        """``eval`` runs CNTK in inference mode: running statistics, no dropout."""
        return np.asarray(self.native.eval(self._features(prepared)), np.float32)

    def _values(self, prepared, names):
        """Inference-mode values of graph nodes ``names`` (a program's targets step reads
        them): one inference graph per set of names, sharing the model's parameters."""
        key = tuple(names)
        functions = self.__dict__.setdefault("_values_functions", {})
        if key not in functions:
            inference, self._ctx.inference = self._ctx.inference, True
            needed = programs.values_read(self.spec, key)
            values = self._values_of(n for n in self.spec.nodes.values() if n.name in needed)
            self._ctx.inference = inference
            functions[key] = C.combine([values[n] for n in key])
        combined = functions[key]
        wanted = set(combined.arguments)
        result = combined.eval({var: value for var, value in prepared.native.items()
                                if var in wanted})
        if not isinstance(result, dict):
            result = {combined.outputs[0]: result}
        out = OrderedDict()
        for name, output in zip(key, combined.outputs):
            value = np.asarray(result[output], np.float32)
            out[name] = np.rint(value).astype(np.int32) \
                if self.spec.dtype_of(name) == "int32" else value
        return out

    def _loss_and_gradients(self, prepared):
        """Training-mode forward and backward with no update; running statistics are restored."""
        saved = [s.value.copy() for s in self._statistics]
        value, named = self._gradients(self._loss, prepared.native, self.trainable_names())
        for constant, saved_value in zip(self._statistics, saved):
            constant.value = saved_value
        return value, named

    # -- weights ----------------------------------------------------------------------------------
    def _get_weights(self):
        return OrderedDict((n, np.array(v.value, np.float32)) for n, v in self._vars.items())

    def _set_weights(self, weights):
        for n, value in weights.items():
            self._vars[n].value = np.ascontiguousarray(value, np.float32)


# -- the pieces of a training program ----------------------------------------------------------
def losses_of(loss, values, inputs):
    """One loss term of a program as a scalar (no batch axis)."""
    named = OrderedDict((role, values[v] if v in values else inputs[v])
                        for role, v in loss["inputs"].items())
    return ops.loss(loss["kind"], named, loss["attrs"])


def objective_function(terms, losses, params):
    """The weighted sum of an objective's loss terms. A parameter of the updated group that the
    objective does not reach joins with weight zero: its gradient is then an exact zero (as on
    every backend) instead of a trainer that refuses a learner parameter outside its model."""
    total = None
    for name, weight in terms:
        term = losses[name] if weight == 1.0 else losses[name] * float(weight)
        total = term if total is None else total + term
    reached = set(p.uid for p in total.parameters)
    unreached = [p for p in params if p.uid not in reached]
    for p in unreached:
        total = total + 0.0 * C.reduce_sum(p, axis=C.Axis.all_axes())
    return C.as_composite(total.output.owner) if isinstance(total, C.Function) else total


def _arguments(function, native):
    """The batch's arrays for the arguments ``function`` reads."""
    wanted = set(function.arguments)
    return {var: value for var, value in native.items() if var in wanted}


def clip_weights(params, value):
    """The original WGAN's hook: every weight of the group into [-value, value]."""
    for p in params:
        p.value = np.clip(p.value, -value, value)
