"""The gradient of a network's output with respect to one of its values, as ordinary nodes.

WGAN-GP penalises the norm of the critic's input gradient, so its loss needs a derivative and
its update the derivative of that. PyTorch and TensorFlow differentiate twice; MXNet cannot
differentiate its convolution's backward pass and CNTK has no gradient usable inside a loss.
Because the spec is data, the first derivative can instead be written out as a forward graph
(a transposed convolution for a convolution, a mask for a ReLU, upsampling for mean pooling,
the closed form for layer normalisation) that every backend differentiates once. This module
does that transformation, once for every backend. Valid Python 3.6.
"""
from collections import OrderedDict

from .reads import values_read


def _on_path(graph, source, target):
    """Nodes that depend on ``source`` and that ``target`` depends on, in graph order."""
    downstream = {source}
    for node in graph.nodes.values():
        if any(i in downstream for i in node.inputs):
            downstream.add(node.name)
    if target not in downstream:
        raise ValueError("{!r} does not depend on {!r}".format(target, source))
    upstream = values_read(graph, [target])
    return [n for n in graph.nodes.values()
            if n.name != source and n.name in downstream and n.name in upstream]


def input_gradient(graph, output, wrt, prefix):
    """Add nodes computing d(sum of ``output``'s elements per example)/d(``wrt``) and return
    the name of the gradient node; parameters are shared with the forward nodes, so their
    gradients through these nodes are the second-order terms. Nodes are named ``prefix.<...>``.
    Raises ValueError naming the first op on the path that has no rule."""
    path = _on_path(graph, wrt, output)
    on_path = set(n.name for n in path) | {wrt}
    pending = OrderedDict()  # value -> list of gradient contributions (node names)
    seed = graph.add(prefix + ".seed", "ones_like", output)
    pending[output] = [seed]
    for node in reversed(path):
        contributions = pending.pop(node.name, None)
        if not contributions:
            continue
        dy = _accumulate(graph, prefix + "." + node.name + ".dy", contributions)
        rule = _RULES.get(node.op)
        if rule is None:
            raise ValueError("the input gradient through {!r} ({}) has no rule; ops with one: {}"
                             .format(node.name, node.op, ", ".join(sorted(_RULES))))
        for value, grad in rule(graph, node, dy, prefix + "." + node.name):
            if value in on_path and grad is not None:
                pending.setdefault(value, []).append(grad)
    if wrt not in pending:
        raise ValueError("no gradient reaches {!r}".format(wrt))
    return _accumulate(graph, prefix + ".grad", pending[wrt])


def _accumulate(graph, name, contributions):
    if len(contributions) == 1:
        return contributions[0]
    return graph.add(name, "add", contributions)


def _param(graph, node, suffix):
    return graph.param_names(node)[suffix]


def _dense(graph, node, dy, name):
    x = node.inputs[0]
    return [(x, graph.add(name + ".dx", "dense_input_grad", dy, in_features=graph.shape_of(x)[-1],
                          shared={"weight": _param(graph, node, "weight")}))]


def _conv2d(graph, node, dy, name):
    x, a = node.inputs[0], node.attrs
    return [(x, graph.add(name + ".dx", "conv2d_input_grad", dy, kernel=a["kernel"],
                          stride=a["stride"], padding=a["padding"], dilation=a["dilation"],
                          groups=a["groups"], input_shape=graph.shape_of(x),
                          shared={"weight": _param(graph, node, "weight")}))]


def _relu(graph, node, dy, name):
    """The mask reads the ReLU's output, positive exactly where its input is: a backend whose
    ReLU keeps its output for backward then keeps nothing more, and the input may die."""
    return [(node.inputs[0], graph.add(name + ".dx", "relu_grad", [dy, node.name]))]


def _add(graph, node, dy, name):
    return [(x, dy) for x in node.inputs]


def _avgpool2d(graph, node, dy, name):
    a = node.attrs
    k = a["kernel"]
    if a["stride"] != k or k[0] != k[1] or a["padding"] != ((0, 0), (0, 0)) or \
            graph.shape_of(node.inputs[0])[1] % k[0] or graph.shape_of(node.inputs[0])[2] % k[1]:
        raise ValueError("the input gradient through {!r} needs mean pooling (square kernel = "
                         "stride, no padding, sizes divisible)".format(node.name))
    up = graph.add(name + ".up", "upsample_nearest", dy, factor=k[0])
    return [(node.inputs[0], graph.add(name + ".dx", "scale", up, factor=1.0 / (k[0] * k[1])))]


def _reshape(graph, node, dy, name):
    x = node.inputs[0]
    return [(x, graph.add(name + ".dx", "reshape", dy, shape=graph.shape_of(x)))]


def _channel_layernorm(graph, node, dy, name):
    x = node.inputs[0]
    return [(x, graph.add(name + ".dx", "channel_layernorm_input_grad", [dy, x],
                          eps=node.attrs["eps"], shared={"gamma": _param(graph, node, "gamma")}))]


def _identity(graph, node, dy, name):
    return [(node.inputs[0], dy)]


def _dropout(graph, node, dy, name):
    if node.attrs["rate"]:
        raise ValueError("the input gradient through dropout {!r} would need its mask; use "
                         "rate 0 on the differentiated path".format(node.name))
    return _identity(graph, node, dy, name)


def _stop(graph, node, dy, name):
    return []


_RULES = {"dense": _dense, "conv2d": _conv2d, "relu": _relu, "add": _add,
          "avgpool2d": _avgpool2d, "reshape": _reshape, "flatten": _reshape,
          "channel_layernorm": _channel_layernorm, "dropout": _dropout,
          "stop_gradient": _stop}
