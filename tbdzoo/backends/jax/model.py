"""The JAX backend: the model is a tree of Flax NNX modules (tbdzoo/backends/jax/native.py),
trained by one jitted XLA program per update.

A step is one ``jax.jit`` program of forward, loss, backward (``nnx.value_and_grad``) and the
optimizer's update (an ``nnx.Optimizer`` over the Optax transformation of optimizers.py, which
takes the scheduled learning rate as an argument), on the values of the model's and the
optimizer's variables, donated, so XLA updates them in place (``_HeldUpdate``). The non-finite
guard runs inside the same program: where the loss or the gradients' global norm is not
finite, every variable (weights, running statistics, optimizer slots) keeps its value from
before the step, and the host reads the flag with the loss. Dropout draws from a key folded
from the model's seed and the step count.

A training program (tbdzoo/spec/program.py) gets one optimizer per parameter group (its
parameters picked by their paths) and one jitted update per phase, which differentiates the
phase's objective with respect to its group alone; its targets step runs between the halves
on the host, as on every backend.
"""
from . import framework  # noqa: F401  (first: JAX imported quietly, full float32 precision)

# isort: split
import contextlib
import functools
import operator
from collections import OrderedDict
from itertools import chain

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from ...errors import UnsupportedOptionError
from ...models.faster_rcnn.detection import kernels
from ...spec.program import objective_values
from ...spec.targets import HostValues
from ..base import BackendModel
from . import layers as jax_layers
from . import native as jax_native
from . import nms as jax_nms
from . import ops, optimizers


