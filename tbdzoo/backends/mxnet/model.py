"""The spec graph as Gluon ``HybridBlock``s whose parameters carry the canonical names.

Every block reads one set of Gluon Parameters, created once by the model (make_parameters):

* ``Model.native`` is the model as Gluon blocks and layers (native.py), inputs -> output node,
  what a user imports into a Gluon program (``net(x)``; ``net.collect_params()`` keys are the
  canonical names). The blocks below train the same Parameters.
* :class:`TrainBlock` computes the loss of a graph with one loss in one cached graph, plus
  each batch-norm's batch mean and variance, so the train step can update the running
  statistics exactly as the spec says (weight of the new batch, unbiased variance), which
  MXNet's BatchNorm cannot (it uses the biased variance and updates during backward).
* :class:`ObjectiveBlock` does the same for one phase of a training program: the weighted sum
  of its objective's losses, from only the inputs that objective reads.

Batch norm in both runs MXNet's BatchNorm operator in float64 (ops.batchnorm says why);
``Model.EXACT_BATCH_STATISTICS`` builds a program's batch moments from MXNet reductions
instead (see there).

Each block walks only the nodes its outputs need and binds only the parameters they read.
"""
from . import framework  # noqa: F401  (first: numpy.bool for mxnet 1.9.1, quiet import)

# isort: split
import warnings
from collections import OrderedDict

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

from ...errors import UnsupportedOptionError
from ...spec.tree import build_tree
from ..base import BackendModel
from ..programs import objective_values, values_read
from . import (
    losses,
    ops,
    optimizers,
)
from . import native as gluon_tree

_CONSTANT_PREFIX = gluon_tree.CONSTANT_PREFIX


class _FromArray(mx.init.Initializer):
    """Loads a given NumPy value: tbdzoo's initial weights, never an MXNet initialiser."""

    def __init__(self, value):
        super().__init__()
        self.value = value

    def _init_weight(self, _, arr):
        arr[:] = self.value


class _Plan:
    """What the graph walk needs per node, computed once from the spec: every node, or with
    ``outputs`` only the nodes those values depend on, and the inputs they read. ``training``:
    the walk of a training block, which reads constants an inference walk does not (Gluon
    warns of a bound parameter that no computation reads)."""

    def __init__(self, graph, outputs=None, training=False):
        self.graph = graph
        needed = values_read(graph, outputs) if outputs is not None else None
        nodes = [n for n in graph.nodes.values() if needed is None or n.name in needed]
        self.input_names = [n for n in graph.inputs if needed is None or n in needed]
        self.feature_names = [i.name for i in graph.feature_inputs() if i.name in self.input_names]
        self.target_names = [i.name for i in graph.target_inputs() if i.name in self.input_names]
        self.steps = []
        self.constants = OrderedDict()
        self.parameter_names = []  # the spec parameters the walk reads, each once
        for node in nodes:
            in_shapes = [tuple(graph.shape_of(i)) for i in node.inputs]
            param_names = graph.param_names(node)
            self.steps.append((node, getattr(ops, node.op), in_shapes, param_names))
            self.constants.update(ops.constants_for(node, in_shapes, training))
            self.parameter_names.extend(n for n in param_names.values()
                                        if n not in self.parameter_names)
        self.batchnorms = [n for n in nodes if n.op in ("batchnorm", "sequence_batchnorm")
                           and n.attrs["track_running_stats"]]

    def bound_names(self):
        """Names of every Parameter the walk receives: spec parameters and constant tables."""
        return self.parameter_names + [_CONSTANT_PREFIX + k for k in self.constants]

    def run(self, F, values, params, exact_bn_stats, two_pass_statistics=False, constant=()):
        """Walk the nodes; returns (value name -> output, [(mean, biased var)] per batchnorm).
        ``two_pass_statistics``: batch-norm's batch variance in two passes (ops.batchnorm);
        ``constant``: nodes whose outputs pass through BlockGrad (no backward pass into them)."""
        values = dict(values)
        constants = {k: params[_CONSTANT_PREFIX + k] for k in self.constants}
        ctx = ops.GraphContext(constants, exact_bn_stats, two_pass_statistics)
        for node, fn, in_shapes, param_names in self.steps:
            ctx.node_name, ctx.in_shapes = node.name, in_shapes
            node_params = {suffix: params[full] for suffix, full in param_names.items()}
            value = fn(F, [values[i] for i in node.inputs], node_params, node.attrs, ctx)
            values[node.name] = F.BlockGrad(value) if node.name in constant else value
        return values, ctx.bn_stats

    def depending_on(self, parameter_names):
        """Names of the nodes whose output depends on one of ``parameter_names``."""
        wanted, out = set(parameter_names), set()
        for node, _, _, param_names in self.steps:
            if wanted.intersection(param_names.values()) or out.intersection(node.inputs):
                out.add(node.name)
        return out


def make_parameters(graph, weights, ctx):
    """canonical name -> initialised Gluon Parameter, for every spec parameter and (under
    ``__constant__.``) every constant table a node reads; one Parameter per shared name."""
    parameters = OrderedDict()

    def make(name, value, trainable, dtype="float32"):
        value = np.asarray(value, dtype)
        param = gluon.Parameter(name, shape=value.shape, dtype=dtype,
                                grad_req="write" if trainable else "null",
                                differentiable=trainable, init=_FromArray(value))
        param.initialize(ctx=ctx)
        parameters[name] = param

    for name, spec in graph.params().items():
        make(name, weights[name], spec.trainable)
    for key, table in _Plan(graph, training=True).constants.items():
        make(_CONSTANT_PREFIX + key, table, False,
             "float64" if key.startswith(ops.FLOAT64_PREFIX) else "float32")
    return parameters


class _GraphBlock(gluon.HybridBlock):
    """A block that walks ``plan`` over the Parameters it reads (which it holds, so that
    ``collect_params()`` and hybridization see exactly those)."""

    def __init__(self, plan, parameters):
        super().__init__(prefix="")
        self.plan = plan
        bound = OrderedDict((n, parameters[n]) for n in plan.bound_names())
        self.params.update(bound)
        for name, param in bound.items():
            setattr(self, name, param)  # registered: hybrid_forward receives it by this name


class ValuesBlock(_GraphBlock):
    """Named graph values in inference mode from the inputs they read (a program's targets
    step reads them)."""

    def __init__(self, graph, names, parameters):
        super().__init__(_Plan(graph, names), parameters)
        self.names = list(names)

    def hybrid_forward(self, F, *inputs, **params):
        values, _ = self.plan.run(F, zip(self.plan.input_names, inputs), params, False)
        return [values[n] for n in self.names]


class _StatisticsBlock(_GraphBlock):
    """A training block: it returns batch statistics, from which the caller updates the
    running ones."""

    def forward(self, *args):
        """The first call builds the cached graph, where Gluon warns that the running
        statistics are read by no computation (two-pass batch norm, sequence_batchnorm): here
        they are updated from the moments this block returns, which is intended, so that one
        warning is silenced."""
        if getattr(self, "_cache_built", False):
            return super().forward(*args)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Parameter .* is not used by any computation")
            out = super().forward(*args)
        self._cache_built = True
        return out


class TrainBlock(_StatisticsBlock):
    """Loss of the spec on (features..., targets...), and the batch statistics, in one graph."""

    def __init__(self, graph, parameters):
        super().__init__(_Plan(graph, training=True), parameters)

    def hybrid_forward(self, F, *inputs, **params):
        names = self.plan.feature_names + self.plan.target_names
        values, stats = self.plan.run(F, zip(names, inputs), params, True)
        loss = self.plan.graph.loss
        out = ops.softmax_cross_entropy(F, values[loss["logits"]], values[loss["labels"]], loss)
        return [out] + [s for pair in stats for s in pair]


