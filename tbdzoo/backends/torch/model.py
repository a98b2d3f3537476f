"""The spec graph as a ``torch.nn.Module`` whose state_dict keys are the canonical names."""
from collections import OrderedDict

import numpy as np
import torch
from torch import nn

from ..base import BackendModel
from . import ops, optimizers


class SpecModule(nn.Module):
    """Runs the graph node by node. Each parameter lives in a submodule at its node's path, so
    ``state_dict()`` keys equal the canonical names (``layer1.0.conv1.weight``); tied parameters
    are registered once, by their owner, and looked up by name where they are shared."""

    def __init__(self, graph, weights):
        super(SpecModule, self).__init__()
        self.graph = graph
        self.input_names = [i.name for i in graph.feature_inputs()]
        tensors = {}
        for name, spec in graph.params().items():
            owner = self._submodule(spec.owner)
            value = torch.from_numpy(np.array(weights[name], np.float32))
            suffix = name[len(spec.owner) + 1:]
            if spec.trainable:
                owner.register_parameter(suffix, nn.Parameter(value))
            else:
                owner.register_buffer(suffix, value)
        for name in graph.params():
            tensors[name] = self.get_parameter(name) if graph.params()[name].trainable \
                else self.get_buffer(name)
        self._plan = [(node.name, getattr(ops, node.op), node.inputs,
                       OrderedDict((s, n) for s, n in graph.param_names(node).items()), node.attrs)
                      for node in graph.nodes.values()]

    def _submodule(self, path):
        module = self
        for part in path.split("."):
            if part not in module._modules:
                module.add_module(part, nn.Module())
            module = module._modules[part]
        return module

    def tensor(self, name):
        spec = self.graph.params()[name]
        return self.get_parameter(name) if spec.trainable else self.get_buffer(name)

    def forward(self, *inputs):
        values = dict(zip(self.input_names, inputs))
        tensors = {}
        for name, fn, input_names, param_names, attrs in self._plan:
            params = {}
            for suffix, full in param_names.items():
                if full not in tensors:
                    tensors[full] = self.tensor(full)
                params[suffix] = tensors[full]
            values[name] = fn([values[i] for i in input_names], params, attrs, self.training)
        return values[self.graph.output]


class Model(BackendModel):
    backend = "torch"

    def _resolve_device(self, device):
        """Default: the first GPU when this PyTorch build sees one, else the CPU."""
        if device is None:
            return "cuda:0" if torch.cuda.is_available() else "cpu"
        if device == "cpu":
            return device
        if device.startswith("cuda"):
            index = int(device.split(":")[1]) if ":" in device else 0
            if not torch.cuda.is_available() or index >= torch.cuda.device_count():
                from ...errors import UnsupportedOptionError
                raise UnsupportedOptionError("device {!r} is not available: PyTorch sees {} GPU(s)"
                                             .format(device, torch.cuda.device_count()))
            return "cuda:{}".format(index)
        raise ValueError("device must be 'cpu' or 'cuda:N', not {!r}".format(device))

    def _build(self, weights):
        self.native = SpecModule(self.spec, weights).to(self.device)
        self._trainable = [self.native.tensor(n) for n in self.trainable_names()]
        self.optimizer = optimizers.make(self._trainable, self.hparams)

    def _prepare(self, batch):
        def tensor(name, value):
            kind = self.spec.inputs[name].dtype
            array = np.asarray(value, np.int64 if kind == "int32" else np.float32)
            return torch.from_numpy(array).to(self.device, non_blocking=True)
        return OrderedDict((name, tensor(name, batch[name])) for name in self.spec.inputs)

    def _features(self, prepared):
        return [prepared.native[n] for n in self.native.input_names]

    def _loss(self, prepared):
        logits = self.native(*self._features(prepared))
        return ops.softmax_cross_entropy(logits, prepared.native[self.spec.loss["labels"]],
                                         self.spec.loss)

    def _train_step(self, prepared, lr):
        self.native.train()
        optimizers.set_learning_rate(self.optimizer, lr)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self._loss(prepared)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _predict(self, prepared):
        self.native.eval()
        with torch.no_grad():
            return self.native(*self._features(prepared)).cpu().numpy()

    def _loss_and_gradients(self, prepared):
        statistics = {n: t.clone() for n, t in self.native.named_buffers()}
        self.native.train()
        for t in self._trainable:
            t.grad = None
        loss = self._loss(prepared)
        loss.backward()
        grads = OrderedDict((n, t.grad.detach().cpu().numpy().copy())
                            for n, t in zip(self.trainable_names(), self._trainable))
        for t in self._trainable:
            t.grad = None
        with torch.no_grad():  # no side effects: running statistics as they were
            for n, t in self.native.named_buffers():
                t.copy_(statistics[n])
        return loss.item(), grads

    def _get_weights(self):
        return OrderedDict((n, self.native.tensor(n).detach().cpu().numpy().copy())
                           for n in self.spec.params())

    def _set_weights(self, weights):
        with torch.no_grad():
            for n, value in weights.items():
                self.native.tensor(n).copy_(torch.from_numpy(value).to(self.device))

    def measure_memory(self, prepared):
        """One instrumented training step: feature maps are the storages autograd saves for
        backward (saved-tensor hooks; parameters excluded), the rest is read off the tensors,
        and on a GPU the peak is the caching allocator's high-water mark for that step."""
        own = {t.untyped_storage().data_ptr() for t in self.native.state_dict().values()}
        saved = {}

        def pack(tensor):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in own:
                saved[storage.data_ptr()] = storage.nbytes()
            return tensor

        cuda = self.device.startswith("cuda")
        if cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            self.train_step(prepared)
        state = [v for s in self.optimizer.state.values() for v in s.values()
                 if torch.is_tensor(v) and v.dim() > 0]
        return {
            "weights": sum(t.nbytes for t in self._trainable),
            "gradients": sum(t.grad.nbytes for t in self._trainable if t.grad is not None),
            "optimizer_state": sum(t.nbytes for t in state),
            "feature_maps": sum(saved.values()),
            "input_batch": sum(t.nbytes for t in prepared.native.values()),
            "peak": torch.cuda.max_memory_allocated(self.device) if cuda else None,
        }