class Model(BackendModel):
    backend = "jax"
    RUNS_PROGRAMS = True
    OPTIONS = {"precision": ("fp32", "tf32", "bf16"), "execution": ("default",),
               "memory_format": ("auto", "channels_first")}

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

    def _matmul_precision(self):
        """The matrix-product precision a step runs under: full float32 for fp32 (the backend's
        default, framework.py), TF32 for tf32 (a GPU's tensor cores; XLA on the CPU computes
        float32 either way) and for bf16's products of float32 values."""
        if self.hparams["precision"] == "fp32":
            return contextlib.nullcontext()
        return jax.default_matmul_precision("tensorfloat32")

    def _bf16_layers(self):
        """bf16: the convolutions and dense layers (the Flax layers' ``dtype``; a tied dense
        layer's too) cast their inputs and float32 weights to bfloat16 and compute and return
        bfloat16 (the recurrent cells' gate products too); BatchNorm computes in float32 and
        returns its input's dtype (layers.py); the rest of the graph (layer normalisation, the
        cells' gate arithmetic and state, the losses) computes in float32, and the weights,
        their gradients and the optimizer's state stay float32 (master weights)."""
        for _, module in self.native.iter_modules():
            if isinstance(module, (nnx.Conv, nnx.Linear, jax_layers.TiedLinear)):
                module.dtype = jnp.bfloat16

    # -- building --------------------------------------------------------------------------------
    def _build(self, weights):
        self.native = jax_native.build(self.spec, weights, self.seed, self.jax_device)
        if self.hparams["precision"] == "bf16":
            self._bf16_layers()
        self._key = jax.device_put(jax.random.PRNGKey(self.seed), self.jax_device)
        self._key_block = None  # (its first step, the keys of _KEY_BLOCK steps from there)
        self._jitted = {}
        self._bodies = {}    # phase index -> its update as a Python function (not compiled)
        self._bound = {}     # phase index -> (its optimizer, a _TreeWitness, the bound update)
        self._queued = None  # the loss of the last step dispatched, until synchronize()
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
        refused step leaves step_count, so its retry draws the same masks. The steps' own keys
        are drawn a block at a time and kept on the host (a step passes its key with its
        learning rate, where a fold on the device would be one more dispatch a step)."""
        step = self.step_count
        block = self._key_block
        if block is None or not 0 <= step - block[0] < _KEY_BLOCK:
            start = step - step % _KEY_BLOCK
            block = self._key_block = (start, np.asarray(_fold_in_block(self._key, start)))
        key = block[1][step - block[0]]
        for index in indices:
            key = _fold_in(key, index)
        return key

    # -- the objectives --------------------------------------------------------------------------
    def _loss(self, model, batch):
        """The graph's loss on ``batch`` (a pass's context is open)."""
        spec = self.spec.loss
        logits = model.values(batch, [spec["logits"]])[spec["logits"]]
        return ops.softmax_cross_entropy(ops.float32(logits), batch[spec["labels"]], spec)

    def _objective(self, phase_index, model, batch):
        """The weighted sum of the loss terms of phase ``phase_index``'s objective."""
        program = self.program
        name = program.phases[phase_index]["objective"]
        nodes = [v for v in objective_values(program, name) if v in self.spec.nodes]
        values = model.values(batch, nodes)
        total = None
        for term, weight in program.objectives[name]:
            loss = program.losses[term]
            inputs = {r: ops.float32(values[v] if v in values else batch[v])
                      for r, v in loss["inputs"].items()}
            value = weight * ops.loss(loss["kind"], inputs, loss["attrs"])
            total = value if total is None else total + value
        return total

    def _objective_of(self, phase_index):
        if phase_index is None:
            return self._loss
        return lambda model, batch: self._objective(phase_index, model, batch)

    # -- steps -----------------------------------------------------------------------------------
    def _update_body(self, phase_index):
        """The update of phase ``phase_index`` (None: the graph's loss) as a Python function
        of (model, optimizer, batch, lr, key) -> (loss, the non-finite flag), for ``_bind``."""
        if phase_index in self._bodies:
            return self._bodies[phase_index]
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

        self._bodies[phase_index] = update
        return update

    # The data-parallel engine's hooks (distributed.py): inside the traced update, the
    # gradients and the non-finite flag as every replica's; and the bound update itself
    # (``_bind``).
    def _reduce_gradients(self, grads):
        return grads

    def _any_replica(self, flag):
        return flag

    def _replica_view(self):
        """A context in which ``self.native`` is the model as one replica holds it, for what
        runs on this process's device alone (the whole model here)."""
        return contextlib.nullcontext()

    # -- the steps' held state ------------------------------------------------------------------
    # ``nnx.jit`` walks the model and the optimizer (split before the call, merge after) on every
    # call, and even through ``nnx.cached_partial`` it writes every output back through its
    # graph machinery: for ResNet-50's 429 variables (weights, running statistics, momentum)
    # that host work is longer than an H100's whole step. A step therefore runs a ``_HeldUpdate``:
    # the tree split once into its graph and its list of variables, each step one ``jax.jit``
    # call on the variables' values (donated) that sets the new values on the same variables.
    # A user may change the tree between steps (a new head, a replaced layer), so each step first
    # compares the identities the tree's modules and containers hold with those it was split
    # with (``_TreeWitness``) and splits anew on a change.
    def _bind(self, phase_index, *held):
        """The update of ``phase_index`` on ``held`` (the model, its optimizer): called with
        (batch, lr, key), lowered with the same arguments."""
        return _HeldUpdate(self._update_body(phase_index), held)

    def _bound_update(self, phase_index):
        optimizer = self.optimizer if phase_index is None else \
            self._optimizers[self.program.phases[phase_index]["update"]]
        cached = self._bound.get(phase_index)
        if cached is None or cached[0] is not optimizer or not cached[1].holds(self.native):
            cached = self._bound[phase_index] = (optimizer, _TreeWitness(self.native),
                                                 self._bind(phase_index, self.native, optimizer))
        return cached[2]

    def _run_update(self, phase_index, native, lr, key):
        with self._matmul_precision():
            loss, bad = self._bound_update(phase_index)(native, np.float32(lr), key)
        self._queued = loss
        return loss, bad

    def _train_step(self, prepared, lr):
        loss, bad = self._run_update(None, prepared.native, lr, self._step_key())
        if self.device != "cpu":    # a GPU
            # the host polls for the loss, as a CUDA synchronisation does by default: a thread
            # put to sleep until the GPU is done comes back with cold caches, and the next
            # step's host work before its dispatch took longer (benchmarks/jax_step_anatomy.py:
            # ResNet-50 bf16 on an H100, 14.5 -> 12.8 ms a step)
            while not loss.is_ready():
                pass
        loss, bad = jax.device_get((loss, bad))
        if bad:     # the loss and the flag come back in one transfer
            raise self._nonfinite_error(["loss"])
        return float(loss)

    def _train_step_async(self, prepared, lr):
        """Queue one step without waiting: a non-finite one is skipped on the device (the
        update keeps the old values) and reported at the next synchronisation."""
        loss, bad = self._run_update(None, prepared.native, lr, self._step_key())
        if self.guard_steps:
            self._defer_nonfinite(self.step_count + 1, bad, ["loss"])
        return loss

    def _update(self, phase_index, native, lr):
        phase = self.program.phases[phase_index]
        index = self.group_steps[phase["update"]]
        loss, bad = self._run_update(phase_index, native, lr, self._step_key(phase_index, index))
        if self.guard_steps:    # read with the step's other flags (base._program_step)
            self._step_flags.append((phase["objective"], bad))
        return loss

    def synchronize(self):
        """Wait for the queued steps (each step's program follows the one before through
        the donated state, so the last one's loss is ready when every one is done); raises the
        NonFiniteStepError of the first queued step that was skipped."""
        queued, self._queued = self._queued, None
        if queued is not None:
            jax.block_until_ready(queued)
        self._raise_deferred()

    def _flags_to_host(self, flags):
        # device_get of the list, not jnp.stack: an eager stack compiles for each new count
        return [bool(b) for b in jax.device_get(flags)]

    def _any_flag(self, flags):
        return flags[0] if len(flags) == 1 else jnp.any(jnp.stack(flags))

    def _save_state(self):
        """A copy of every variable of the model and the optimizers (the step's donated
        buffers are updated in place, so a reference would not do)."""
        held = (self.native,) + tuple(self._optimizers.values())
        return _copy(nnx.as_pure(nnx.state(held)))

    def _restore_state(self, saved, where=None):
        """``saved`` back; with ``where`` (a device flag) only where it is true."""
        held = (self.native,) + tuple(self._optimizers.values())
        if where is not None:
            saved = _select(where, saved, nnx.as_pure(nnx.state(held)))
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
        with self._matmul_precision():
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
            with self._matmul_precision():
                loss, g = self._gradient_function(phase_index)(
                    self.native, native, self._gradient_key(phase_index))
            names = [n for n in self.trainable_names() if owner[n] == phase["update"]]
            grads.update(self._canonical_gradients(g, names))
            losses[phase["objective"]] = float(loss)
        return losses, grads

    def _inference_function(self, names):
        """The values ``names`` of (the native model, a prepared batch) in inference mode: one
        ``jax.jit`` of the model's variable values, split once (``_HeldCall``) as the steps'
        updates are, where ``nnx.jit`` would walk the whole tree on every call (a training
        program's targets step calls it each step)."""
        key = ("values",) + tuple(names)
        cached = self._jitted.get(key)
        if cached is None or not cached[0].holds(self.native):
            cached = self._jitted[key] = (_TreeWitness(self.native),
                                          _HeldCall(_values_of(names), (self.native,)))
        return cached[1]

    def _predict(self, prepared):
        output = self.spec.output
        with self._matmul_precision():
            out = self._inference_function((output,))(prepared.native)
        return np.asarray(out[output], np.float32)

    def _values(self, prepared, names):
        values = self._targets_values(prepared, names)
        return OrderedDict((n, values[n]) for n in names)

    def _host_value(self, name, value):
        """A device value as the spec's NumPy dtype (int32, or float32)."""
        return np.asarray(value).astype(
            np.int32 if self.spec.dtype_of(name) == "int32" else np.float32)

    def _targets_values(self, prepared, names):
        """The inference pass queued, each value copied when it is first read: what the targets
        step does with its inputs alone (Faster R-CNN's anchor targets) runs while the device
        computes."""
        with self._matmul_precision():
            out = self._inference_function(tuple(names))(prepared.native)
        return HostValues(((n, functools.partial(self._host_value, n, out[n])) for n in names),
                          ((n, out[n].shape) for n in names))

    def _targets_of(self, part, index, values):
        """The targets step, with its NMS walked on the GPU where the model is on one
        (nms.py: the reference's boxes exactly); on the CPU the NumPy walk is the faster."""
        if self.jax_device.platform != "gpu":
            return super()._targets_of(part, index, values)
        with kernels.lending(nms=jax_nms.host_kernel(self.jax_device)):
            return super()._targets_of(part, index, values)

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

    # -- measuring -------------------------------------------------------------------------------
    def _compiled_updates(self, prepared):
        """[(phase index, the compiled XLA program of that update)] for one step on ``prepared``:
        the training step, or each distinct update of a training program's step: the program
        the steps run, lowered for its arguments."""
        prepared = self._with_targets(prepared)
        out, seen = [], set()
        with self._matmul_precision():
            if self.program is None:
                lowered = self._bound_update(None).lower(prepared.native, np.float32(0.0),
                                                         self._step_key())
                return [(None, lowered.compile())], [prepared.native]
            batches = []
            for phase_index, native in prepared.native:
                if phase_index in seen:
                    continue
                seen.add(phase_index)
                lowered = self._bound_update(phase_index).lower(native, np.float32(0.0),
                                                                self._step_key(phase_index))
                out.append((phase_index, lowered.compile()))
                batches.append(native)
        return out, batches

    def measure_memory(self, prepared):
        """Memory by category from what XLA reports for the compiled training step
        (``Compiled.memory_analysis()``) and from the arrays themselves.

        Weights (every variable of the model: parameters and running statistics), optimizer
        state (every array of the optimizers' states, the step counters included) and the batch
        are exact, read off the arrays. The step's program holds them as its arguments and
        writes the new weights and state over them (donated: XLA's aliased bytes); everything
        else it needs is XLA's temporaries: the gradients (as large as the trainable
        parameters, a figure the gradient tree's arrays give exactly), the activations kept for
        the backward pass, and the scratch of the ops. Feature maps stay the spec's figure
        (XLA does not tell its temporaries apart), and the workspace is what the temporaries
        hold beyond gradients and feature maps. ``peak`` is the program's own footprint:
        arguments + outputs - aliased + temporaries + generated code, the most the step holds
        on the device at once by XLA's buffer assignment; the largest update's, in a training
        program. ``device_peak`` is the device's peak as its allocator reports it
        (``memory_stats()['peak_bytes_in_use']``, the process's peak so far, on a GPU); a CPU
        reports none."""
        compiled, batches = self._compiled_updates(prepared)
        held = (self.native,) + tuple(self._optimizers.values()) if self.program is not None \
            else (self.native, self.optimizer)
        weights = _bytes(nnx.state(self.native))
        optimizer_state = _bytes(nnx.state(held[1:]))
        trainable = _bytes(nnx.state(self.native, nnx.Param))
        batch = sum(_bytes(b) for b in batches)
        stats = [c.memory_analysis() for _, c in compiled]
        footprints = [m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
                      + m.temp_size_in_bytes + m.generated_code_size_in_bytes for m in stats]
        largest = stats[int(np.argmax(footprints))]
        device_stats = self.jax_device.memory_stats() or {}
        return {"weights": weights, "gradients": trainable, "optimizer_state": optimizer_state,
                "input_batch": batch, "peak": int(max(footprints)),
                "peak_scope": "xla_program",
                "xla_arguments": int(largest.argument_size_in_bytes),
                "xla_outputs": int(largest.output_size_in_bytes),
                "xla_aliased": int(largest.alias_size_in_bytes),
                "xla_temporaries": int(largest.temp_size_in_bytes),
                "xla_generated_code": int(largest.generated_code_size_in_bytes),
                "device_peak": device_stats.get("peak_bytes_in_use")}

    def measure_flops(self, prepared):
        """FLOPs XLA's cost analysis counts (``Compiled.cost_analysis()['flops']``), per step:
        ``forward``, the model's forward pass in training mode up to its loss (the graph's
        loss; every update's objective, in a training program) on ``prepared``, and ``step``,
        the whole compiled training step (forward, backward, optimizer update). XLA counts a
        while loop's body once: a recurrent layer's ``jax.lax.scan`` counts as the steps of
        one iteration (``recurrent.LOOP.unroll``)."""
        compiled, batches = self._compiled_updates(prepared)
        step, forward = 0.0, 0.0
        with self._matmul_precision():
            for (phase_index, compiled_update), batch in zip(compiled, batches):
                objective = self._objective_of(phase_index)

                def loss(model, batch, key, objective=objective):
                    with ops.running(ops.Context(True, key)) as ctx:
                        ctx.root = model
                        return objective(model, batch)
                with self._replica_view():
                    lowered = nnx.jit(loss).lower(self.native, batch, self._step_key())
                repeat = 1 if phase_index is None else \
                    self.program.phases[phase_index]["repeat"]
                forward += repeat * _flops(lowered.compile())
                step += repeat * _flops(compiled_update)
        return {"forward": forward, "step": step, "source": "xla_cost_analysis"}


