"""Checks of a batch's sequence lengths and CTC labels, part of the one batch check
(common/batches.py).

Frameworks disagree on what a bad length does (an error, a silent clamp, a NaN, an infinite
loss), so every backend checks the NumPy batch here first and fails with one BatchError naming
the input, the example and the fix. Lengths computed in the graph (``lengths_after_conv``) are
followed back to the input they come from. Valid Python 3.6.
"""
import numpy as np

from ...errors import BatchError
from ...spec import losses as spec_losses
from ...spec import ops as spec_ops

# op -> (index of its lengths input, index of the sequence input whose T bounds it)
LENGTHS_SLOTS = {"lstm": (1, 0), "gru": (1, 0), "sequence_batchnorm": (1, 0),
                 "additive_attention": (2, 1)}


def source_input(graph, name):
    """The graph input a lengths value ``name`` is computed from, or None."""
    while name not in graph.inputs:
        node = graph.nodes.get(name)
        if node is None or node.op != "lengths_after_conv":
            return None
        name = node.inputs[0]
    return name


def resolve_lengths(graph, name, batch):
    """The per-example lengths of graph value ``name`` as an int array, or None when the batch
    lacks the input they come from."""
    if name in graph.inputs:
        return None if name not in batch else np.asarray(batch[name]).astype(np.int64)
    node = graph.nodes[name]
    if node.op != "lengths_after_conv":
        return None
    source = resolve_lengths(graph, node.inputs[0], batch)
    return None if source is None else spec_ops.length_after_conv(source, node.attrs)


def _check_range(graph, batch, name, lengths, t, what):
    """``lengths`` (of graph value ``name``) inside [1, t]; ``what`` says which sequence."""
    bad = np.flatnonzero((lengths < 1) | (lengths > t))
    if not len(bad):
        return
    row = int(bad[0])
    source = source_input(graph, name)
    given = int(np.asarray(batch[source])[row])
    if source == name:
        message = "batch[{!r}][{}] = {} is outside [1, {}], the padded length of {}".format(
            source, row, given, t, what)
    else:
        message = "batch[{!r}][{}] = {} gives length {} (lengths {!r}), outside [1, {}], the " \
                  "padded length of {}".format(source, row, given, int(lengths[row]), name, t,
                                               what)
    raise BatchError(message + ": a sequence needs at least one valid step and at most its "
                     "padded length", input=source, position=(row,), value=given,
                     allowed=(1, t))


def check_batch(graph, batch):
    """Raise BatchError when a lengths value leaves [1, T] of the sequence it describes (an
    input ``<x>_lengths`` describes input ``<x>``'s first axis; a node's lengths input the
    sequence it reads), or a CTC loss cannot score an example (tbdzoo/spec/losses.py
    check_ctc_batch)."""
    program = graph.program
    ctc_losses = [loss for loss in (program.losses.values() if program is not None else ())
                  if loss["kind"] == "ctc"]
    # a CTC label may be empty: check_ctc_batch checks those lengths against [0, L]
    label_lengths = set(loss["inputs"]["label_lengths"] for loss in ctc_losses)
    for inp in graph.inputs.values():  # the naming convention: <x>_lengths describes x
        source = inp.name[:-len("_lengths")]
        if inp.name.endswith("_lengths") and source in graph.inputs and inp.name in batch \
                and inp.name not in label_lengths \
                and inp.dtype == "int32" and inp.shape == () and graph.inputs[source].shape:
            _check_range(graph, batch, inp.name, np.asarray(batch[inp.name]),
                         graph.inputs[source].shape[0],
                         "input {!r}".format(source))
    for node in graph.nodes.values():
        if node.op not in LENGTHS_SLOTS:
            continue
        slot, sequence = LENGTHS_SLOTS[node.op]
        lengths = resolve_lengths(graph, node.inputs[slot], batch)
        if lengths is None:
            continue
        _check_range(graph, batch, node.inputs[slot], lengths,
                     graph.shape_of(node.inputs[sequence])[0],
                     "the sequence node {!r} ({}) reads".format(node.name, node.op))
    for name, loss in (program.losses.items() if program is not None else ()):
        if loss["kind"] != "ctc":
            continue
        roles = loss["inputs"]
        if roles["labels"] not in batch or roles["label_lengths"] not in batch:
            continue
        input_lengths = resolve_lengths(graph, roles["input_lengths"], batch)
        if input_lengths is None:
            continue
        frames, classes = graph.shape_of(roles["logits"])
        spec_losses.check_ctc_batch(
            np.asarray(batch[roles["labels"]]), input_lengths,
            np.asarray(batch[roles["label_lengths"]]), frames, classes, name,
            inputs=(roles["labels"], source_input(graph, roles["input_lengths"]),
                    roles["label_lengths"]))
