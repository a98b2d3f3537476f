"""The spec graph as a functional ``keras.Model`` of Keras layers, one layer per parametrised
node named by the node (``layer1.0.conv1``), and the walk the training step runs over them.

The model (``NativeNet.model``, the backend's ``model.native``):
- takes the graph's inputs that its output reads, by name (a dict) or, for a single input, as
  a plain tensor; images NHWC (``(N, H, W, C)``), everything else in its canonical layout;
- gives the graph's output node, NHWC where it is an image (WGAN's generator);
- computes images in NHWC (TensorFlow's CPU kernels are NHWC) with conv kernels HWIO and
  dense kernels (in, out), as Keras does; a ``Permute`` layer named ``<value>.nchw`` or
  ``<value>.nhwc`` turns a value to the other layout where the next layer needs it (before a
  ``Flatten``, so flattened features keep the spec's (C, H, W) order);
- uses Keras' own layers (Conv2D, Dense, Embedding, LayerNormalization, ReLU, Add,
  Concatenate, pooling, Dropout, ...) and those of layers.py where Keras has none.

A node that reuses another node's parameters calls that node's layer again (WGAN-GP's
``critic@fake`` applications, the Transformer's target embedding), or reads its table in
reverse (the Transformer's tied output projection). A node that reads another layer's weights
in some other way (a gradient penalty's input gradients) is a layer of layers.py reading that
layer's variables; a model holding one does not round-trip through a .keras file (WGAN's
native model, its generator, holds none). Layer names are node names, with '@' written '-'
(TensorFlow's name scopes refuse it).

``NativeNet.forward`` runs the same layers node by node on real tensors for the training step
(which reads inner values and may be given only some inputs); ``parts`` are functional
sub-models of the blocks below the root (WGAN's ``generator`` and ``critic``, Faster R-CNN's
``backbone``, ``rpn`` and ``roi_heads``), sharing the model's layers.
"""
from . import framework  # noqa: F401  (first: TensorFlow imported as the backend needs it)

# isort: split
import functools
from collections import OrderedDict

import keras
import numpy as np
import tensorflow as tf

from ...spec.tree import build_tree
from ..programs import values_read
from . import adapters, layers, ops
from .adapters import CANONICAL, NHWC, is_image_input, to_layout, value_layouts

# canonical suffix -> the Keras attribute holding it, per op with a Keras layer
_KERAS_NAMES = {
    "conv2d": {"weight": "kernel", "bias": "bias"},
    "dense": {"weight": "kernel", "bias": "bias"},
    "batchnorm": {"gamma": "gamma", "beta": "beta", "running_mean": "moving_mean",
                  "running_var": "moving_variance"},
    "embedding": {"weight": "embeddings"},
    "layernorm": {"gamma": "gamma", "beta": "beta"},
}
# how a canonical parameter is stored in its Keras variable
HWIO, TRANSPOSED = "hwio", "transposed"
_TRANSFORMS = {("conv2d", "weight"): HWIO, ("dense", "weight"): TRANSPOSED}

# NHWC axis of each canonical example axis of an image (C, H, W)
_NHWC_AXIS = {0: 3, 1: 1, 2: 2}


def to_internal(transform, value):
    value = np.asarray(value, np.float32)
    if transform == HWIO:
        return np.ascontiguousarray(np.transpose(value, (2, 3, 1, 0)))
    if transform == TRANSPOSED:
        return np.ascontiguousarray(value.T)
    return value


def to_canonical(transform, value):
    value = np.asarray(value, np.float32)
    if transform == HWIO:
        return np.ascontiguousarray(np.transpose(value, (3, 2, 0, 1)))
    if transform == TRANSPOSED:
        return np.ascontiguousarray(value.T)
    return value


class Plan:
    """How a node runs: ``layer`` called on its inputs, each first put into ``want`` (a layout
    per input; None: as it is), as a list when ``multi``, with ``kwargs``."""

    __slots__ = ("layer", "want", "multi", "kwargs")

    def __init__(self, layer, want, multi=False, kwargs=None):
        self.layer, self.want, self.multi, self.kwargs = layer, want, multi, kwargs or {}


class NativeNet:
    """The Keras layers of ``graph`` holding ``weights`` (canonical name -> array), the
    functional model over them (``model``), its parts, and the canonical names' variables."""

    def __init__(self, graph, weights, fused_batchnorm=True):
        self.graph = graph
        self.layouts = value_layouts(graph)
        self.image_inputs = set(i.name for i in graph.inputs.values() if is_image_input(i))
        self.adapters = dict(adapters.RUN, batchnorm=adapters.batchnorm_adapter(fused_batchnorm))
        self.owned = OrderedDict()   # canonical name -> (layer, Keras attribute or suffix, transform)
        self.plans = OrderedDict()
        for node in graph.nodes.values():
            self.plans[node.name] = self._plan(node)
        for layer in self.custom_layers():
            if isinstance(layer, layers.BatchNormalization):
                layer.adapter = self.adapters["batchnorm"]
        self._steps = {}
        self.tensors = self._functional()
        self.model = self._model()
        self.parts = self._parts()
        self.set_weights(weights)

    # -- layers ---------------------------------------------------------------------------
    def _plan(self, node):
        graph, op, a = self.graph, node.op, node.attrs
        name = layer_name(node.name)
        ins = [self.layouts[i] for i in node.inputs]
        shared = a.get("shared", {})
        names = graph.param_names(node)
        if shared:
            owners = set(graph.params()[ref].owner for ref in shared.values())
            owner = graph.nodes[owners.pop()] if len(owners) == 1 else None
            whole = set(shared) == set(names) and owner is not None and not owners
            if whole and owner.op == op and all(shared[s] == "{}.{}".format(owner.name, s)
                                                for s in names):
                plan = self.plans[owner.name]
                return Plan(plan.layer, plan.want, plan.multi, dict(plan.kwargs))
            if whole and op == "dense" and owner.op == "embedding" and list(names) == ["weight"]:
                return Plan(self.plans[owner.name].layer, [CANONICAL], kwargs={"reverse": True})
        shape = graph.shape_of(node.inputs[0]) if node.inputs else ()
        if op == "conv2d":
            mode = ops.padding_mode(shape[1:], a["kernel"], a["stride"], a["padding"],
                                    a["dilation"])
            common = dict(filters=a["filters"], kernel_size=a["kernel"], strides=a["stride"],
                          dilation_rate=a["dilation"], groups=a["groups"], use_bias=a["use_bias"],
                          name=name)
            if mode is not None and a["dilation"] == (1, 1) and a["groups"] == 1:
                layer = keras.layers.Conv2D(padding=mode.lower(), **common)
            else:
                layer = layers.Conv2D(explicit_padding=a["padding"], **common)
            return self._own(node, layer, [NHWC])
        if op == "batchnorm":
            image = len(node.shape) == 3
            layer = layers.BatchNormalization(
                axis=-1 if image else 1, momentum=1.0 - a["momentum"], epsilon=a["eps"],
                track_running_stats=a["track_running_stats"], name=name)
            return self._own(node, layer, [NHWC if image else CANONICAL])
        if op == "dense":
            layer = keras.layers.Dense(a["units"], use_bias=a["use_bias"], name=name)
            return self._own(node, layer, [CANONICAL])
        if op == "embedding":
            layer = layers.ScaledEmbedding(a["vocab"], a["dim"], scale=a["scale"], name=name)
            return self._own(node, layer, [CANONICAL])
        if op == "layernorm":
            layer = keras.layers.LayerNormalization(epsilon=a["eps"], name=name)
            return self._own(node, layer, [CANONICAL])
        simple = self._parameter_free(node, ins)
        if simple is not None:
            return simple
        own = OrderedDict((s, n) for s, n in names.items() if s not in shared)
        params = OrderedDict((s, [list(graph.params()[n].shape), graph.params()[n].trainable])
                             for s, n in own.items())
        tied = OrderedDict((s, functools.partial(self._adapter_layout, n))
                           for s, n in names.items() if s in shared)
        layer = layers.SPEC_OP_LAYERS[op](attrs={k: v for k, v in a.items() if k != "shared"},
                                          layouts=ins, params=params, tied=tied, name=name)
        for suffix, canonical in own.items():
            self.owned[canonical] = (layer, suffix, None)
        return Plan(layer, None, multi=True)

    def _own(self, node, layer, want):
        for suffix, canonical in self.graph.param_names(node).items():
            self.owned[canonical] = (layer, _KERAS_NAMES[node.op][suffix],
                                     _TRANSFORMS.get((node.op, suffix)))
        return Plan(layer, want)

    def _parameter_free(self, node, ins):
        """Keras' own layer for a parameter-free node where one has its semantics."""
        op, a, name = node.op, node.attrs, layer_name(node.name)
        common = NHWC if NHWC in ins else CANONICAL
        if op == "relu":
            return Plan(keras.layers.ReLU(name=name), None)
        if op == "tanh":
            return Plan(keras.layers.Activation("tanh", name=name), None)
        if op == "dropout":
            return Plan(keras.layers.Dropout(a["rate"], name=name), None)
        if op == "add":
            return Plan(keras.layers.Add(name=name), [common] * len(ins), multi=True)
        if op == "concat":
            axis = _NHWC_AXIS[a["axis"]] if common == NHWC else a["axis"] + 1
            return Plan(keras.layers.Concatenate(axis=axis, name=name), [common] * len(ins),
                        multi=True)
        if op == "flatten":
            return Plan(keras.layers.Flatten(name=name), [CANONICAL])
        if op == "global_avgpool":
            return Plan(keras.layers.GlobalAveragePooling2D(name=name), [NHWC])
        if op == "reshape":
            return Plan(keras.layers.Reshape(tuple(a["shape"]), name=name), [CANONICAL])
        if op == "transpose":
            return Plan(keras.layers.Permute(tuple(p + 1 for p in a["perm"]), name=name),
                        [CANONICAL])
        if op == "upsample_nearest":
            return Plan(keras.layers.UpSampling2D(a["factor"], interpolation="nearest",
                                                  name=name), [NHWC])
        if op in ("maxpool2d", "avgpool2d"):
            hw = self.graph.shape_of(node.inputs[0])[1:]
            mode = ops.padding_mode(hw, a["kernel"], a["stride"], a["padding"])
            if mode == "VALID" or (mode == "SAME" and (op == "maxpool2d"
                                                       or not a["count_include_pad"])):
                cls = keras.layers.MaxPooling2D if op == "maxpool2d" else \
                    keras.layers.AveragePooling2D
                return Plan(cls(a["kernel"], a["stride"], padding=mode.lower(), name=name),
                            [NHWC])
        return None

    def custom_layers(self):
        """The layers of layers.py (each reads ``update_stats`` and ``adapter``), once each."""
        seen = OrderedDict()
        for plan in self.plans.values():
            if isinstance(plan.layer, (layers.BatchNormalization, layers.SpecOpLayer)):
                seen[id(plan.layer)] = plan.layer
        return list(seen.values())

    def set_adapters(self, **functions):
        """Replace the adapters of some ops (data-parallel training's synchronised BatchNorm),
        in the layers too; before any step is traced."""
        self.adapters.update(functions)
        for layer in self.custom_layers():
            op = "batchnorm" if isinstance(layer, layers.BatchNormalization) else layer.OP
            if op in functions:
                layer.adapter = functions[op]

    # -- the functional model -----------------------------------------------------------
    def _input(self, name):
        """A keras.Input for value ``name`` of the graph, NHWC where the value is an image."""
        shape = self.graph.shape_of(name)
        if self.layouts[name] == NHWC and len(shape) == 3:
            shape = (shape[1], shape[2], shape[0])
        return keras.Input(shape=shape, dtype=self.graph.dtype_of(name), name=layer_name(name))

    def _functional(self):
        """KerasTensor of every input and of every node a layer runs (nodes reading a value
        no layer gives are left out)."""
        tensors = OrderedDict((n, self._input(n)) for n in self.graph.inputs)
        return self._replay(tensors, self.graph.nodes.values())

    def _replay(self, tensors, nodes):
        """``tensors`` (value name -> KerasTensor) with those of ``nodes`` that a layer runs
        from them, each its layer called on its inputs."""
        converted = {}

        def convert(name, layout):
            tensor = tensors[name]
            if layout is None or self.layouts[name] == layout or len(tensor.shape) != 4:
                return tensor
            if (name, layout) not in converted:
                perm = (2, 3, 1) if layout == NHWC else (3, 1, 2)
                converted[(name, layout)] = keras.layers.Permute(
                    perm, name=layer_name("{}.{}".format(name, layout)))(tensor)
            return converted[(name, layout)]

        for node in nodes:
            plan = self.plans[node.name]
            if any(i not in tensors for i in node.inputs):
                continue
            want = plan.want or [None] * len(node.inputs)
            args = [convert(i, w) for i, w in zip(node.inputs, want)]
            tensors[node.name] = plan.layer(args if plan.multi else args[0], **plan.kwargs)
        return tensors

    def _model_inputs(self, outputs):
        read = values_read(self.graph, tuple(outputs))
        return OrderedDict((n, self.tensors[n]) for n in self.graph.inputs if n in read)

    def _model(self):
        graph = self.graph
        inputs = self._model_inputs((graph.output,))
        return keras.Model(inputs=dict(inputs) if len(inputs) > 1 else next(iter(inputs.values())),
                           outputs=self.tensors[graph.output], name=_keras_name(graph.name))

    def _parts(self):
        """Name -> functional model of each block below the root whose values the model
        computes: its inputs are the values it reads from outside, its outputs the values it
        gives."""
        parts = OrderedDict()
        root = build_tree(self.graph)
        for name, block in root.children.items():
            if not all(v in self.tensors for v in block.inputs + block.outputs):
                continue
            # new inputs, the block's layers called on them again: a model cut from the
            # whole model's inner tensors would rewrite the history of its inputs
            start = OrderedDict((v, self._input(v)) for v in block.inputs)
            inside = [n for n in self.graph.nodes.values() if n.name.startswith(name + ".")]
            tensors = self._replay(OrderedDict(start), inside)
            if not all(v in tensors for v in block.outputs):
                continue
            ins = list(start.values())
            outs = [tensors[v] for v in block.outputs]
            parts[name] = keras.Model(inputs=ins[0] if len(ins) == 1 else ins,
                                      outputs=outs[0] if len(outs) == 1 else outs,
                                      name=_keras_name(name))
        return parts

    # -- parameters by canonical name ----------------------------------------------------
    def keras_variable(self, name):
        layer, attribute, _ = self.owned[name]
        if isinstance(layer, layers.SpecOpLayer):
            return layer.spec_weights[attribute]
        return getattr(layer, attribute)

    def variable(self, name):
        """The tf.Variable behind a canonical parameter name."""
        return self.keras_variable(name).value

    def keras_path(self, name):
        """The Keras path (``layer/variable``) of a canonical parameter name."""
        return self.keras_variable(name).path

    def to_internal(self, name, value):
        return to_internal(self.owned[name][2], value)

    def to_canonical(self, name, value):
        return to_canonical(self.owned[name][2], value)

    def _adapter_layout(self, name):
        """A parameter as the adapters read it: dense kernels (out, in), conv kernels HWIO."""
        variable = self.variable(name)
        return tf.transpose(variable) if self.owned[name][2] == TRANSPOSED else variable

    def set_weights(self, weights):
        for name, value in weights.items():
            self.variable(name).assign(self.to_internal(name, value))

    # -- the training step's walk --------------------------------------------------------
    def nodes_for(self, outputs):
        """The graph's nodes that ``outputs`` depend on, in order (all of them for None)."""
        if outputs is None:
            return list(self.graph.nodes.values())
        key = tuple(outputs)
        if key not in self._steps:
            needed = values_read(self.graph, key)
            self._steps[key] = [n for n in self.graph.nodes.values() if n.name in needed]
        return self._steps[key]

    def forward(self, inputs, training, update_stats=None, outputs=None):
        """(tensor, layout) of every input given and every node that ``outputs`` (default:
        every node) need, the layers called on real tensors; ``update_stats`` (default
        ``training``) says whether training BatchNorms move their running statistics."""
        update = bool(training) if update_stats is None else bool(update_stats)
        values = OrderedDict((n, (inputs[n], self.layouts[n])) for n in self.graph.inputs
                             if n in inputs)
        converted = {}
        custom = self.custom_layers()
        for layer in custom:
            layer.update_stats = update
        try:
            for node in self.nodes_for(outputs):
                values[node.name] = (self._run(node, values, converted, bool(training)),
                                     self.layouts[node.name])
        finally:
            for layer in custom:
                layer.update_stats = True
        return values

    def _run(self, node, values, converted, training):
        plan = self.plans[node.name]
        want = plan.want or [None] * len(node.inputs)
        args = []
        for name, layout in zip(node.inputs, want):
            if layout is None or values[name][1] == layout:
                args.append(values[name][0])
                continue
            if (name, layout) not in converted:
                converted[(name, layout)] = to_layout(values[name], layout)
            args.append(converted[(name, layout)])
        return plan.layer(args if plan.multi else args[0], training=training, **plan.kwargs)


