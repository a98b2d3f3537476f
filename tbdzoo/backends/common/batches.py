"""The one check of a batch, before any framework sees it (docs/spec.md, "Batches").

Every backend runs it (BackendModel._check_batch, in the caller's process and in a worker), so
a batch a model cannot take is refused the same way everywhere, with a BatchError naming the
input, the first offending position and value, and what the input may hold; nothing has
changed when it is raised. What is checked comes from the graph: each input's declared
per-example shape and dtype, the class ids its losses read (softmax cross-entropy labels,
policy-gradient actions: the logits' width, less an ``ignore_index``), the vocabularies its
embeddings read, a model's own rules (ModelDef.check_batch), then its sequence lengths and
CTC labels (common/sequences.py) and its RoIAlign taps (common/regions.py).

Values: an int32 input takes integers, or floats holding whole numbers; a float32 input takes
numbers, all finite. The cost is one vectorised pass over each host array. A value that is
not a host array (a DeviceArray a lent kernel left on its device) is checked by shape only.
Valid Python 3.6.
"""
from collections import OrderedDict

import numpy as np

from ...errors import BatchError
from ...spec.targets import DeviceArray
from . import regions, sequences

_INT32 = (-2 ** 31, 2 ** 31 - 1)


def where(name, position=None):
    """``batch['name'][i, j]`` as a message writes it."""
    if position is None:
        return "batch[{!r}]".format(name)
    return "batch[{!r}][{}]".format(name, ", ".join(str(int(p)) for p in position))


def refuse(name, position, value, allowed, why):
    """A BatchError for ``batch[name][position] = value``, ``why`` saying what is allowed."""
    shown = value.item() if isinstance(value, np.generic) else value
    return BatchError("{} = {!r} {}".format(where(name, position), shown, why), input=name,
                      position=None if position is None else tuple(int(p) for p in position),
                      value=shown, allowed=allowed)


def first(mask):
    """The index tuple of the first True in ``mask``."""
    return tuple(int(v) for v in np.unravel_index(int(np.argmax(mask)), np.shape(mask)))


class Facts:
    """What a graph says about the values of its inputs, found once per model: for each int32
    input, the [0, high) range of the class or token ids it holds and the values also allowed
    (an ``ignore_index``), with the words a message uses."""

    def __init__(self, graph):
        self.ids = OrderedDict()  # input -> (high, also allowed, words)
        losses = []
        if graph.program is not None:
            losses = [(name, loss["kind"], loss["inputs"], loss.get("attrs") or {})
                      for name, loss in graph.program.losses.items()]
        elif graph.loss is not None:
            attrs = dict((k, v) for k, v in graph.loss.items()
                         if k not in ("kind", "logits", "labels"))
            losses = [("loss", graph.loss["kind"], {"logits": graph.loss["logits"],
                                                   "labels": graph.loss["labels"]}, attrs)]
        for name, kind, roles, attrs in losses:
            if kind == "softmax_cross_entropy":
                ignore = attrs.get("ignore_index")
                classes = graph.shape_of(roles["logits"])[-1]
                self._add(graph, roles["labels"], classes, ignore,
                          "class ids of {} classes (loss {!r}){}".format(
                              classes, name, "" if ignore is None else
                              ", or ignore_index {}".format(ignore)))
            elif kind == "policy_gradient":
                actions = graph.shape_of(roles["logits"])[-1]
                self._add(graph, roles["actions"], actions, None,
                          "actions of a policy over {} actions (loss {!r})".format(actions, name))
        for node in graph.nodes.values():
            if node.op == "embedding":
                vocab = node.attrs["vocab"]
                self._add(graph, node.inputs[0], vocab, None,
                          "the vocabulary of {} ids that embedding {!r} reads; map unknown "
                          "tokens to an id inside it".format(vocab, node.name))

    def _add(self, graph, name, high, also, words):
        if name not in graph.inputs:  # a value computed in the graph: checked where it starts
            return
        known = self.ids.get(name)
        if known is None or high < known[0]:
            self.ids[name] = (high, also, words)


