"""The JAX backend: the model is a tree of Flax NNX modules (tbdzoo/backends/jax/native.py),
trained by one jitted XLA program per update.

A step is ``nnx.jit`` of forward, loss, backward (``nnx.value_and_grad``) and the optimizer's
update (an ``nnx.Optimizer`` over the Optax transformation of optimizers.py, which takes the
scheduled learning rate as an argument), with the model's and the optimizer's buffers donated,
so XLA updates them in place. The non-finite guard runs inside the same program: where the loss
or the gradients' global norm is not finite, every variable (weights, running statistics,
optimizer slots) keeps its value from before the step, and the host reads the flag with the
loss. Dropout draws from a key folded from the model's seed and the step count.

A training program (tbdzoo/spec/program.py) gets one optimizer per parameter group (its
parameters picked by their paths) and one jitted update per phase, which differentiates the
phase's objective with respect to its group alone; its targets step runs between the halves
on the host, as on every backend.
"""
from . import framework  # noqa: F401  (first: JAX imported quietly, full float32 precision)

# isort: split
from collections import OrderedDict

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from ...errors import UnsupportedOptionError
from ...spec.program import objective_values
from ..base import BackendModel
from . import native as jax_native
from . import ops, optimizers


class Model(BackendModel):
    backend = "jax"
    RUNS_PROGRAMS = True

    # -- options ---------------------------------------------------------------------------------
    def _resolve_device(self, device):
        """Default: the first GPU when this jaxlib sees one, else the CPU."""
        gpus = _gpus()
        if device is None:
            return "cuda:0" if gpus else "cpu"
        if device == "cpu":
            return device
        if isinstance(device, str) and device.startswith("cuda"):
            index = int(device.split(":")[1]) if ":" in device else 0
            if index >= len(gpus):
                raise UnsupportedOptionError("device {!r} is not available: JAX sees {} GPU(s)"
                                             .format(device, len(gpus)))
            return "cuda:{}".format(index)
        raise ValueError("device must be 'cpu' or 'cuda:N', not {!r}".format(device))

    @property
    def jax_device(self):
        if self.device == "cpu":
            return jax.devices("cpu")[0]
        return _gpus()[int(self.device.split(":")[1])]

    # -- building --------------------------------------------------------------------------------
    def _build(self, weights):
        self.native = jax_native.build(self.spec, weights, self.seed, self.jax_device)
        self._key = jax.device_put(jax.random.PRNGKey(self.seed), self.jax_device)
        self._jitted = {}
        if self.program is None:
            self.optimizer = nnx.Optimizer(self.native, optimizers.make(self.hparams),
                                           wrt=nnx.Param)
            self._commit(self.native, self.optimizer)
            return
        owner = self.program.assignment(self.spec)
        self._group_filters = OrderedDict()
        for group in self.program.groups:
            paths = frozenset(self.native.state_path(n) for n, g in owner.items() if g == group)
            self._group_filters[group] = nnx.All(nnx.Param, _PathIn(paths))
        self._optimizers = OrderedDict(
            (g, nnx.Optimizer(self.native, optimizers.make_group(spec),
                              wrt=self._group_filters[g]))
            for g, spec in self.program.groups.items())
        self._commit(self.native, *self._optimizers.values())

    def _commit(self, *held):
        """Every variable of ``held`` committed to the model's device, as the step's outputs
        will be (else the second step would compile the program again, for other inputs)."""
        nnx.update(held, jax.device_put(nnx.as_pure(nnx.state(held)), self.jax_device))

    def _step_key(self, *indices):
        """The dropout key of this step (and of the update ``indices`` name within it): a
        refused step leaves step_count, so its retry draws the same masks."""
        key = jax.random.fold_in(self._key, self.step_count)
        for index in indices:
            key = jax.random.fold_in(key, index)
        return key

    # -- the objectives --------------------------------------------------------------------------
    def _loss(self, model, batch):
        """The graph's loss on ``batch`` (a pass's context is open)."""
        spec = self.spec.loss
        logits = model.values(batch, [spec["logits"]])[spec["logits"]]
        return ops.softmax_cross_entropy(logits, batch[spec["labels"]], spec)

    def _objective(self, phase_index, model, batch):
        """The weighted sum of the loss terms of phase ``phase_index``'s objective."""
        program = self.program
        name = program.phases[phase_index]["objective"]
        nodes = [v for v in objective_values(program, name) if v in self.spec.nodes]
        values = model.values(batch, nodes)
        total = None
        for term, weight in program.objectives[name]:
            loss = program.losses[term]
            inputs = {r: values[v] if v in values else batch[v] for r, v in loss["inputs"].items()}
            value = weight * ops.loss(loss["kind"], inputs, loss["attrs"])
            total = value if total is None else total + value
        return total

    def _objective_of(self, phase_index):
        if phase_index is None:
            return self._loss
        return lambda model, batch: self._objective(phase_index, model, batch)

    # -- steps -----------------------------------------------------------------------------------
    def _update_function(self, phase_index):
        """The jitted update of phase ``phase_index`` (None: the graph's loss): (loss, the
        non-finite flag)."""
        if phase_index in self._jitted:
            return self._jitted[phase_index]
        objective = self._objective_of(phase_index)
        wrt = nnx.Param if phase_index is None else \
            self._group_filters[self.program.phases[phase_index]["update"]]
        hooks = [] if phase_index is None else self.program.phases[phase_index]["hooks"]
        hook_filters = [(self._group_filters[h["group"]], h["value"]) for h in hooks]
        guard = self.guard_steps

        def update(model, optimizer, batch, lr, key):
            before = nnx.as_pure(nnx.state((model, optimizer)))

            def loss_fn(m):
                with ops.running(ops.Context(True, key)) as ctx:
                    ctx.root = m
                    return objective(m, batch)
            loss, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, wrt))(model)
            grads = self._reduce_gradients(grads)
            optimizer.update(model, grads, learning_rate=lr)
            for where, value in hook_filters:   # the original WGAN's weight clipping
                clipped = jax.tree.map(lambda w, c=value: jnp.clip(w, -c, c),
                                       nnx.as_pure(nnx.state(model, where)))
                nnx.update(model, clipped)
            if not guard:
                return loss, jnp.zeros((), bool)
            bad = self._any_replica(~jnp.isfinite(loss + optax.global_norm(grads)))
            after = nnx.as_pure(nnx.state((model, optimizer)))
            nnx.update((model, optimizer), jax.tree.map(
                lambda old, new: jnp.where(bad, old, new), before, after))
            return loss, bad

        self._jitted[phase_index] = self._compile_update(update)
        return self._jitted[phase_index]

    # The data-parallel engine's hooks (distributed.py): inside the traced update, the
    # gradients and the non-finite flag as every replica's; and the compiled update itself.
    def _reduce_gradients(self, grads):
        return grads

    def _any_replica(self, flag):
        return flag

    def _compile_update(self, update):
        return nnx.jit(update, donate_argnums=(0, 1))

    def _train_step(self, prepared, lr):
        fn = self._update_function(None)
        loss, bad = fn(self.native, self.optimizer, prepared.native, jnp.float32(lr),
                       self._step_key())
        if bool(bad):
            raise self._nonfinite_error(["loss"])
        return float(loss)

    def _update(self, phase_index, native, lr):
        phase = self.program.phases[phase_index]
        fn = self._update_function(phase_index)
        index = self.group_steps[phase["update"]]
        loss, bad = fn(self.native, self._optimizers[phase["update"]], native, jnp.float32(lr),
                       self._step_key(phase_index, index))
        if bool(bad):
            raise self._nonfinite_error([phase["objective"]])
        return loss

    def _save_state(self):
        """A copy of every variable of the model and the optimizers (the step's donated
        buffers are updated in place, so a reference would not do)."""
        held = (self.native,) + tuple(self._optimizers.values())
        return jax.tree.map(jnp.copy, nnx.as_pure(nnx.state(held)))

    def _restore_state(self, saved, where=None):
        held = (self.native,) + tuple(self._optimizers.values())
        nnx.update(held, saved)

    # -- gradients, inference --------------------------------------------------------------------
    def _gradient_function(self, phase_index):
        key = ("gradients", phase_index)
        if key in self._jitted:
            return self._jitted[key]
        objective = self._objective_of(phase_index)
        wrt = nnx.Param if phase_index is None else \
            self._group_filters[self.program.phases[phase_index]["update"]]

        def gradients(model, batch, key):
            statistics = nnx.as_pure(nnx.state(model, nnx.BatchStat))

            def loss_fn(m):
                with ops.running(ops.Context(True, key)) as ctx:
                    ctx.root = m
                    return objective(m, batch)
            loss, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, wrt))(model)
            nnx.update(model, statistics)  # no side effects: statistics as they were
            return loss, nnx.as_pure(grads)

        self._jitted[key] = nnx.jit(gradients)
        return self._jitted[key]

    def _gradient_key(self, *indices):
        """A fresh dropout key for each loss_and_gradients call (it takes no step)."""
        self._gradient_calls = getattr(self, "_gradient_calls", 0) + 1
        return self._step_key(_GRADIENT_DRAWS, self._gradient_calls, *indices)

    def _canonical_gradients(self, grads, names):
        flat = {tuple(str(k) for k in path): value for path, value in nnx.to_flat_state(grads)}
        out = OrderedDict()
        for n in names:
            _, _, to_canonical = self.native.variable(n)
            value = flat[self.native.state_path(n)]
            out[n] = np.asarray(to_canonical(np.asarray(getattr(value, "value", value))),
                                np.float32)
        return out

    def _loss_and_gradients(self, prepared):
        loss, grads = self._gradient_function(None)(self.native, prepared.native,
                                                     self._gradient_key())
        return float(loss), self._canonical_gradients(grads, self.trainable_names())

    def _program_gradients(self, prepared):
        losses, grads, seen = OrderedDict(), OrderedDict(), set()
        owner = self.program.assignment(self.spec)
        for phase_index, native in prepared.native:
            if phase_index in seen:
                continue
            seen.add(phase_index)
            phase = self.program.phases[phase_index]
            loss, g = self._gradient_function(phase_index)(self.native, native,
                                                            self._gradient_key(phase_index))
            names = [n for n in self.trainable_names() if owner[n] == phase["update"]]
            grads.update(self._canonical_gradients(g, names))
            losses[phase["objective"]] = float(loss)
        return losses, grads

    def _inference_function(self, names):
        key = ("values",) + tuple(names)
        if key not in self._jitted:
            def values(model, batch):
                with ops.running(ops.Context(False)) as ctx:
                    ctx.root = model
                    return dict(model.values(batch, list(names)))
            self._jitted[key] = nnx.jit(values)
        return self._jitted[key]

    def _predict(self, prepared):
        output = self.spec.output
        return np.asarray(self._inference_function((output,))(self.native,
                                                              prepared.native)[output])

    def _values(self, prepared, names):
        out = self._inference_function(tuple(names))(self.native, prepared.native)
        return OrderedDict((n, np.asarray(out[n]).astype(
            np.int32 if self.spec.dtype_of(n) == "int32" else np.float32)) for n in names)

    def _prepare(self, batch):
        out = OrderedDict()
        for name in self.spec.inputs:
            if name in batch:
                kind = self.spec.inputs[name].dtype
                array = np.asarray(batch[name], np.int32 if kind == "int32" else np.float32)
                out[name] = jax.device_put(array, self.jax_device)
        return out

    # -- weights ---------------------------------------------------------------------------------
    def _get_weights(self):
        out = OrderedDict()
        for n in self.spec.params():
            var, _, to_canonical = self.native.variable(n)
            out[n] = np.array(to_canonical(np.asarray(var.value)), np.float32)
        return out

    def _set_weights(self, weights):
        jax_native.set_canonical(self.native, weights, self.jax_device)

    def framework_version(self):
        return jax.__version__


# The tag of loss_and_gradients' keys, apart from every step's updates.
_GRADIENT_DRAWS = 2 ** 31 - 1


class _PathIn:
    """An NNX filter: the variables at one of ``paths`` (tuples of names)."""

    def __init__(self, paths):
        self.paths = paths

    def __call__(self, path, value):
        return tuple(str(p) for p in path) in self.paths

    def __repr__(self):
        return "PathIn({} paths)".format(len(self.paths))


def _gpus():
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []
