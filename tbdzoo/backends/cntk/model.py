"""The spec graph as a ``cntk.Function`` (the output node's function) plus its training step.

Every input is a ``C.input_variable`` of the per-example shape with CNTK's dynamic batch axis
and no sequence axis (sequences are padded to fixed lengths, so every shape is static; token
ids travel as float32, exact below 2**24). Parameters are ``C.parameter`` objects created from
the NumPy initial values in canonical layout, which is also CNTK's layout for every op used
here; BatchNorm running statistics are ``C.constant`` objects the BN op updates in place.
The train step is CNTK's own ``Trainer.train_minibatch`` (forward, backward and the update in
C++), with the normalized optimizer as a universal learner. Valid Python 3.6.
"""
from collections import OrderedDict

import cntk as C
import numpy as np

from ..base import BackendModel
from . import ops, optimizers


class Model(BackendModel):
    backend = "cntk"

    # -- building ---------------------------------------------------------------------------------
    def _build(self, weights):
        graph = self.spec
        self._ctx = ops.Context(self.seed)
        self._inputs = OrderedDict(
            (i.name, C.input_variable(i.shape, np.float32, name=i.name)) for i in graph.inputs.values())
        self._vars = OrderedDict()
        for name, param in graph.params().items():
            value = np.asarray(weights[name], np.float32)
            if param.trainable:
                self._vars[name] = C.parameter(shape=value.shape, init=value, name=name)
            else:
                self._vars[name] = C.constant(value, shape=value.shape, name=name)
        values = dict(self._inputs)
        for node in graph.nodes.values():
            values[node.name] = self._node(node, values)
        self.native = C.as_composite(values[graph.output].owner)
        loss = graph.loss
        self._loss = ops.softmax_cross_entropy(values[loss["logits"]], self._inputs[loss["labels"]], loss)
        self._trainable = [self._vars[n] for n in self.trainable_names()]
        self.optimizer = optimizers.make(self._trainable, self.hparams)
        self._trainer = C.Trainer(self.native, (self._loss, None), [self.optimizer.learner])
        self._statistics = [self._vars[n] for n, p in graph.params().items() if not p.trainable]

    def _node(self, node, values):
        params = OrderedDict((suffix, self._vars[full])
                             for suffix, full in self.spec.param_names(node).items())
        inputs = [values[i] for i in node.inputs]
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
        return OrderedDict((var, np.ascontiguousarray(batch[name], np.float32))
                           for name, var in self._inputs.items())

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
        self.optimizer.prepare(lr)
        _, outputs = self._trainer.train_minibatch(prepared.native, outputs=[self._loss.output])
        return float(outputs[self._loss.output])

    def synchronize(self):
        """Nothing to wait for: ``train_minibatch`` returns after the forward pass, backward pass
        and update have run (CNTK queues no work past the call), and this backend runs on the CPU."""

    def _predict(self, prepared):
        """``eval`` runs CNTK in inference mode: running statistics, no dropout."""
        return np.asarray(self.native.eval(self._features(prepared)), np.float32)

    def _loss_and_gradients(self, prepared):
        """Training-mode forward and backward with no update; running statistics are restored."""
        saved = [s.value.copy() for s in self._statistics]
        self._set_batchnorm_counts(self._batch_size(prepared))
        args = {v: prepared.native[v] for v in self._loss.arguments}
        state, outputs = self._loss.forward(args, outputs=[self._loss.output],
                                            keep_for_backward=set([self._loss.output]))
        root = {self._loss.output: np.ones((), np.float32)}
        grads = self._loss.backward(state, root, variables=set(self._trainable))
        for constant, value in zip(self._statistics, saved):
            constant.value = value
        named = OrderedDict((n, np.asarray(grads[v], np.float32))
                            for n, v in zip(self.trainable_names(), self._trainable))
        return float(outputs[self._loss.output]), named

    # -- weights ----------------------------------------------------------------------------------
    def _get_weights(self):
        return OrderedDict((n, np.array(v.value, np.float32)) for n, v in self._vars.items())

    def _set_weights(self, weights):
        for n, value in weights.items():
            self._vars[n].value = np.ascontiguousarray(value, np.float32)
