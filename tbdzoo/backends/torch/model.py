"""The PyTorch backend: the model is a tree of torch.nn modules (tbdzoo/backends/torch/native.py)."""
import contextlib
import functools
from collections import OrderedDict

import numpy as np
import torch

from ...errors import UnsupportedOptionError
from ...models.faster_rcnn.detection import kernels
from ...spec.reads import values_read
from ...spec.targets import DeviceArray, HostValues
from ..base import BackendModel, PendingTargets, Prepared
from . import cuda_memory, ops, optimizers
from .native import build as build_native


class Model(BackendModel):
    backend = "torch"
    OPTIONS = {"precision": ("fp32", "tf32", "bf16"), "execution": ("default", "eager", "compiled"),
               "memory_format": ("auto", "channels_first", "channels_last")}

    # -- options ---------------------------------------------------------------------------
    def _resolve_device(self, device):
        """Default: the first GPU when this PyTorch build sees one, else the CPU."""
        if device is None:
            return "cuda:0" if torch.cuda.is_available() else "cpu"
        if device == "cpu":
            return device
        if device.startswith("cuda"):
            index = int(device.split(":")[1]) if ":" in device else 0
            if not torch.cuda.is_available() or index >= torch.cuda.device_count():
                raise UnsupportedOptionError("device {!r} is not available: PyTorch sees {} GPU(s)"
                                             .format(device, torch.cuda.device_count()))
            return "cuda:{}".format(index)
        raise ValueError("device must be 'cpu' or 'cuda:N', not {!r}".format(device))

    def _check_options(self, hparams):
        BackendModel._check_options(self, hparams)
        if hparams["precision"] == "tf32" and not self.device.startswith("cuda"):
            raise UnsupportedOptionError("precision 'tf32' needs a CUDA device (TF32 is a GPU "
                                         "matmul mode); on {} use fp32 or bf16".format(self.device))

    @property
    def channels_last(self):
        """NHWC in memory for convolutions: explicit, or 'auto' on a GPU (tensor-core layout)."""
        fmt = self.hparams["memory_format"]
        has_conv = any(n.op == "conv2d" for n in self.spec.nodes.values())
        return has_conv and (fmt == "channels_last" or (fmt == "auto" and self.device.startswith("cuda")))

    @contextlib.contextmanager
    def _device_flags(self):
        """The global backend flags a step runs under, set for the whole step (forward,
        backward and update) and restored after: TF32 matmuls and convolutions for tf32 and
        bf16 and off for fp32 (PyTorch leaves cuDNN's TF32 on by default), and cuDNN's
        autotuner, which picks the fastest convolution algorithms for each shape once."""
        if not self.device.startswith("cuda"):
            yield
            return
        flags = (torch.backends.cuda.matmul, "allow_tf32"), (torch.backends.cudnn, "allow_tf32"), \
            (torch.backends.cudnn, "benchmark")
        saved = [getattr(obj, name) for obj, name in flags]
        tf32 = self.hparams["precision"] in ("tf32", "bf16")
        for (obj, name), value in zip(flags, (tf32, tf32, True)):
            setattr(obj, name, value)
        try:
            yield
        finally:
            for (obj, name), value in zip(flags, saved):
                setattr(obj, name, value)

    def _autocast(self):
        """bf16 autocast for the forward pass (master weights and the update stay fp32)."""
        return torch.autocast(device_type="cuda" if self.device.startswith("cuda") else "cpu",
                              dtype=torch.bfloat16, enabled=self.hparams["precision"] == "bf16")

    # -- building --------------------------------------------------------------------------
    def _build(self, weights):
        self.native = build_native(self.spec, weights).to(self.device)
        if self.channels_last:
            self.native = self.native.to(memory_format=torch.channels_last)
        self._trainable = self.native.leaves(self.trainable_names())
        self._host_copies = {}  # id(optimizer) -> its state copy's buffers (_guarded_update)
        if self.program is not None:
            self._build_program()
            return
        self.optimizer = optimizers.make(self._trainable, self.hparams,
                                         fused=self.device.startswith("cuda"))
        # The logits die in the loss; unless their op keeps them for its own backward pass, the
        # loss's backward pass writes the gradient over them instead of into a new tensor.
        self._loss_may_overwrite_logits = self.spec.nodes[self.spec.output].op in ("dense", "add")
        self._forward_loss = self._loss
        if self.hparams["execution"] == "compiled":
            self._forward_loss = torch.compile(self._loss)

    # -- training programs -------------------------------------------------------------------
    RUNS_PROGRAMS = True

    def _build_program(self):
        """One optimizer per parameter group and one objective function per phase."""
        program = self.program
        owner = program.assignment(self.spec)
        fused = self.device.startswith("cuda")
        self._group_params = OrderedDict(
            (g, self.native.leaves([n for n, o in owner.items() if o == g])) for g in program.groups)
        self._optimizers = OrderedDict(
            (g, optimizers.make_group(self._group_params[g], spec["optimizer"], fused=fused))
            for g, spec in program.groups.items())
        # Parameters a phase does not update are constants while it runs, so autograd records
        # nothing for them (the generator's forward inside a critic update keeps no activations,
        # as a hand-written loop's ``.detach()`` does).
        self._frozen = [[p for g, params in self._group_params.items() if g != phase["update"]
                         for p in params] for phase in program.phases]
        self._objectives = [self._compiled(self._objective_function(phase["objective"]))
                            for phase in program.phases]
        self._frontier = self._targets_frontier()
        self._forward_half = None if self._frontier is None else self._compiled(
            _Values(self.native, self._frontier))

    def _compiled(self, fn):
        """``fn`` (a function of one dict of named inputs, a ``_Values``) as the step calls it:
        itself, or with ``execution="compiled"`` its ``torch.compile``d form behind a wrapper
        that makes the graph's plan for those inputs first (``NativeModel.plan``). Dynamo guards
        on the plans it reads; a plan first made while tracing would add a key to the plans it
        guarded on, and the next call would compile the whole graph again."""
        if self.hparams["execution"] != "compiled":
            return fn
        compiled = torch.compile(fn)
        graph_nodes = self.spec.nodes

        def run(inputs):
            self.native.plan(fn.outputs, tuple(k for k in inputs if k in graph_nodes))
            return compiled(inputs)
        run.compiled = compiled
        return run

    def _objective_function(self, objective):
        program = self.program
        terms = [(program.losses[name], weight) for name, weight in program.objectives[objective]]
        outputs = _largest_first(self.spec, dict.fromkeys(
            v for loss, _ in terms for v in loss["inputs"].values()))

        def evaluate(inputs):
            values = self.native.values(inputs, outputs)
            total = None
            for loss, weight in terms:
                value = ops.loss(loss["kind"], {r: values[v] for r, v in loss["inputs"].items()},
                                 loss["attrs"])
                if weight != 1:  # a product by 1 is a kernel in each pass and changes nothing
                    value = weight * value
                total = value if total is None else total + value
            return total
        evaluate.outputs = outputs
        return evaluate

    # Ops that compute differently in training: a forward half with one of them gives the
    # targets step other values than the inference pass every other backend runs.
    _TRAINING_DEPENDENT_OPS = ("batchnorm", "sequence_batchnorm", "dropout")

    def _targets_frontier(self):
        """The values the targets step reads and every value the rest of the graph takes from
        the forward half that computes them, in graph order; None where the step keeps its own
        inference pass first: no targets step, or an op in the half that computes differently
        in training (``_TRAINING_DEPENDENT_OPS``). Compiled, the half and the objective are
        two graphs, the targets step on the host between them."""
        step = self.program.targets_step
        if step is None:
            return None
        nodes = self.spec.nodes
        half, needed = set(), set(step["reads"])
        for node in reversed(list(nodes.values())):
            if node.name in needed:
                half.add(node.name)
                needed.update(node.inputs)
        if any(nodes[n].op in self._TRAINING_DEPENDENT_OPS for n in half):
            return None
        taken = {i for node in nodes.values() if node.name not in half for i in node.inputs}
        return tuple(n for n in nodes if n in half and (n in step["reads"] or n in taken))

    def _program_step(self, prepared, sync, around_update=None):
        """In eager mode a targets step runs inside the update's own forward pass
        (``_forward_to_targets``) instead of after an inference pass of its own: the forward
        half it reads runs once, with gradients, as a hand-written loop runs it. Only in a step
        of one update: a step of several needs every update's targets from the weights of its
        start, so they all keep their inference passes, made before the first update."""
        if self._frontier is not None and around_update is None \
                and isinstance(prepared.native, PendingTargets) \
                and len(prepared.native.updates) == 1:
            (phase_index, ready, part), = prepared.native.updates
            if ready is None:
                prepared = Prepared(self.backend, [(phase_index, _TargetsInForward(part, 0))],
                                    prepared.items)
        return super()._program_step(prepared, sync, around_update)

    def _forward_to_targets(self, pending):
        """One update's inputs with the targets written: the forward half up to the values the
        targets step reads, queued on the device, the step on their host copies (on a GPU with torchvision's NMS,
        which keeps the reference's boxes: tbdzoo/backends/torch/nms.py), and the half's
        values handed on, so the objective continues from them."""
        part = pending.part
        native = self._uploaded(part)
        half = self._forward_half(native)
        reads = self.program.targets_step["reads"]
        # each read value is copied to the host when the step first reads it: work the step
        # does on its inputs alone runs while the device computes the half
        values = HostValues(((n, functools.partial(_canonical_value, self.spec, n, half[n]))
                             for n in reads), ((n, half[n].shape) for n in reads))
        with _device_kernels(self.device):
            written = self._targets_of(part, pending.index, values)
        native.update(self._prepare(written))
        native.update((n, half[n]) for n in self._frontier)
        return native

    def _uploaded(self, part):
        """``part``'s inputs on the device, uploaded once per prepared batch (its last one
        kept): a prepared batch is on the device before the timed steps, as for every model
        without a targets step. Graph inputs are never written in place."""
        cached = getattr(self, "_upload_cache", None)
        if cached is None or cached[0] is not part:
            cached = (part, self._prepare(part))
            self._upload_cache = cached
        return OrderedDict(cached[1])

    def _update(self, phase_index, native, lr):
        phase = self.program.phases[phase_index]
        group = self.program.groups[phase["update"]]
        params, optimizer = self._group_params[phase["update"]], self._optimizers[phase["update"]]
        if not self.native.training:
            self.native.train()
        optimizers.set_learning_rate(optimizer, lr)
        optimizer.zero_grad(set_to_none=True)
        statistics = self._save_statistics()
        hooks = [functools.partial(_clip_weights, self._group_params[hook["group"]], hook["value"])
                 for hook in phase["hooks"]]
        try:
            with self._device_flags(), _constants(self._frozen[phase_index]):
                with self._autocast():
                    if isinstance(native, _TargetsInForward):
                        native = self._forward_to_targets(native)
                    loss = self._objectives[phase_index](native)
                loss.backward(inputs=params)
                _zero_unreached(params)
                self._reduce_gradients(params)
                norm = optimizers.clip_gradients(params, group["clip"], norm=self.guard_steps)
                bad = self._guarded_update(optimizer, params, loss, [phase["objective"]], norm,
                                           hooks)
        except BaseException:
            self._put_statistics(statistics)
            optimizer.zero_grad(set_to_none=True)
            raise
        if bad is not None:
            self._put_statistics(statistics, where=bad)
            self._step_flags.append((phase["objective"], bad))
        return loss.detach()

    def _program_gradients(self, prepared):
        statistics = {n: t.clone() for n, t in self.native.named_buffers()}
        self.native.train()
        losses, grads, seen = OrderedDict(), OrderedDict(), set()
        names = self.program.assignment(self.spec)
        for phase_index, native in prepared.native:
            if phase_index in seen:
                continue
            seen.add(phase_index)
            phase = self.program.phases[phase_index]
            params = self._group_params[phase["update"]]
            with self._device_flags(), _constants(self._frozen[phase_index]):
                with self._autocast():
                    loss = self._objectives[phase_index](native)
                values = torch.autograd.grad(loss, params, allow_unused=True)
            by_leaf = {id(p): torch.zeros_like(p) if g is None else g for p, g in zip(params, values)}
            for n, g in names.items():
                if g == phase["update"]:
                    grads[n] = self.native.canonical(n, by_leaf[id(self.native.leaf(n)[0])]) \
                        .detach().float().cpu().numpy()
            losses[phase["objective"]] = loss.item()
        with torch.no_grad():
            for n, t in self.native.named_buffers():
                t.copy_(statistics[n])
        return losses, grads

    def _prepare(self, batch):
        def tensor(name, value):
            kind = self.spec.inputs[name].dtype
            lengths = kind == "int32" and np.ndim(value) == 1
            if _on_device(value, self.device) and not lengths:
                # a lent kernel's result, taken as it is (lengths keep a host copy, below)
                t = value.native.to(torch.int64 if kind == "int32" else torch.float32)
            else:
                array = np.asarray(value, np.int64 if kind == "int32" else np.float32)
                t = torch.from_numpy(array).to(self.device, non_blocking=True)
                if lengths and t.device.type != "cpu":
                    # packing and CTC read lengths on the host; this copy spares a sync
                    t._tbdzoo_host = torch.from_numpy(array)
            if self.channels_last and t.dim() == 4:
                t = t.contiguous(memory_format=torch.channels_last)
            return t
        return OrderedDict((name, tensor(name, batch[name])) for name in self.spec.inputs
                           if name in batch)

    def _features(self, prepared):
        return [prepared.native[n] for n in self.native.input_names]

    def _loss(self, *tensors):
        """Forward pass and loss in one function, which is what torch.compile sees."""
        features, labels = tensors[:-1], tensors[-1]
        logits = self.native(*features)
        return ops.softmax_cross_entropy(logits, labels, self.spec.loss,
                                         overwrite_logits=self._loss_may_overwrite_logits)

    def _loss_of(self, prepared):
        return self._forward_loss(*(self._features(prepared) + [prepared.native[self.spec.loss["labels"]]]))

    # -- steps -----------------------------------------------------------------------------
    def _train_step_async(self, prepared, lr):
        """Queue one step; returns the loss tensor without waiting for it. A non-finite step
        found on the device is skipped there and reported at the next synchronisation."""
        loss, bad = self._step(prepared, lr)
        if bad is not None:
            self._defer_nonfinite(self.step_count + 1, bad, ["loss"])
        return loss

    def _step(self, prepared, lr):
        """One atomic step (docs/backends.md): (loss tensor, device flag of a skipped step, or
        None when it was checked on the host). On the host a non-finite step raises here."""
        if not self.native.training:  # .train() walks every submodule: only when needed
            self.native.train()
        optimizers.set_learning_rate(self.optimizer, lr)
        self.optimizer.zero_grad(set_to_none=True)
        statistics = self._save_statistics()
        try:
            with self._device_flags():
                with self._autocast():
                    loss = self._loss_of(prepared)
                loss.backward()
                _zero_unreached(self._trainable)
                bad = self._guarded_update(self.optimizer, self._trainable, loss, ["loss"])
        except BaseException:
            self._put_statistics(statistics)
            self.optimizer.zero_grad(set_to_none=True)
            raise
        if bad is not None:
            self._put_statistics(statistics, where=bad)
        return loss.detach(), bad

    def _train_step(self, prepared, lr):
        """One step, returned only when its update has run on the device."""
        loss, bad = self._step(prepared, lr)
        self.synchronize()
        if bad is not None and bool(bad):
            raise self._nonfinite_error(["loss"])
        return loss.item()

    def synchronize(self):
        """Wait for the GPU's queued kernels; on the CPU PyTorch finishes each op before the
        call that launched it returns, so there is nothing to wait for. Raises the
        NonFiniteStepError of the first queued step that was skipped."""
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)
        self._raise_deferred()

    # -- atomic steps (docs/backends.md) ------------------------------------------------------
    def _guarded_update(self, optimizer, params, loss, objectives, norm=None, hooks=()):
        """The update of ``params`` by ``optimizer`` unless the loss or the gradients (their
        global norm: ``norm`` when clipping computed it) are non-finite; then each ``hook()``.

        On the host (the CPU) the check is read at once: a bad update raises before anything
        changes, and a failure inside the update puts back the copy taken before it. On a
        GPU nothing waits: the flag stays on the device, a fused optimizer skips its kernel
        on it (``found_inf``, as mixed precision's loss scaling does) and any other update
        is undone there by selection; returns that flag (None when checked on the host)."""
        if not self.guard_steps:
            optimizer.step()
            for hook in hooks:
                hook(None)
            return None
        if norm is None:
            norm = optimizers.gradient_norm(params) if any(p.grad is not None for p in params) \
                else torch.zeros((), device=self.device)
        bad = torch.isfinite(loss.detach().float() + norm.float()).logical_not()
        if self._checks_on_host():
            if bool(bad):
                raise self._nonfinite_error(objectives)
            _initial_state(optimizer, params)
            # the copy goes into buffers kept from the last step: a fresh one each step costs
            # its pages' first touch, 89 ms against 26 ms for Seq2Seq's 78 M floats
            buffers = self._host_copies.setdefault(id(optimizer), {})
            saved = _copy_state(params, optimizer, into=buffers)
            try:
                optimizer.step()
                for hook in hooks:
                    hook(None)
            except BaseException:
                _put_state(saved)
                raise
            return None
        if optimizer.defaults.get("fused"):
            if not optimizer.state:
                _initial_momentum(optimizer, params)
            optimizer.found_inf = bad.float()
            try:
                optimizer.step()
            finally:
                del optimizer.found_inf
        else:
            _initial_state(optimizer, params)
            saved = _copy_state(params, optimizer)
            optimizer.step()
            _put_state(saved, where=bad)
        for hook in hooks:
            hook(bad)
        return bad

    def _checks_on_host(self):
        """Whether a step's finite flag is read on the host (on the CPU, where no device
        queue would wait for it) or kept on the device (a GPU)."""
        return not self.device.startswith("cuda")

    def _statistics_tensors(self):
        """The model's buffers (running statistics and other non-trainable tensors)."""
        if getattr(self, "_statistics", None) is None:
            self._statistics = [t for t in self.native.buffers() if t.is_floating_point()]
        return self._statistics

    def _statistics_flat(self):
        """(flat views of the buffers, a flat copy, a flat selection and its views as the
        buffers), made once: a step's copy and selection then cost a kernel each."""
        if getattr(self, "_statistics_buffers", None) is None:
            statistics = self._statistics_tensors()
            # views of the buffers, or None where one is not contiguous (flattened per step)
            views = [t.view(-1) for t in statistics] \
                if all(t.is_contiguous() for t in statistics) else None
            total = sum(t.numel() for t in statistics)
            saved = torch.empty(total, device=self.device)
            chosen = torch.empty(total, device=self.device)
            shaped = [c.view(t.shape) for c, t in zip(chosen.split([t.numel() for t in statistics]),
                                                       statistics)]
            self._statistics_buffers = (views, saved, chosen, shaped)
        return self._statistics_buffers

    def _save_statistics(self):
        """A flat copy of the buffers, taken before a step's forward pass (one kernel)."""
        if not self._statistics_tensors() or not self.guard_steps:
            return None
        views, saved, _, _ = self._statistics_flat()
        with torch.no_grad():
            torch.cat(views or [t.reshape(-1) for t in self._statistics], out=saved)
        return saved

    def _put_statistics(self, saved, where=None):
        """The buffers back from the flat copy ``saved``; with ``where`` (a device flag) only
        where it is set: three kernels and no wait."""
        if saved is None:
            return
        views, _, chosen, shaped = self._statistics_flat()
        with torch.no_grad():
            if where is None:
                chosen.copy_(saved)
            else:
                current = torch.cat(views or [t.reshape(-1) for t in self._statistics])
                torch.where(where, saved, current, out=chosen)
            torch._foreach_copy_(self._statistics, shaped)

    @property
    def torch_optimizers(self):
        """The ``torch.optim`` optimizers the step updates with: one, or one per parameter
        group of a program."""
        return [self.optimizer] if self.program is None else list(self._optimizers.values())

    def _save_state(self):
        """A copy of the weights, buffers and every optimizer's state (a program's step of
        several updates keeps one from its start)."""
        optimizers_held = self.torch_optimizers
        for optimizer, params in zip(optimizers_held, [self._trainable] if self.program is None
                                     else list(self._group_params.values())):
            _initial_state(optimizer, params)
        tensors = list(self._trainable) + self._statistics_tensors()
        return _copy_state(tensors, *optimizers_held)

    def _restore_state(self, saved, where=None):
        _put_state(saved, where)

    def _any_flag(self, flags):
        if len(flags) == 1:  # a step of one update: its own flag, no stack and reduction
            return flags[0].reshape(())
        return torch.stack([f.reshape(()) for f in flags]).any()

    def _flags_to_host(self, flags):
        return [bool(b) for b in torch.stack([f.reshape(()) for f in flags]).cpu().tolist()]

    def _predict(self, prepared):
        self.native.eval()
        with torch.no_grad(), self._device_flags(), self._autocast():
            output = self.spec.output
            return self.native.values(prepared.native, (output,))[output].float().cpu().numpy()

    def _values(self, prepared, names):
        """Inference-mode values of graph nodes ``names`` (a program's targets step reads
        them). In eager mode the step could call the targets function in the middle of its
        own forward pass instead of running this one first; not done yet."""
        self.native.eval()
        with torch.no_grad(), self._device_flags(), self._autocast():
            values = self.native.values(prepared.native, tuple(names))
            return OrderedDict((n, _canonical_value(self.spec, n, values[n])) for n in names)

    def _loss_and_gradients(self, prepared):
        statistics = {n: t.clone() for n, t in self.native.named_buffers()}
        self.native.train()
        for t in self._trainable:
            t.grad = None
        with self._device_flags():
            with self._autocast():
                loss = self._loss_of(prepared)
            loss.backward()
        _zero_unreached(self._trainable)
        grads = OrderedDict(
            (n, self.native.canonical(n, self.native.leaf(n)[0].grad).detach().float().cpu()
             .numpy().copy()) for n in self.trainable_names())
        for t in self._trainable:
            t.grad = None
        with torch.no_grad():  # no side effects: running statistics as they were
            for n, t in self.native.named_buffers():
                t.copy_(statistics[n])
        return loss.item(), grads

    # -- weights ---------------------------------------------------------------------------
    def _get_weights(self):
        return OrderedDict((n, self.native.tensor(n).detach().cpu().contiguous().numpy().copy())
                           for n in self.spec.params())

    def _set_weights(self, weights):
        with torch.no_grad():
            for n, value in weights.items():
                self.native.tensor(n).copy_(torch.from_numpy(value).to(self.device))

    # -- measuring -------------------------------------------------------------------------
    def measure_memory(self, prepared):
        """One instrumented training step.

        Feature maps are the storages autograd saves for backward (saved-tensor hooks), each
        storage once, without the model's own tensors, the batch (its own category) or the
        low-precision copies of weights that autocast saves (``weight_copies``). Weights are
        every tensor of the model's state (parameters and running statistics); gradients,
        optimizer state and the batch are read off their tensors. On a GPU the step also runs
        under the caching allocator's trace (tbdzoo/backends/torch/cuda_memory.py), which is
        replayed to find the moment of the peak and to attribute every block live then: what
        no tensor claims is the workspace (activation gradients in flight, cuDNN scratch,
        casts), measured rather than left as a remainder.
        """
        prepared = self._with_targets(prepared)  # a targets step's inputs, written once here
        # weights: every floating-point tensor of the state (BatchNorm's int64 step counters,
        # kept so torchvision's state_dicts load, are no weights of the spec)
        state = _unique_storages(t for t in self.native.state_dict().values()
                                 if t.is_floating_point())
        updates = [prepared.native] if self.program is None else [n for _, n in prepared.native]
        batch = _unique_storages(t for native in updates for t in native.values())
        parameters = {id(t) for t in self._trainable}
        per_update = [{} for _ in updates]  # a program's updates run one after another
        current, weight_copies = [per_update[0]], {}

        def pack(tensor):
            if tensor.layout != torch.strided:  # a sparse matrix (RoIAlign's gather) has no
                if tensor.is_sparse:            # storage of its own: count its two parts
                    pack(tensor._indices())
                    pack(tensor._values())
                return tensor
            storage = tensor.untyped_storage()
            ptr = storage.data_ptr()
            if ptr not in state and ptr not in batch:
                kept = weight_copies if _is_weight_copy(tensor, parameters) else current[0]
                kept[ptr] = storage.nbytes()
            return tensor

        @contextlib.contextmanager
        def update(index):
            current[0] = per_update[index]
            yield

        def step():
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                if self.program is None:
                    self.train_step(prepared)
                else:
                    self._program_step(prepared, sync=True, around_update=update)

        cuda = self.device.startswith("cuda")
        trace = cuda_memory.memory_trace(step, self.device) if cuda else step()
        saved = max(per_update, key=lambda kept: sum(kept.values()))
        optimizers_held = self.torch_optimizers
        slots = [v for o in optimizers_held for s in o.state.values() for v in s.values()
                 if torch.is_tensor(v) and v.dim() > 0]
        grads = [t.grad for t in self._trainable if t.grad is not None]
        optimizer_state = _unique_storages(slots)
        gradients = _unique_storages(grads)
        measured = {
            "weights": sum(state.values()),
            "gradients": sum(gradients.values()),
            "optimizer_state": sum(optimizer_state.values()),
            "feature_maps": sum(saved.values()),
            "input_batch": sum(batch.values()),
            "weight_copies": sum(weight_copies.values()),
            "peak": None,
        }
        for category, extra in _absent_bytes(self.native, optimizers_held).items():
            measured[category] -= extra
        if self.program is not None and len(self.program.groups) > 1:
            measured["by_group"] = self._memory_by_group(
                [phase for phase, _ in prepared.native], per_update)
        if cuda:
            claims = OrderedDict([("weights", state), ("optimizer_state", optimizer_state),
                                  ("input_batch", batch), ("gradients", gradients),
                                  ("feature_maps", saved)])
            measured["at_peak"] = cuda_memory.peak_attribution(trace, claims)
            measured["peak"] = trace["max_memory_allocated"]
        return measured


    def _memory_by_group(self, update_phases, saved_per_update):
        """Measured per network: its parameters, their gradients, its optimizer's slots, and
        the largest set of storages one of its updates saved for backward."""
        out = OrderedDict()
        for group, params in self._group_params.items():
            slots = [v for s in self._optimizers[group].state.values() for v in s.values()
                     if torch.is_tensor(v) and v.dim() > 0]
            saved = [sum(kept.values()) for phase, kept in zip(update_phases, saved_per_update)
                     if self.program.phases[phase]["update"] == group]
            out[group] = {
                "weights": sum(_unique_storages(params).values()),
                "gradients": sum(_unique_storages(p.grad for p in params if p.grad is not None).values()),
                "optimizer_state": sum(_unique_storages(slots).values()),
                "feature_maps": max(saved) if saved else 0}
            for category, extra in _absent_bytes(self.native, [self._optimizers[group]],
                                                  params).items():
                out[group][category] -= extra
        return out