def _bytes(tree):
    """Bytes of every array of ``tree`` (an NNX state or a dict of arrays) but scalars (step
    counters) and PRNG keys."""
    return int(sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(nnx.as_pure(tree))
                   if a.ndim and jnp.issubdtype(a.dtype, jnp.number)))


def _flops(compiled):
    """The FLOPs XLA's cost analysis gives a compiled program (a dict, or a list of one per
    computation in some jaxlib versions)."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):
        return float(sum(a.get("flops", 0.0) for a in analysis))
    return float(analysis.get("flops", 0.0))


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


def _is_variable(x):
    return isinstance(x, nnx.Variable)


def _split(held):
    """The held trees split once: (their variables, in order; a function of those variables'
    values, inside a trace, to the trees rebuilt on them)."""
    graphdef, state = nnx.split(held)
    treedef = jax.tree.structure(state)

    def rebuild(values):
        return nnx.merge(graphdef, jax.tree.unflatten(treedef, values))
    return jax.tree.leaves(state, is_leaf=_is_variable), rebuild


class _HeldUpdate:
    """``update(*held, *args)`` as one ``jax.jit`` of the held trees' variable values: the trees
    split once into their graph and their variables, the values donated to each call and the
    outputs set on the same variables, so the trees stay the trained ones."""

    def __init__(self, update, held):
        self.variables, rebuild = _split(held)
        self._values, self._set = _value_access(self.variables)

        def pure(values, *args):
            trees = rebuild(values)
            out = update(*trees, *args)
            return out, jax.tree.leaves(nnx.state(trees))
        self.jitted = jax.jit(pure, donate_argnums=0)

    def __call__(self, *args):
        out, values = self.jitted(self._values(), *args)
        self._set(values)
        return out

    def lower(self, *args):
        return self.jitted.lower(self._values(), *args)


def _values_of(names):
    """(model, batch) -> {name: value} of the graph values ``names``, in inference mode."""
    def values(model, batch):
        with ops.running(ops.Context(False)) as ctx:
            ctx.root = model
            return dict(model.values(batch, list(names)))
    return values


class _HeldCall:
    """``fn(*held, *args)`` as one ``jax.jit`` of the held trees' variable values, read at each
    call (not donated: the trees keep them)."""

    def __init__(self, fn, held):
        variables, rebuild = _split(held)
        self._values = _value_access(variables)[0]

        def pure(values, *args):
            return fn(*rebuild(values), *args)
        self.jitted = jax.jit(pure)

    def __call__(self, *args):
        return self.jitted(self._values(), *args)


def _value_access(variables):
    """Functions (get, set) reading and setting the values of ``variables``, in order.
    ``Variable.set_raw_value`` checks twice per call that the variable may be updated in the
    current trace (10 us each: 0.67 ms a step for ResNet-50's 429 variables on a 2-core host)
    and ``get_raw_value`` is a Python call per variable; a step reads and sets them from outside
    any trace, where that check always passes, so they go straight to the attribute
    ``get_raw_value`` reads (C loops: 0.03 ms). Where a Flax version keeps the value elsewhere
    (checked on the first variable), or the variables hold references (Flax's ``hijax``
    mode), the methods it is."""
    def get_checked():
        return [v.get_raw_value() for v in variables]

    def set_checked(values):
        for variable, value in zip(variables, values):
            variable.set_raw_value(value)

    def get_direct():
        return list(map(_RAW_VALUE, variables))

    def set_direct(values):
        for variable, value in zip(variables, values):
            _SET_ATTRIBUTE(variable, "_raw_value", value)

    if not variables or getattr(variables[0], "hijax", False):   # a Ref: through Flax
        return get_checked, set_checked
    probe, value = variables[0], variables[0].get_raw_value()
    marker = object()
    try:
        _SET_ATTRIBUTE(probe, "_raw_value", marker)
        works = probe.get_raw_value() is marker and _RAW_VALUE(probe) is marker
    except (AttributeError, TypeError):
        works = False
    probe.set_raw_value(value)
    return (get_direct, set_direct) if works else (get_checked, set_checked)


_RAW_VALUE = operator.attrgetter("_raw_value")
_SET_ATTRIBUTE = object.__setattr__
_VARIABLE, _MODULE, _MAPPING, _SEQUENCE, _LEAF = range(5)
_KINDS = {}


def _kind(cls):
    """What a class is to the walk, decided once per class (nnx's ``isinstance`` checks go
    through metaclass hooks, and the walk asks thousands of times a step)."""
    kind = _KINDS.get(cls)
    if kind is None:
        kind = _KINDS[cls] = (_VARIABLE if issubclass(cls, nnx.Variable) else
                              _MODULE if issubclass(cls, nnx.Module) else
                              _MAPPING if issubclass(cls, dict) else
                              _SEQUENCE if issubclass(cls, (list, tuple)) else _LEAF)
    return kind


class _TreeWitness:
    """What an update bound to an NNX tree assumes of it: every module, and every list or dict
    that holds nodes, with all it holds (attribute names and values, nodes or not).
    ``holds()`` compares their identities with the saved ones in C loops (``operator.is_``: no
    object is created, and no ``__eq__`` runs, which a Variable answers by its value), so a step
    can afford it: a user's new head, replaced layer or changed attribute between steps shows as
    a changed identity. One value is Flax's bookkeeping, not the model: ``nnx.update`` gives
    every module it reaches a new ``_pytree__state`` (a training program's restore of its state
    does, each step); where only those changed, the witness takes the new ones and holds."""

    def __init__(self, root):
        self._root = root
        self._mappings, self._sequences = [], []
        stack = [root]
        while stack:
            node = stack.pop()
            kind = _kind(type(node))
            if kind in (_MODULE, _MAPPING):
                held = vars(node) if kind == _MODULE else node
                self._mappings.append(held)
                stack.extend(c for c in held.values() if _holds_nodes(c))
            elif kind == _SEQUENCE:
                self._sequences.append(node)
                stack.extend(c for c in node if _holds_nodes(c))
        self._sizes = self._count()
        self._keys = tuple(chain.from_iterable(self._mappings))
        self._values = tuple(chain.from_iterable(map(dict.values, self._mappings)))
        self._items = tuple(chain.from_iterable(self._sequences))
        # per mapping, a getter of its values but Flax's state (a lone key twice: an itemgetter
        # of one key returns the bare value)
        self._getters = [operator.itemgetter(*(keys if len(keys) > 1 else keys * 2))
                         if keys else _no_values
                         for keys in ([k for k in held if k != _FLAX_STATE]
                                      for held in self._mappings)]
        self._model_values = tuple(self._values_but_flax_state())

    def _count(self):
        return sum(map(len, self._mappings)), sum(map(len, self._sequences))

    def holds(self, root):
        mappings, same = self._mappings, operator.is_
        if not (root is self._root and self._count() == self._sizes
                and all(map(same, chain.from_iterable(mappings), self._keys))
                and all(map(same, chain.from_iterable(self._sequences), self._items))):
            return False
        if all(map(same, chain.from_iterable(map(dict.values, mappings)), self._values)):
            return True
        if not all(map(same, self._values_but_flax_state(), self._model_values)):
            return False
        self._values = tuple(chain.from_iterable(map(dict.values, mappings)))
        return True

    def _values_but_flax_state(self):
        return chain.from_iterable(map(operator.call, self._getters, self._mappings))


_FLAX_STATE = "_pytree__state"


def _no_values(_):
    return ()


def _holds_nodes(x):
    """Whether ``x`` is a module, or a list, tuple or dict with a module or variable inside."""
    kind = _kind(type(x))
    if kind == _MODULE:
        return True
    if kind == _MAPPING:
        x = x.values()
    elif kind != _SEQUENCE:
        return False
    return any(_kind(type(c)) == _VARIABLE or _holds_nodes(c) for c in x)


# one compiled call where eager fold_in dispatches each of its operations
_fold_in = jax.jit(jax.random.fold_in)
_KEY_BLOCK = 256


@jax.jit
def _fold_in_block(key, start):
    """fold_in(key, step) of the _KEY_BLOCK steps from ``start``."""
    steps = start + jnp.arange(_KEY_BLOCK, dtype=jnp.uint32)
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, steps)


@jax.jit
def _copy(tree):
    return jax.tree.map(jnp.copy, tree)


@jax.jit
def _select(where, saved, current):
    return jax.tree.map(lambda old, new: jnp.where(where, old, new), saved, current)


def _gpus():
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []
