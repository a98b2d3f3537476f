"""The spec graph as a Gluon ``HybridBlock`` whose parameters carry the canonical names.

Two hybridized blocks share one set of Parameters:

* :class:`SpecBlock` is ``Model.native``: inputs -> output node, what a user imports into a
  Gluon program (``net(x)``; ``net.collect_params()`` keys are the canonical names).
* :class:`TrainBlock` holds it as a child and computes the loss in the same cached graph, plus
  each batch-norm's batch mean and variance, so the train step can update the running
  statistics exactly as the spec says (weight of the new batch, unbiased variance), which
  MXNet's BatchNorm cannot (it uses the biased variance and updates during backward).
"""
from collections import OrderedDict

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

from ..base import BackendModel
from . import ops, optimizers

_CONSTANT_PREFIX = "__constant__."  # canonical names never start with an underscore


class _FromArray(mx.init.Initializer):
    """Loads a given NumPy value: tbdzoo's initial weights, never an MXNet initialiser."""

    def __init__(self, value):
        super(_FromArray, self).__init__()
        self.value = value

    def _init_weight(self, _, arr):
        arr[:] = self.value


class _Plan(object):
    """What the graph walk needs per node, computed once from the spec."""

    def __init__(self, graph):
        self.graph = graph
        self.feature_names = [i.name for i in graph.feature_inputs()]
        self.target_names = [i.name for i in graph.target_inputs()]
        self.steps = []
        self.constants = OrderedDict()
        for node in graph.nodes.values():
            in_shapes = [tuple(graph.shape_of(i)) for i in node.inputs]
            self.steps.append((node, getattr(ops, node.op), in_shapes, graph.param_names(node)))
            self.constants.update(ops.constants_for(node, in_shapes))
        self.batchnorms = [n for n in graph.nodes.values()
                           if n.op == "batchnorm" and n.attrs["track_running_stats"]]

    def run(self, F, values, params, exact_bn_stats):
        """Walk the nodes; returns (node name -> output, [(mean, biased var)] per batchnorm)."""
        values = dict(values)
        constants = {k: params[_CONSTANT_PREFIX + k] for k in self.constants}
        ctx = ops.GraphContext(constants, exact_bn_stats)
        for node, fn, in_shapes, param_names in self.steps:
            ctx.node_name, ctx.in_shapes = node.name, in_shapes
            node_params = {suffix: params[full] for suffix, full in param_names.items()}
            values[node.name] = fn(F, [values[i] for i in node.inputs], node_params, node.attrs,
                                   ctx)
        return values, ctx.bn_stats


class SpecBlock(gluon.HybridBlock):
    """The native model: ``hybrid_forward(F, *features)`` walks the spec and returns the output
    node (canonical layout). A parameter shared by several nodes is one Gluon Parameter.
    Trained by a user's own Gluon loop, batch-norm updates its running statistics MXNet's way
    (biased variance); tbdzoo's train step updates them exactly (see TrainBlock)."""

    def __init__(self, graph, weights, ctx=None):
        super(SpecBlock, self).__init__(prefix="")
        self.plan = _Plan(graph)
        self.spec_params = OrderedDict()  # canonical name -> Parameter
        self.registered = OrderedDict()   # every Parameter hybrid_forward receives, constants too
        ctx = ctx or mx.cpu()
        for name, spec in graph.params().items():
            self.spec_params[name] = self._register(name, weights[name], spec.trainable, ctx)
        for key, table in self.plan.constants.items():
            self._register(_CONSTANT_PREFIX + key, table, False, ctx)

    def _register(self, name, value, trainable, ctx):
        value = np.asarray(value, np.float32)
        param = self.params.get(name, shape=value.shape, dtype="float32",
                                grad_req="write" if trainable else "null",
                                differentiable=trainable, init=_FromArray(value))
        param.initialize(ctx=ctx)
        setattr(self, name, param)  # registered: hybrid_forward receives it by this name
        self.registered[name] = param
        return param

    def hybrid_forward(self, F, *features, **params):
        values, _ = self.plan.run(F, zip(self.plan.feature_names, features), params, False)
        return values[self.plan.graph.output]