def host(value):
    """``value`` as a NumPy array, or None for a value left on a device (shape-checked only)."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, DeviceArray):
        return None
    try:
        return np.asarray(value)
    except Exception:  # noqa: BLE001  (a framework's device tensor NumPy cannot read without a copy)
        return None


def check(graph, facts, batch, names, uses=None, model_check=None, hparams=None):
    """Raise BatchError for the first thing in ``batch`` the model cannot take; the inputs
    ``names`` must be present, and only they are checked. ``uses``: input -> how many batches
    of it a step's batch stacks (a training program's updates; 1 when not given). Returns the
    batch with those inputs as the NumPy arrays checked (a value left on a device as it was),
    so that they are converted once."""
    if not hasattr(batch, "keys") or not hasattr(batch, "__getitem__"):
        raise BatchError("a batch is a dict of arrays keyed by input name ({}); got {}".format(
            ", ".join(graph.inputs), type(batch).__name__), allowed=list(graph.inputs))
    for name in names:
        if name not in batch:
            raise BatchError("batch lacks {!r}; the model takes {}{}".format(
                name, ", ".join(graph.inputs), "" if len(names) == len(graph.inputs) else
                " and this call reads {}".format(", ".join(names))), input=name,
                allowed=list(names))
    arrays = OrderedDict()  # the inputs the call reads; any others in the batch play no part
    for name in graph.inputs:
        if name in names:
            arrays[name] = host(batch[name])
    _check_shapes(graph, batch, arrays, uses or {})
    for name, value in arrays.items():
        if value is not None:
            _check_values(graph, facts, name, value)
    given = OrderedDict((n, v) for n, v in arrays.items() if v is not None)
    if model_check is not None:  # first: its messages know the model (a receptive field)
        model_check(hparams, given)
    sequences.check_batch(graph, given)
    regions.check_batch(graph, given)
    return OrderedDict((k, given[k] if k in given else batch[k]) for k in batch)


def _check_shapes(graph, batch, arrays, uses):
    sizes = OrderedDict()
    for name in arrays:
        declared = graph.inputs[name]
        shape = tuple(np.shape(batch[name]) if arrays[name] is None else arrays[name].shape)
        if len(shape) != len(declared.shape) + 1 or shape[1:] != declared.shape:
            raise BatchError(
                "{} has shape {}: examples of shape {}, expected {} (an array of shape "
                "(batch size{}))".format(where(name), shape, shape[1:] if shape else "()",
                                         declared.shape, "".join(", {}".format(d) for d in
                                                                 declared.shape)),
                input=name, value=shape, allowed=(None,) + tuple(declared.shape))
        sizes[name] = shape[0]
    for name, rows in sizes.items():
        if rows == 0:
            raise BatchError("{} is empty: a batch holds at least one example".format(
                where(name)), input=name, value=0, allowed="at least one example")
        stacked = uses.get(name, 1) or 1
        if rows % stacked:
            raise BatchError("{} has {} rows, which do not divide into the {} batches one "
                             "step reads".format(where(name), rows, stacked), input=name,
                             value=rows, allowed="a multiple of {}".format(stacked))
    per_batch = OrderedDict((n, rows // (uses.get(n, 1) or 1)) for n, rows in sizes.items())
    if len(set(per_batch.values())) > 1:
        shown = ", ".join("{}: {}".format(n, r if (uses.get(n, 1) or 1) == 1 else
                                          "{} ({} rows for {} batches)".format(
                                              r, sizes[n], uses[n]))
                          for n, r in per_batch.items())
        odd = next(n for n in per_batch if per_batch[n] != next(iter(per_batch.values())))
        raise BatchError("the batch's inputs give different batch sizes ({}); every input "
                         "holds one row per example".format(shown), input=odd,
                         value=per_batch[odd], allowed=next(iter(per_batch.values())))


def _check_values(graph, facts, name, value):
    declared = graph.inputs[name]
    kind = value.dtype.kind
    if kind not in "biuf":
        raise BatchError("{} has dtype {}; input {!r} takes {} numbers".format(
            where(name), value.dtype, name, declared.dtype), input=name, value=str(value.dtype),
            allowed=declared.dtype)
    if not value.size:
        return
    if kind == "f":
        finite = np.isfinite(value)
        if not finite.all():
            at = first(~finite)
            raise refuse(name, at, value[at], "finite numbers",
                         "is not finite: input {!r} takes finite numbers".format(name))
    if declared.dtype != "int32":
        return
    if kind == "f":
        bad = value != np.floor(value)
        if bad.any():
            at = first(bad)
            raise refuse(name, at, value[at], "integers",
                         "is not a whole number: input {!r} holds int32 ids, counts or "
                         "lengths".format(name))
    if kind == "f" or value.dtype.itemsize > 4 or (kind == "u" and value.dtype.itemsize == 4):
        bad = (value < _INT32[0]) | (value > _INT32[1])
        if bad.any():
            at = first(bad)
            raise refuse(name, at, value[at], "int32",
                         "does not fit input {!r}, which holds int32 values".format(name))
    if name in facts.ids:
        high, also, words = facts.ids[name]
        bad = (value < 0) | (value >= high)
        if also is not None:
            bad &= value != also
        if bad.any():
            at = first(bad)
            raise refuse(name, at, value[at], (0, high) if also is None else (0, high, also),
                         "is outside [0, {}): {}".format(high, words))