class ObjectiveBlock(_StatisticsBlock):
    """One phase's objective on (the inputs it reads...), and the batch statistics, in one
    graph. Trainable parameters outside the phase's group enter through BlockGrad, so the
    backward pass differentiates with respect to the group only (a generator update does not
    compute the critic's weight gradients). ``exact_statistics``: batch norm by the two-pass
    moments of ops.batchnorm instead of MXNet's fused operator."""

    def __init__(self, graph, objective, group_names, parameters, exact_statistics=False):
        program = graph.program
        super().__init__(
            _Plan(graph, objective_values(program, objective), training=True), parameters)
        self.terms = [(program.losses[name], weight) for name, weight in
                      program.objectives[objective]]
        self.exact_statistics = exact_statistics
        group = set(group_names)
        self.frozen = frozenset(n for n in self.plan.parameter_names
                                if parameters[n].grad_req != "null" and n not in group)
        # values no group parameter reaches need no backward pass (a critic update does not
        # differentiate through the generator)
        reached = self.plan.depending_on(group)
        self.constant = frozenset(node.name for node, _, _, _ in self.plan.steps
                                  if node.name not in reached)

    def hybrid_forward(self, F, *inputs, **params):
        params = {n: F.BlockGrad(v) if n in self.frozen else v for n, v in params.items()}
        values, stats = self.plan.run(F, zip(self.plan.input_names, inputs), params, True,
                                      self.exact_statistics, self.constant)
        total = None
        for loss, weight in self.terms:
            roles = loss["inputs"].items()
            value = weight * losses.evaluate(
                F, loss["kind"], OrderedDict((role, values[v]) for role, v in roles),
                loss["attrs"], dict((role, self.plan.graph.shape_of(v)) for role, v in roles))
            total = value if total is None else total + value
        return [total] + [s for pair in stats for s in pair]


class _Pending:
    """An objective's value still on MXNet's engine; ``float()`` waits for everything queued
    (the step's backward passes and updates too), so a step returns only once it has run."""

    def __init__(self, array, synchronize):
        self.array, self.synchronize = array, synchronize

    def __float__(self):
        self.synchronize()
        return float(self.array.asscalar())