class TrainBlock(gluon.HybridBlock):
    """Loss of the spec on (features..., targets...), and the batch statistics, in one graph."""

    def __init__(self, net):
        super(TrainBlock, self).__init__(prefix="")
        self.net = net  # a child: its Parameters are this block's inputs too
        self.plan = net.plan
        for name, param in net.registered.items():
            setattr(self, name, param)

    def hybrid_forward(self, F, *inputs, **params):
        names = self.plan.feature_names + self.plan.target_names
        values, stats = self.plan.run(F, zip(names, inputs), params, True)
        loss = self.plan.graph.loss
        out = ops.softmax_cross_entropy(F, values[loss["logits"]], values[loss["labels"]], loss)
        return [out] + [s for pair in stats for s in pair]


class Model(BackendModel):
    backend = "mxnet"

    def _build(self, weights):
        self.ctx = mx.cpu()
        self.native = SpecBlock(self.spec, weights, self.ctx)
        self.native.hybridize(static_alloc=True, static_shape=True)
        self._train_block = TrainBlock(self.native)
        self._train_block.hybridize(static_alloc=True, static_shape=True)
        self._trainable = [self.native.spec_params[n] for n in self.trainable_names()]
        self.optimizer = optimizers.make(self._trainable, self.hparams)
        self._batchnorms = []  # (running mean, running var, momentum, values per channel / N)
        for node in self.native.plan.batchnorms:
            names = self.spec.param_names(node)
            self._batchnorms.append((self.native.spec_params[names["running_mean"]],
                                     self.native.spec_params[names["running_var"]],
                                     node.attrs["momentum"], int(np.prod(node.shape[1:]))))

    def _prepare(self, batch):
        """Every input as float32 NDArray (token ids and labels are exact in float32)."""
        plan = self.native.plan
        def array(name):
            return nd.array(np.asarray(batch[name], np.float32), ctx=self.ctx, dtype="float32")
        return {"features": [array(n) for n in plan.feature_names],
                "targets": [array(n) for n in plan.target_names],
                "batch_size": len(batch[plan.feature_names[0]])}

    def _forward_backward(self, prepared):
        """Training-mode loss and gradients; returns (loss NDArray, batch statistics)."""
        p = prepared.native
        with autograd.record():
            outputs = self._train_block(*(p["features"] + p["targets"]))
        outputs[0].backward()
        return outputs[0], outputs[1:]

    def _update_statistics(self, stats, batch_size):
        """running = (1 - m) running + m batch, with the unbiased variance (spec semantics)."""
        for i, (running_mean, running_var, m, per_example) in enumerate(self._batchnorms):
            n = batch_size * per_example  # values per channel
            optimizers.axpby(running_mean.data(), stats[2 * i], 1.0 - m, m)
            optimizers.axpby(running_var.data(), stats[2 * i + 1], 1.0 - m,
                             m * n / max(n - 1.0, 1.0))

    def _train_step_async(self, prepared, lr):
        """Queue one step on MXNet's engine; returns the loss NDArray without waiting."""
        loss, stats = self._forward_backward(prepared)
        self._update_statistics(stats, prepared.native["batch_size"])
        self.optimizer.step(lr)
        return loss

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
        return self.native(*prepared.native["features"]).asnumpy()

    def _loss_and_gradients(self, prepared):
        """No side effects: the running statistics are not updated (as in the reference)."""
        loss, _ = self._forward_backward(prepared)
        grads = OrderedDict((n, p.grad().asnumpy()) for n, p in
                            zip(self.trainable_names(), self._trainable))
        return loss.asscalar(), grads

    def _get_weights(self):
        return OrderedDict((n, p.data().asnumpy()) for n, p in self.native.spec_params.items())

    def _set_weights(self, weights):
        for n, value in weights.items():
            self.native.spec_params[n].set_data(value)  # copies into the bound array

    # -- measuring -------------------------------------------------------------------------
    def measure_memory(self, prepared):
        """Weights (every parameter of the model's state, running statistics included), the
        gradient buffers Gluon keeps between steps and the optimizer's state arrays, read off
        the arrays themselves."""
        def size(a):
            return a.size * np.dtype(a.dtype).itemsize
        slots = [a for name in ("buffers", "means", "variances")
                 for a in getattr(self.optimizer, name, None) or []]
        return {"weights": sum(size(p.data()) for p in self.native.spec_params.values()),
                "gradients": sum(size(p.grad()) for p in self._trainable),
                "optimizer_state": sum(size(a) for a in slots)}