def _largest_first(graph, outputs):
    """``outputs`` ordered by how much of the graph each reads, most first (stable). Run in
    that order, the largest term's backward pass comes last, after the smaller terms have
    freed what they saved: WGAN-GP's penalty, whose backward differentiates the critic's input
    gradient, then the two plain critic passes (as a hand-written loop computes them)."""
    sizes = {o: len(values_read(graph, [o])) for o in outputs}
    return tuple(sorted(outputs, key=lambda o: -sizes[o]))


@contextlib.contextmanager
def _constants(params):
    """``params`` do not require gradients inside the block."""
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def _clip_weights(params, value, where):
    """The original WGAN's weight clipping after an update; with ``where`` (a device flag of a
    skipped update) the weights are left as they are where it is set."""
    if where is None:
        optimizers.clip_weights(params, value)
        return
    with torch.no_grad():
        for p in params:
            p.copy_(torch.where(where, p, p.clamp(-value, value)))


def _initial_momentum(optimizer, params):
    """Zero momentum buffers before a fused SGD's first step: its first-step kernel, skipped
    on a non-finite flag, would leave the buffers it allocates unwritten. Zero buffers give
    the first step's formula exactly (buf = momentum * 0 + g)."""
    if isinstance(optimizer, torch.optim.SGD) and optimizer.defaults["momentum"]:
        for p in params:
            state = optimizer.state[p]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(p)


