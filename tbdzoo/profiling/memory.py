"""The training-memory breakdown: analytic figures from the spec for every backend, measured
ones merged in where a framework can give them, and what is left of the peak.

Analytic rules (docs/records.md): weights = every tensor of the model's state (trainable
parameters and BatchNorm running statistics) x 4 bytes; gradients = trainable parameters x 4;
optimizer state = the slots the optimizer holds per trainable parameter (SGD: one with
momentum, none without; Adam: two); feature maps = every node output some consumer keeps for
its backward pass, counted once, the input batch excluded; input batch = the arrays fed.
Valid Python 3.6: workers run it.
"""
from collections import OrderedDict

from ..spec.optimizers import state_slots
from ..spec.program import objective_values
from ..spec.reads import values_read

BYTES = {"fp32": 4, "tf32": 4, "bf16": 2}
CATEGORIES = ("weights", "gradients", "optimizer_state", "feature_maps", "input_batch",
              "framework_runtime", "workspace")
# The scope of a peak that is a compiled XLA program's footprint (the JAX backend).
XLA_PROGRAM = "xla_program"
# The tensors that stay resident from one step to the next.
RESIDENT_TENSORS = ("weights", "gradients", "optimizer_state", "input_batch")

# Which inputs a node keeps for its backward pass ('in': its inputs, 'out': its output);
# 'recurrent' and 'additive' are in _recurrent_elements and _additive_elements. Ops not listed
# keep their inputs.
_SAVES = {"conv2d": "in", "batchnorm": "in", "relu": "out", "maxpool2d": "in", "avgpool2d": "",
          "global_avgpool": "", "flatten": "", "dense": "in", "embedding": "", "add": "",
          "positional_encoding": "", "layernorm": "in", "dropout": "mask",
          "multi_head_attention": "in+attn", "lstm": "recurrent", "gru": "recurrent",
          "additive_attention": "additive", "reshape": "", "transpose": "", "concat": "",
          "lengths_after_conv": ""}

# What a fused recurrent kernel keeps per step, layer and direction, in units of H, besides
# the layer's hidden state h_t (which is the next layer's input, or the node's output): the
# gate activations, and LSTM's cell state c_t or GRU's recurrent pre-activation U_n h + b_hn
# that the reset gate multiplies (cuDNN's reserve space; PyTorch's fused cells keep the same).
RECURRENT_KEPT = {"lstm": 4 + 1, "gru": 3 + 1}


def optimizer_slots(hparams):
    """Tensors the optimizer keeps per trainable parameter (tbdzoo/spec/optimizers.py)."""
    return state_slots(hparams["optimizer"], hparams)


def _optimizer_elements(graph, hparams, trainable):
    """Optimizer state elements: per group of a training program, its optimizer's slots."""
    if graph.program is None:
        return optimizer_slots(hparams) * trainable
    sizes = graph.params()
    total = 0
    for name, group in graph.program.assignment(graph).items():
        spec = dict(graph.program.groups[group]["optimizer"])
        spec["optimizer"] = spec.pop("kind")
        total += optimizer_slots(spec) * sizes[name].size
    return total


