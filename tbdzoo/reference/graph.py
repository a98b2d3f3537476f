"""A whole graph in float64 NumPy: its nodes' values (tbdzoo/reference/ops.py), the graph's loss
and a training program's objectives (tbdzoo/reference/losses.py)."""
from collections import OrderedDict

import numpy as np

from ..spec.reads import values_read
from .losses import loss_term, softmax_cross_entropy
from .ops import OPS


def forward(graph, weights, batch, training=False, masks=None, names=None, held=None):
    """Every node's output (float64), in graph order; with ``names``, only the nodes those
    depend on (and only the inputs they read are taken from ``batch``). ``masks``: dropout
    node name -> keep mask; ``held``: node name -> the value it takes whatever its inputs (a
    derivative through a stop_gradient holds the stopped value fixed)."""
    needed = None if names is None else values_read(graph, names)
    values = OrderedDict()
    for name, inp in graph.inputs.items():
        if needed is not None and name not in needed:
            continue
        arr = np.asarray(batch[name])
        values[name] = arr if inp.dtype == "int32" else arr.astype(np.float64)
    outputs = OrderedDict()
    for node in graph.nodes.values():
        if needed is not None and node.name not in needed:
            continue
        params = OrderedDict((suffix, np.asarray(weights[full], np.float64))
                             for suffix, full in graph.param_names(node).items())
        xs = [values[i] for i in node.inputs]
        mask = (masks or {}).get(node.name)
        if held is not None and node.name in held:
            values[node.name] = outputs[node.name] = held[node.name]
            continue
        if node.op not in OPS:
            raise NotImplementedError("no NumPy reference for op {!r}".format(node.op))
        values[node.name] = outputs[node.name] = OPS[node.op](xs, params, node.attrs, training,
                                                              mask)
    return outputs


def objective(graph, name, outputs, batch):
    """The weighted sum of the loss terms of the training program's objective ``name``."""
    program = graph.program
    total = 0.0
    for term_name, weight in program.objectives[name]:
        term = program.losses[term_name]
        values = {role: outputs[v] if v in outputs else np.asarray(batch[v])
                  for role, v in term["inputs"].items()}
        total += weight * loss_term(term["kind"], values, term["attrs"])
    return total


def loss(graph, outputs, batch):
    """The graph's loss, or the first phase's objective of its training program."""
    if graph.program is not None:
        return objective(graph, graph.program.phases[0]["objective"], outputs, batch)
    spec = graph.loss
    return softmax_cross_entropy(outputs[spec["logits"]], batch[spec["labels"]],
                                 spec.get("label_smoothing", 0.0), spec.get("ignore_index"))