def _initial_state(optimizer, params):
    """Every optimizer slot allocated as the optimizer's first step would (zeros, step 0), so
    a copy of the state covers it: zero slots and a zero step are that first step exactly."""
    _initial_momentum(optimizer, params)
    if isinstance(optimizer, torch.optim.Adam):
        fused = bool(optimizer.defaults.get("fused"))
        for p in params:
            state = optimizer.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32,
                                            device=p.device if fused else "cpu")
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    elif isinstance(optimizer, optimizers.RMSProp):
        optimizer.initialise()


def _copy_state(tensors, *optimizers_held, into=None):
    """A copy of ``tensors`` and of every tensor of the optimizers' state, kept as one flat
    buffer per (device, dtype): a few launches of ``cat`` however many tensors there are, where
    a copy per tensor would launch hundreds of kernels a step and, on a GPU, bound the step by
    the host (Inception-v3's state is some 900 tensors). ``into``: (device, dtype) -> buffer,
    reused where the size matches and kept there otherwise. Returns [(tensors, flat copy)]."""
    held = list(tensors)
    for optimizer in optimizers_held:
        held += [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    groups = OrderedDict()
    for t in held:
        groups.setdefault((t.device, t.dtype), []).append(t)
    out = []
    with torch.no_grad():
        for key, ts in groups.items():
            flats = [_flat(t) for t in ts]
            if into is None:
                out.append((ts, torch.cat(flats)))
                continue
            size = sum(f.numel() for f in flats)
            if key not in into or into[key].numel() != size:
                into[key] = torch.empty(size, device=key[0], dtype=key[1])
            out.append((ts, torch.cat(flats, out=into[key])))
    return out


def _put_state(saved, where=None):
    """The tensors back from their flat copies; with ``where`` (a device flag) only where it is
    set. A few kernels a (device, dtype) and no wait for the flag."""
    with torch.no_grad():
        for ts, flat in saved:
            if where is not None:
                current = torch.cat([_flat(t) for t in ts])
                flat = torch.where(where.to(flat.device), flat, current, out=current)
            torch._foreach_copy_(ts, _unflat(flat, ts))


def _flat(t):
    """``t``'s elements as a 1-D tensor in memory order: a view when ``t`` is dense (contiguous
    or channels-last), a copy in logical order otherwise (:func:`_unflat` reads both back)."""
    if t.is_contiguous():
        return t.view(-1)
    if _dense(t):
        return t.as_strided((t.numel(),), (1,))
    return t.reshape(-1)


def _unflat(flat, ts):
    """The pieces of ``flat`` shaped and strided as the tensors ``ts`` it was made from."""
    pieces = flat.split([t.numel() for t in ts])
    return [piece.as_strided(t.shape, t.stride()) if not t.is_contiguous() and _dense(t)
            else piece.view(t.shape) for piece, t in zip(pieces, ts)]


def _dense(t):
    """Whether ``t``'s elements fill its span of memory with no gaps or overlaps (a permutation
    of a contiguous layout, such as channels-last)."""
    expected = 1
    for stride, size in sorted((stride, size) for stride, size in zip(t.stride(), t.shape) if size != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _zero_unreached(params):
    """A parameter the loss does not reach (behind a stop_gradient) has a zero gradient, as in
    every other framework, so weight decay and momentum still update it: PyTorch would leave
    its gradient None and skip it."""
    for t in params:
        if t.grad is None:
            t.grad = torch.zeros_like(t)


def _absent_bytes(native, optimizers_held, params=None):
    """The bytes of cuDNN's zero biases (tbdzoo/backends/torch/recurrent.py) in each memory
    category: held, but not the model's parameters, so the figures stay the spec's. ``params``:
    only the buffers holding those of one group (default: all)."""
    out = {"weights": 0, "gradients": 0, "optimizer_state": 0}
    chosen = None if params is None else {p.untyped_storage().data_ptr() for p in params}
    for p, n in native.absent_elements().items():
        if chosen is not None and p.untyped_storage().data_ptr() not in chosen:
            continue
        out["weights"] += n * p.element_size()
        if p.grad is not None:
            out["gradients"] += n * p.grad.element_size()
        for optimizer in optimizers_held:
            out["optimizer_state"] += sum(n * v.element_size() for v in optimizer.state.get(p, {}).values()
                                          if torch.is_tensor(v) and v.shape == p.shape)
    return out


def _unique_storages(tensors):
    """{data pointer: bytes} of the storages under ``tensors``, a storage shared by views once."""
    out = {}
    for t in tensors:
        storage = t.untyped_storage()
        out[storage.data_ptr()] = storage.nbytes()
    return out


def _is_weight_copy(tensor, parameters):
    """A cast of a parameter, as autocast makes and saves (or a view of one, as a linear
    layer saves the transposed cast): its grad_fn is a copy whose input accumulates into the
    gradient of one of ``parameters`` (ids of the trainable tensors)."""
    base = tensor._base if tensor._base is not None else tensor  # a transposed view: its copy
    fn = base.grad_fn
    if fn is None or type(fn).__name__ != "ToCopyBackward0":
        return False
    return any(id(getattr(nxt, "variable", None)) in parameters
               for nxt, _ in fn.next_functions if nxt is not None)


class _Values:
    """``native.values(inputs, outputs)`` as a function of the inputs alone (what
    ``torch.compile`` compiles: the forward half a targets step reads)."""

    def __init__(self, native, outputs):
        self.native, self.outputs = native, tuple(outputs)

    def __call__(self, inputs):
        return self.native.values(inputs, self.outputs)


class _TargetsInForward:
    """An update whose targets step runs inside its forward pass: its NumPy batch and its
    index in the step (the targets step's random stream)."""

    __slots__ = ("part", "index")

    def __init__(self, part, index):
        self.part, self.index = part, index


def _device_kernels(device):
    """On a GPU, the targets step's proposals and NMS (torchvision's NMS, where it imports) and
    RoIAlign gather points run there (tbdzoo/models/faster_rcnn/detection/kernels.py); on the CPU the NumPy code
    is the faster."""
    if not str(device).startswith("cuda"):
        return contextlib.nullcontext()
    from . import roi_align as torch_roi_align
    lent = {"roi_align_points": torch_roi_align.host_kernel(torch.device(device))}
    try:
        import torchvision  # noqa: F401  (the NMS and proposal kernels below need it)
    except ImportError:
        pass
    else:
        from . import nms as torch_nms
        from . import proposals as torch_proposals
        lent["nms"] = torch_nms.host_kernel(torch.device(device))
        lent["proposals"] = torch_proposals.host_kernel(torch.device(device))
    return kernels.lending(**lent)


def _on_device(value, device):
    """Whether ``value`` is a DeviceArray whose tensor is on ``device``."""
    return isinstance(value, DeviceArray) and isinstance(value.native, torch.Tensor) \
        and value.native.device == torch.device(device)


def _canonical_value(graph, name, tensor):
    """A graph value as NumPy in its spec dtype (float32 or int32)."""
    if graph.dtype_of(name) == "int32":
        return tensor.detach().cpu().numpy().astype(np.int32)
    return tensor.detach().float().cpu().numpy()