def _size(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def feature_map_elements(graph, batch_size):
    """Elements kept for backward: each saved tensor once (a ReLU's output that the next
    convolution also keeps is one tensor), plus attention probabilities and dropout masks.
    The graph's inputs are the input batch, their own category, and are not counted here.
    A training program's updates run one after another: the largest one's count."""
    if graph.program is None:
        loss = graph.loss["logits"] if graph.loss else None
        return _saved_elements(graph, batch_size, list(graph.nodes.values()), [loss] if loss else [])
    return max(_update_elements(graph, phase, batch_size) for phase in graph.program.phases)


def _update_elements(graph, phase, batch_size):
    """Elements one update of ``phase`` keeps for backward: the nodes its objective reads."""
    values = objective_values(graph.program, phase["objective"])
    read = values_read(graph, values)
    nodes = [n for n in graph.nodes.values() if n.name in read]
    return _saved_elements(graph, batch_size, nodes, [v for v in values if v in graph.nodes])


def by_group(graph, batch_size, precision="fp32"):
    """Per network of a training program that trains several (a GAN's generator and critic):
    the weights, gradients and optimizer state of its parameter group, and the feature maps of
    its own update (the largest, where several phases update it). None for one group."""
    program = graph.program
    if program is None or len(program.groups) < 2:
        return None
    owner = program.assignment(graph)
    params = graph.params()
    out = OrderedDict()
    for group, spec in program.groups.items():
        elements = sum(params[n].size for n, g in owner.items() if g == group)
        state = sum(p.size for p in params.values() if not p.trainable
                    and _group_of(program, p.owner) == group)
        optimizer = dict(spec["optimizer"])
        optimizer["optimizer"] = optimizer.pop("kind")
        updates = [_update_elements(graph, phase, batch_size) for phase in program.phases
                   if phase["update"] == group]
        out[group] = OrderedDict([
            ("weights", (elements + state) * 4), ("gradients", elements * 4),
            ("optimizer_state", optimizer_slots(optimizer) * elements * 4),
            ("feature_maps", max(updates) * BYTES[precision] if updates else 0)])
    return out


def _group_of(program, node_name):
    """The group whose prefixes own ``node_name`` (else the '*' group): where a network's
    non-trainable state (BatchNorm statistics) belongs."""
    wildcard = None
    for group, spec in program.groups.items():
        for prefix in spec["include"]:
            if prefix == "*":
                wildcard = group
            elif node_name == prefix or node_name.startswith(prefix + "."):
                return group
    return wildcard


def merge_by_group(analytic_groups, measured_groups=None):
    """{group: {category: {bytes, source}}}: measured figures win over analytic ones."""
    if analytic_groups is None:
        return None
    measured_groups = measured_groups or {}
    out = OrderedDict()
    for group, categories in analytic_groups.items():
        measured = measured_groups.get(group, {})
        out[group] = OrderedDict(
            (k, _entry(measured[k], "measured") if measured.get(k) is not None else _entry(v, "analytic"))
            for k, v in categories.items())
    return out


def _saved_elements(graph, batch_size, nodes, loss_inputs):
    saved = set(loss_inputs)
    extra = 0
    for node in nodes:
        rule = _SAVES.get(node.op, "in")
        if rule in ("in", "in+attn"):
            saved.update(i for i in node.inputs if graph.dtype_of(i) == "float32"
                         and i not in graph.inputs)
        if rule == "out":
            saved.add(node.name)
        if rule == "in+attn":
            t, s = node.shape[0], graph.shape_of(node.inputs[1])[0]
            extra += (2 * node.attrs["num_heads"] * t * s + 4 * _size(node.shape)) * \
                graph.rows_per_example(node.name)  # scores, probs, Q K V ctx
        if rule == "mask" and node.attrs["rate"]:
            extra += _size(node.shape) * graph.rows_per_example(node.name) // 4  # a byte each
        if rule in ("recurrent", "additive"):
            saved.update(i for i in node.inputs if graph.dtype_of(i) == "float32"
                         and i not in graph.inputs)
        if rule == "recurrent":
            kept, output_is_state = _recurrent_elements(node)
            extra += kept
            if output_is_state:
                saved.add(node.name)
        if rule == "additive":
            extra += _additive_elements(graph, node)
    # a value after to_batch has rows_per_example rows for each example of the batch
    return batch_size * (sum(_size(graph.shape_of(n)) * graph.rows_per_example(n) for n in saved)
                         + extra)


def _recurrent_elements(node):
    """(elements an lstm or gru node keeps for backward per example beyond its input, whether
    its output is the last layer's states): per padded step, layer and direction, the gates
    and the cell state (LSTM) or U_n h + b_hn (GRU), and every layer's h_t. With merge
    'concat' the node's output is the last layer's h_t, counted once with the other saved
    values; with 'sum' the output is a new tensor and both directions' h_t count here."""
    a = node.attrs
    t, h, layers = node.shape[0], a["units"], a["num_layers"]
    dirs = 2 if a["bidirectional"] else 1
    concat = a["merge"] == "concat" or dirs == 1
    states = layers - 1 if concat else layers
    return t * dirs * h * (layers * RECURRENT_KEPT[node.op] + states), concat


def _additive_elements(graph, node):
    """What additive attention keeps beyond its query and memory: tanh(W_q q_t + W_m m_s)
    for every (t, s), (T, S, A), which the gradient through tanh and v reads, and the
    attention weights (T, S), which the softmax's and the context's gradients read."""
    t, s = node.shape[0], graph.shape_of(node.inputs[1])[0]
    return t * s * node.attrs["units"] + t * s


def analytic(graph, hparams, batch_size, batch_arrays_bytes, precision="fp32"):
    width = BYTES[precision]
    params = graph.params().values()
    trainable = sum(p.size for p in params if p.trainable)
    out = OrderedDict()
    out["weights"] = sum(p.size for p in params) * 4  # master weights stay fp32 under mixed precision
    out["gradients"] = trainable * 4
    out["optimizer_state"] = _optimizer_elements(graph, hparams, trainable) * 4
    out["feature_maps"] = feature_map_elements(graph, batch_size) * width
    out["input_batch"] = batch_arrays_bytes
    return out


def _entry(size, source):
    return {"bytes": None if size is None else int(size), "source": source if size is not None else None}


def breakdown(analytic_bytes, measured=None, peak=None, steady=None, peak_scope=None):
    """Merge: measured figures win over analytic ones.

    ``peak`` is the measured peak growth over the model's footprint before it was built;
    ``steady`` (CPU only) the resident growth between steps, after the timed steps. The part
    of ``steady`` that no resident tensor explains (weights, gradients, optimizer state, the
    batch) is the framework's own runtime: thread pools, allocator caches, kernels and code
    loaded on first use. Workspace is then the peak minus every category, never below 0.

    When the backend attributed the blocks live at the moment of the peak (``at_peak``, from
    the CUDA allocator's trace), those are the categories: they sum to the peak, workspace is
    measured, and ``unattributed`` says how much of the allocator's peak the replay missed.
    The full sizes of the tensors are kept under ``tensors``. Keys of ``measured`` outside
    the categories (``weight_copies``) are recorded as measured figures of their own."""
    measured = dict(measured or {})
    at_peak = measured.pop("at_peak", None)
    extras = OrderedDict((k, measured.pop(k)) for k in sorted(measured)
                         if k not in CATEGORIES and measured[k] is not None)
    if at_peak is not None and peak is not None:
        out = OrderedDict((k, _entry(at_peak[k], "measured")) for k in CATEGORIES
                          if k != "framework_runtime")
        out["framework_runtime"] = _entry(None, None)  # host memory, not the device's
        out["peak"] = dict(_entry(peak, "measured"), scope=peak_scope or "step")
        out["unattributed"] = _entry(at_peak["unattributed"], "measured")
        out["tensors"] = OrderedDict((k, int(v)) for k, v in measured.items() if v is not None)
    else:
        out = OrderedDict()
        for key in CATEGORIES:
            if key in measured and measured[key] is not None:
                out[key] = _entry(measured[key], "measured")
            elif key in analytic_bytes:
                out[key] = _entry(analytic_bytes[key], "analytic")
        if steady is not None:
            held = sum(out[k]["bytes"] for k in RESIDENT_TENSORS)
            out["framework_runtime"] = _entry(max(int(steady) - held, 0), "derived")
        else:
            out["framework_runtime"] = _entry(None, None)
        if peak is not None:
            # a compiled program's peak (scope 'xla_program') holds device buffers only: the
            # host's framework runtime is no part of it
            skip = ("workspace", "framework_runtime") if peak_scope == XLA_PROGRAM \
                else ("workspace",)
            attributed = sum(out[k]["bytes"] or 0 for k in CATEGORIES if k not in skip)
            out["workspace"] = _entry(max(int(peak) - attributed, 0), "derived")
            out["peak"] = dict(_entry(peak, "measured"), scope=peak_scope)
        else:
            out["workspace"] = _entry(None, None)
            out["peak"] = dict(_entry(None, None), scope=None)
        out = OrderedDict((k, out[k]) for k in CATEGORIES + ("peak",))
    for key, value in extras.items():
        out[key] = _entry(value, "measured")
    out["analytic"] = OrderedDict((k, int(v)) for k, v in analytic_bytes.items())
    return out