def compile_for_fit(model, loss, hparams, learning_rate):
    """Compile a single-loss model for ``fit``: the spec's loss (layers.SpecCrossEntropy) and
    Keras' optimizer of the spec's kind at the schedule's current rate (SGD with the spec's
    momentum, or Adam with its betas and epsilon). Keras' optimizers leave out the spec's
    weight decay: the backend's own step (``train_step``) is the spec's training."""
    kind = hparams.get("optimizer")
    if kind == "adam":
        optimizer = keras.optimizers.Adam(learning_rate, beta_1=hparams["beta1"],
                                          beta_2=hparams["beta2"], epsilon=hparams["eps"])
    else:
        optimizer = keras.optimizers.SGD(learning_rate, momentum=hparams.get("momentum", 0.0),
                                         nesterov=bool(hparams.get("nesterov", False)))
    model.compile(optimizer=optimizer, loss=layers.SpecCrossEntropy(
        loss.get("label_smoothing", 0.0), loss.get("ignore_index")))


def _keras_name(name):
    return layer_name(name.replace("/", "_")) or "model"


def layer_name(name):
    """A node's layer name: the node's, with '@' (an application's tag, which TensorFlow's name
    scopes refuse) written '-': ``critic@fake.res1.pool`` is layer ``critic-fake.res1.pool``."""
    return name.replace("@", "-")