class Model(BackendModel):
    backend = "mxnet"
    RUNS_PROGRAMS = True
    # Batch norm inside a training program. False: MXNet's BatchNorm operator in float64
    # (ops.batchnorm), whose batch mean and variance then update the running statistics
    # exactly, as in single-loss models. True: moments from MXNet's reductions, in two passes
    # with compensated sums, as exact and slower: broadcasts and reductions that index every
    # element, 14 s against 2.7 s for a paper-config step at batch 4 on two CPU cores.
    EXACT_BATCH_STATISTICS = False

    def _build(self, weights):
        self.ctx = mx.cpu()
        self._parameters = make_parameters(self.spec, weights, self.ctx)
        self._spec_params = OrderedDict((n, self._parameters[n]) for n in self.spec.params())
        self._tree = build_tree(self.spec)
        self.native = gluon_tree.build_block(self._tree, self.spec, self._parameters)
        self._built = gluon_tree.structure(self.native)
        self.native.hybridize(static_alloc=True, static_shape=True)
        self._trainable = [self._parameters[n] for n in self.trainable_names()]
        if self.program is not None:
            self._build_program()
            return
        self._train_block = TrainBlock(self.spec, self._parameters)
        self._train_block.hybridize(static_alloc=True, static_shape=True)
        self.optimizer = optimizers.make(self._trainable, self.hparams)
        self._batchnorms = self._statistics_of(self._train_block.plan)

    def _check_native(self, action):
        """Raise UnsupportedOptionError when a child of ``native`` was replaced: tbdzoo's
        training, weights and gradients work on the model as built."""
        changed = gluon_tree.replaced(self._built)
        if changed:
            raise UnsupportedOptionError(
                "{} works on the model as built, and model.native.{} was replaced: train the "
                "changed Gluon block with a gluon.Trainer (its collect_params()), or build the "
                "model again".format(action, changed[0]))

    def _statistics_of(self, plan):
        """(running mean, running var, momentum, values per channel / N) per tracked batchnorm;
        None for a sequence_batchnorm, whose valid steps are data: its graph returns the
        unbiased variance itself."""
        out = []
        for node in plan.batchnorms:
            names = self.spec.param_names(node)
            per_example = int(np.prod(node.shape[1:])) if node.op == "batchnorm" else None
            out.append((self._parameters[names["running_mean"]],
                        self._parameters[names["running_var"]],
                        node.attrs["momentum"], per_example))
        return out

    # -- training programs -------------------------------------------------------------------
    def _build_program(self):
        """One optimizer per parameter group; one hybridized objective block per phase, with
        the group's parameters it cannot reach (their gradients are zero)."""
        program = self.program
        owner = program.assignment(self.spec)
        self._group_names = OrderedDict(
            (g, [n for n, o in owner.items() if o == g]) for g in program.groups)
        self._group_params = OrderedDict(
            (g, [self._parameters[n] for n in names]) for g, names in self._group_names.items())
        self._optimizers = OrderedDict(
            (g, optimizers.make_group(self._group_params[g], spec["optimizer"]))
            for g, spec in program.groups.items())
        self._phases = []  # (block, unreached parameters, batch-norm statistics)
        for phase in program.phases:
            names = self._group_names[phase["update"]]
            block = ObjectiveBlock(self.spec, phase["objective"], names, self._parameters,
                                   self.EXACT_BATCH_STATISTICS)
            block.hybridize(static_alloc=True, static_shape=True)
            read = set(block.plan.parameter_names)
            unreached = [self._parameters[n] for n in names if n not in read]
            self._phases.append((block, unreached, self._statistics_of(block.plan)))

    def _objective_backward(self, phase_index, native):
        """Training-mode objective and its gradients in the group's ``.grad()``; returns
        (objective NDArray, batch statistics)."""
        self._check_native("training (train_step, loss_and_gradients)")
        block, unreached, _ = self._phases[phase_index]
        arrays = native["arrays"]
        with autograd.record():
            outputs = block(*[arrays[n] for n in block.plan.input_names])
        outputs[0].backward()
        for param in unreached:
            param.grad()[:] = 0
        return outputs[0], outputs[1:]

    def _update(self, phase_index, native, lr):
        phase = self.program.phases[phase_index]
        group = phase["update"]
        statistics = self._phases[phase_index][2]
        # MXNet's batch norm writes its running statistics in the forward pass (with weight 0
        # for the batch, which a NaN still reaches): they are copied before it
        saved = self._saved_before_update([self._optimizers[group]], statistics)
        try:
            value, stats = self._objective_backward(phase_index, native)
            self._reduce_gradients(self._group_params[group])
            squares = self._check_finite(value, self._group_params[group], phase["objective"])
            self._update_statistics(statistics, stats, native["batch_size"])
            scale = optimizers.gradient_scale(self._group_params[group],
                                              self.program.groups[group]["clip"], squares)
            self._optimizers[group].step(lr, grad_scale=scale)
            for hook in phase["hooks"]:
                optimizers.clip_weights(self._group_params[hook["group"]], hook["value"])
            if saved is not None:
                nd.waitall()  # an operator's failure surfaces here, while the copy is kept
        except BaseException:
            self._put_back(saved)
            raise
        return _Pending(value, self.synchronize)

    def _program_gradients(self, prepared):
        """Each phase's objective and its group's gradients on the phase's first batch; no
        update, running statistics untouched."""
        values, grads, seen = OrderedDict(), OrderedDict(), set()
        for phase_index, native in prepared.native:
            if phase_index in seen:
                continue
            seen.add(phase_index)
            objective = self.program.phases[phase_index]["objective"]
            group = self.program.phases[phase_index]["update"]
            value, _ = self._objective_backward(phase_index, native)
            for name, param in zip(self._group_names[group], self._group_params[group]):
                grads[name] = param.grad().asnumpy()
            values[objective] = value.asscalar()
        return values, grads

    # -- steps -------------------------------------------------------------------------------
    def _prepare(self, batch):
        """Every input given as a float32 NDArray (token ids and labels are exact in float32);
        a training program's update or a prediction may give only the inputs it reads.
        Lengths and CTC labels were checked before (BackendModel._check_batch): MXNet's CTC
        scores an unalignable example 0 without a word."""
        arrays = OrderedDict((name, nd.array(np.asarray(batch[name], np.float32), ctx=self.ctx,
                                             dtype="float32"))
                             for name in self.spec.inputs if name in batch)
        return {"arrays": arrays, "batch_size": len(next(iter(arrays.values())))}

    def _forward_backward(self, prepared):
        """Training-mode loss and gradients; returns (loss NDArray, batch statistics)."""
        self._check_native("training (train_step, loss_and_gradients)")
        p, plan = prepared.native, self._train_block.plan
        with autograd.record():
            outputs = self._train_block(*[p["arrays"][n] for n in
                                          plan.feature_names + plan.target_names])
        outputs[0].backward()
        return outputs[0], outputs[1:]

    def _update_statistics(self, batchnorms, stats, batch_size):
        """running = (1 - m) running + m batch, with the unbiased variance (spec semantics):
        every layer's means in one AxpbyAll, then every variance; a layer of momentum 0 keeps
        its statistics and is left out."""
        moving, means, variances = self._statistics_updates(batchnorms, batch_size)
        if moving:
            means([batchnorms[i][0].data() for i in moving], [stats[2 * i] for i in moving])
            variances([batchnorms[i][1].data() for i in moving],
                      [stats[2 * i + 1] for i in moving])

    def _statistics_updates(self, batchnorms, batch_size):
        """(indices of the layers that move, their two AxpbyAll), built on first use."""
        cache = self.__dict__.setdefault("_statistics_cache", {})
        key = (id(batchnorms), batch_size)
        if key not in cache:
            moving = [i for i, b in enumerate(batchnorms) if b[2] != 0]
            m = np.array([batchnorms[i][2] for i in moving], np.float64)
            unbiased = m.copy()  # a count of None: the variance given is already unbiased
            for j, i in enumerate(moving):
                if batchnorms[i][3] is not None:
                    n = float(batch_size * batchnorms[i][3])  # values per channel
                    unbiased[j] = m[j] * n / max(n - 1.0, 1.0)
            cache[key] = (moving, optimizers.AxpbyAll(1.0 - m, m, len(m), self.ctx),
                          optimizers.AxpbyAll(1.0 - m, unbiased, len(m), self.ctx))
        return cache[key]

    def _train_step_async(self, prepared, lr):
        """Queue one step on MXNet's engine; returns the loss NDArray. With the guard on
        (docs/backends.md) the step waits for its loss and gradient norm before updating."""
        # MXNet's batch norm writes its running statistics in the forward pass (with weight 0
        # for the batch, which a NaN still reaches): they are copied before it
        saved = self._saved_before_update([self.optimizer], self._batchnorms)
        try:
            loss, stats = self._forward_backward(prepared)
            self._reduce_gradients(self._trainable)
            self._check_finite(loss, self._trainable, "loss")
            self._update_statistics(self._batchnorms, stats, prepared.native["batch_size"])
            self.optimizer.step(lr)
            if saved is not None:
                nd.waitall()  # an operator's failure surfaces here, while the copy is kept
        except BaseException:
            self._put_back(saved)
            raise
        return loss

    # -- atomic steps (docs/backends.md) -------------------------------------------------------
    def _check_finite(self, loss, params, objective):
        """Raise NonFiniteStepError, before anything changed, when the loss or the global norm
        of the gradients is not finite (read on the host: this backend runs on the CPU).
        Returns the gradients' sum of squares it read (for global-norm clipping), or None."""
        if not self.guard_steps:
            return None
        grads = [p.grad() for p in params]
        squares = float(optimizers.sum_of_squares(grads).asscalar()) if grads else None
        if not np.isfinite(float(loss.asscalar()) + (squares or 0.0)):
            raise self._nonfinite_error([objective])
        return squares

    def _saved_before_update(self, optimizers_held, batchnorms):
        """Copies of what a step writes (the weights, the optimizers' state and the running
        statistics of ``batchnorms``), put back if it fails or comes out non-finite."""
        if not self.guard_steps:
            return None
        arrays = [p.data() for p in self._trainable] + \
            [b[i].data() for b in batchnorms for i in (0, 1)] + \
            [a for o in optimizers_held for a in optimizers.state_arrays(o)]
        return (list(zip(arrays, self._guard_copies(optimizers_held, arrays))),
                [(o, o.t) for o in optimizers_held if hasattr(o, "t")])

    def _guard_copies(self, optimizers_held, arrays):
        """Copies of ``arrays`` in buffers kept from the last step of the same optimizers: a
        fresh copy each step pays its pages' first touch (Seq2Seq's 78 M floats: about 90 ms a
        step against 60 ms on a 2-core host). New buffers when the arrays are other ones."""
        kept = self.__dict__.setdefault("_kept_copies", {})
        key = tuple(id(o) for o in optimizers_held)
        ids = tuple((id(a), a.shape, a.dtype) for a in arrays)
        if key in kept and kept[key][0] == ids:
            copies = kept[key][1]
            for array, copy in zip(arrays, copies):
                array.copyto(copy)
            return copies
        copies = [a.copy() for a in arrays]
        kept[key] = (ids, copies)
        return copies

    def _put_back(self, saved):
        if saved is None:
            return
        arrays, counters = saved
        for array, copy in arrays:
            copy.copyto(array)
        for optimizer, t in counters:
            optimizer.t = t
        nd.waitall()

    def _save_state(self):
        """A copy of every parameter (statistics included) and every optimizer's state."""
        every = list(self._optimizers.values()) if self.program is not None else [self.optimizer]
        arrays = [p.data() for p in self._spec_params.values()] + \
            [a for o in every for a in optimizers.state_arrays(o)]
        return ([(a, a.copy()) for a in arrays], [(o, o.t) for o in every if hasattr(o, "t")])

    def _restore_state(self, saved, where=None):
        self._put_back(saved)

    def _train_step(self, prepared, lr):
        """One step, returned only when its backward pass and update have run: reading the
        loss waits for the forward pass alone, and the engine would still hold the rest."""
        loss = self._train_step_async(prepared, lr)
        self.synchronize()
        return loss.asscalar()

    def synchronize(self):
        """Wait until MXNet's engine has run everything queued, on every context."""
        nd.waitall()

    def _predict(self, prepared):
        """The native model's output; run block by block when a forward hook is registered
        on one of its blocks (a hybridized graph calls none of its children)."""
        arrays, net = prepared.native["arrays"], self.native
        inputs = [arrays[n] for n in net.input_names]
        if gluon_tree.has_hooks(net):
            with gluon_tree.imperative(net):
                return net(*inputs).asnumpy()
        return net(*inputs).asnumpy()

    def _values(self, prepared, names):
        """Named graph values in inference mode: by calling the native model's children where
        each value is a child's output (Faster R-CNN's RPN and box head, around the targets
        step and NMS), else by a walk of the graph."""
        key = tuple(names)
        blocks = self.__dict__.setdefault("_values_blocks", {})
        if key not in blocks:
            calls = gluon_tree.value_calls(self._tree, key, self.spec.inputs)
            blocks[key] = calls if calls is not None else \
                ValuesBlock(self.spec, key, self._parameters)
        block, arrays = blocks[key], prepared.native["arrays"]
        if isinstance(block, ValuesBlock):
            outputs = block(*[arrays[n] for n in block.plan.input_names])
            outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        elif gluon_tree.has_hooks(self.native):
            with gluon_tree.imperative(self.native):
                values = gluon_tree.run_calls(self.native, block, arrays)
            outputs = [values[n] for n in key]
        else:
            values = gluon_tree.run_calls(self.native, block, arrays)
            outputs = [values[n] for n in key]
        return OrderedDict((n, _canonical_value(self.spec, n, v.asnumpy()))
                           for n, v in zip(key, outputs))

    def _loss_and_gradients(self, prepared):
        """No side effects: the running statistics are not updated (as in the reference)."""
        loss, _ = self._forward_backward(prepared)
        grads = OrderedDict((n, p.grad().asnumpy()) for n, p in
                            zip(self.trainable_names(), self._trainable))
        return loss.asscalar(), grads

    def _get_weights(self):
        """After every queued operation: BatchNorm's backward writes the running statistics
        as auxiliary state, which reading one array does not always wait for (a user's plain
        Gluon loop, tests/test_recurrent_mxnet.py, read them before the write landed)."""
        self._check_native("get_weights")
        nd.waitall()
        return OrderedDict((n, p.data().asnumpy()) for n, p in self._spec_params.items())

    def _set_weights(self, weights):
        """Copies into the bound arrays from NDArrays: after an inference pass MKLDNN may
        hold a weight in its own blocked layout, which a copy from NumPy (``set_data``)
        cannot write, and an NDArray copy reorders."""
        self._check_native("set_weights")
        for n, value in weights.items():
            target = self._spec_params[n].data()
            target[:] = nd.array(value, ctx=target.context, dtype=target.dtype)

    # -- measuring -------------------------------------------------------------------------
    def measure_memory(self, prepared):
        """Weights (every parameter of the model's state, running statistics included), the
        gradient buffers Gluon keeps between steps and the optimizer's state arrays (every
        group's, in a training program), read off the arrays themselves."""
        def size(a):
            return a.size * np.dtype(a.dtype).itemsize
        optimizer_list = list(self._optimizers.values()) if self.program is not None \
            else [self.optimizer]
        slots = [a for o in optimizer_list for a in optimizers.state_arrays(o)]
        return {"weights": sum(size(p.data()) for p in self._spec_params.values()),
                "gradients": sum(size(p.grad()) for p in self._trainable),
                "optimizer_state": sum(size(a) for a in slots)}


def _canonical_value(graph, name, array):
    """MXNet computes int32 values (token ids, lengths) in float32: back to the spec dtype."""
    if graph.dtype_of(name) == "int32":
        return np.rint(array).astype(np.int32)
    return np.asarray(array, np.float32)
