"""The CNTK model as CNTK users know one: a ``cntk.Function`` of block functions, one per
block of the spec's tree (``layer1.0``: ``Bottleneck``) and per layer (``layer1.0.conv1``:
``Convolution2D``), parameters by their canonical names. For every model, in the CNTK
environment (a script run there, as the worker runs the model): the saved and loaded
function lists the blocks; a block's output, however deep, is reachable from the model's
inputs and equals the graph's value; a block runs on its own; the classifier head is
replaced by cloning with a substitution; the trained function is the model's own and saves
and loads to the same predictions."""
import json

import pytest

from conftest import require_backend, run_in_env
from tbdzoo.backends import environments

MODELS = ["resnet50", "transformer", "inception_v3", "wgan", "seq2seq", "deepspeech2", "a3c",
          "faster_rcnn"]

_CHECK = r"""
import json, os, sys, tempfile
import numpy as np, cntk as C
from tbdzoo.backends.cntk import blocks, ops
from tbdzoo.backends.registry import build_native
from tbdzoo.spec import tree

name = sys.argv[1]
model = build_native(name, "cntk", config="tiny")
spec, native = model.spec, model.native
batch = model.synthetic_batch(seed=1)
report = {"native_name": native.name}

def feed(function, arrays):
    return {a: np.asarray(arrays[a.name], np.float32) for a in function.arguments}

def run(function, arrays):
    "The function's first output on ``arrays`` (by argument name)."
    result = function.eval(feed(function, arrays))
    return result[function.outputs[0]] if isinstance(result, dict) else result

# The blocks and layers the native function holds: every block of the tree its output reads,
# by path and kind, and each of their layers, by node name and layer kind.
root = tree.build_tree(spec)
read = set()
for step in root.steps:
    if step.kind == "block":
        read.update(b.name for b in root.children[step.path].walk())
expected = set()
for b in root.walk():
    if b.name in read:
        expected.add((b.name, b.kind))
        expected.update((n, blocks.layer_kind(spec.nodes[n].op)) for n in b.layers.values())
expected.update((n, blocks.layer_kind(spec.nodes[n].op)) for n in root.layers.values()
                if any(s.node == n for s in root.steps))
path = os.path.join(tempfile.mkdtemp(), "model.cntk")
native.save(path)
loaded = C.Function.load(path)
found = set((f.name, f.op_name) for f in blocks.blocks(loaded))
report["missing_blocks"] = sorted(map(list, expected - found))
report["kinds"] = sorted(set(k for _, k in expected))
report["loaded_name"] = loaded.name
weights = model.get_weights()
report["parameters_by_canonical_name"] = all(
    tuple(p.shape) == weights[p.name].shape for p in loaded.parameters)

# Inputs the output reads, with the ones a program's targets step writes.
# (Faster R-CNN's RoI indices offset by example, as the model feeds them: ops.py)
inputs = dict(batch)
if model.program is not None and model.program.targets_step is not None:
    inputs.update(model.step_targets(batch))
arrays = ops.offset_roi_indices(spec, dict((k, np.asarray(v, np.float32))
                                           for k, v in inputs.items()))
predicted = run(native, arrays)
report["loaded_equals_native"] = float(np.abs(run(loaded, arrays) - predicted).max())

# The deepest block the output reads: its output lifted out to the model's inputs, against
# the graph's value of that node (a graph of single nodes, the model's own parameters).
# (A3C has no blocks: its layers are the model's own steps.)
candidates = [b for b in root.walk() if b.name in read] or [root]
deepest = max(candidates, key=lambda b: (b.name.count("."), b.name))
report["deepest"], report["deepest_kind"] = deepest.name, deepest.kind
if deepest is not root:
    reached = blocks.reach(loaded, deepest.name)
    out_name = deepest.outputs[0]
    want = model.values(inputs, [out_name] + list(deepest.inputs))
    report["reached_error"] = float(np.abs(run(reached, arrays).reshape(want[out_name].shape) -
                                           want[out_name]).max())
    # A block on its own: the model's block function, and the loaded function's block, fed
    # the graph's values of what the block reads.
    own = model.block_function(deepest.name)
    given = dict((n, want[n]) for n in deepest.inputs)
    report["own_block_error"] = float(np.abs(run(own, given) - want[out_name]).max())
    report["block_op_name"] = own.root_function.op_name
    alone = blocks.callable_block(loaded, deepest.name, names=list(deepest.inputs))
    report["callable_block_error"] = float(np.abs(run(alone, given) - want[out_name]).max())
# ... and a layer inside it, by its node name
inner_layer = next(iter(deepest.layers.values()))
lifted = blocks.reach(loaded, inner_layer)
value = model.values(inputs, [inner_layer])[inner_layer]
report["inner_layer"] = inner_layer
report["inner_layer_error"] = float(np.abs(run(lifted, arrays).reshape(value.shape) -
                                           value).max())

# A new classifier head by cloning with a substitution, where the output is a dense layer.
head = spec.nodes[spec.output]
if head.op == "dense" and spec.output in root.layers.values():
    layer = loaded.find_by_name(spec.output)
    features = layer.block_arguments_mapping[0][1]
    new_head = C.layers.Dense(5, input_rank=1, name="new_head")(features)
    replaced = loaded.clone(C.CloneMethod.share, {layer.outputs[0]: new_head.output})
    report["new_head_shape"] = list(run(replaced, arrays).shape)

# The native function is the model training trains: a step changes what it computes, and
# predict is its output; the trained function saves and loads to the same values.
model.train_steps(batch, 1)
after = run(native, arrays)
report["training_changed_native"] = float(np.abs(after - predicted).max())
native.save(path)
reloaded = C.Function.load(path)
report["reloaded_after_training"] = float(np.abs(run(reloaded, arrays) - after).max())
prediction = model.predict(batch)
if not isinstance(prediction, dict):
    report["predict_equals_native"] = float(np.abs(prediction - after).max())
# Each top-level block the output does not read (WGAN's critic, Faster R-CNN's RPN) on its
# own, against the graph's values.
report["parts"] = {}
for child in root.children.values():
    if child.name in read or not any(b.layers for b in child.walk()):
        continue
    part = model.block_function(child.name)
    want = model.values(inputs, list(child.inputs) + list(child.outputs))
    got = part.eval(feed(part, want))
    got = got if isinstance(got, dict) else {part.outputs[0]: got}
    report["parts"][child.name] = [part.root_function.op_name, child.kind, max(
        float(np.abs(got[o].reshape(want[n].shape) - want[n]).max())
        for o, n in zip(part.outputs, child.outputs))]
print("REPORT " + json.dumps(report))
"""

# Block kinds each model's function must show (its tree names more; these are the ones a
# reader of the model's code expects to find).
KINDS = {
    "resnet50": {"Bottleneck", "Sequential", "Convolution2D", "BatchNormalization", "Dense"},
    "transformer": {"Encoder", "EncoderLayer", "FeedForward", "Decoder", "DecoderLayer",
                    "AttentionModel", "LayerNormalization", "Embedding", "Dense"},
    "inception_v3": {"BasicConv2d", "InceptionA", "InceptionB", "InceptionC", "InceptionD",
                     "InceptionE", "Convolution2D", "BatchNormalization", "Dense"},
    "wgan": {"Generator", "UpBlock", "Dense", "Convolution2D"},
    "seq2seq": {"Encoder", "Decoder", "Embedding", "LSTM", "AttentionModel", "Dense"},
    "deepspeech2": {"BatchRNNStack", "GRU", "Convolution2D", "BatchNormalization"},
    "a3c": {"Convolution2D", "Dense"},
    "faster_rcnn": {"Backbone", "Bottleneck", "RoIHeads",
                    "BoxHead", "FastRCNNPredictor", "Convolution2D", "Dense"},
}
ROOTS = {"resnet50": "ResNet", "transformer": "Transformer", "inception_v3": "Inception3",
         "wgan": "WGAN", "seq2seq": "Seq2Seq", "deepspeech2": "DeepSpeech2", "a3c": "ActorCritic",
         "faster_rcnn": "FasterRCNN"}
PARTS = {"wgan": ["critic"], "faster_rcnn": ["rpn"], "inception_v3": ["AuxLogits"]}
HEADS = {"resnet50": [5], "inception_v3": [5], "transformer": [6, 5], "seq2seq": [6, 5]}


@pytest.mark.parametrize("name", MODELS)
def test_the_native_function_is_made_of_named_blocks(name):
    require_backend("cntk")
    proc = run_in_env(environments.python_of("cntk"), ["-c", _CHECK, name], timeout=300)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    report = json.loads(lines[-1][len("REPORT "):])
    assert report["native_name"] == report["loaded_name"] == ROOTS[name]
    assert report["missing_blocks"] == []
    assert KINDS[name] <= set(report["kinds"]), sorted(KINDS[name] - set(report["kinds"]))
    assert report["parameters_by_canonical_name"]
    assert report["loaded_equals_native"] == 0.0
    assert report["inner_layer_error"] <= 1e-5, report
    if name != "a3c":  # a model of layers alone
        assert report["deepest"] and "." in report["inner_layer"]
        assert report["reached_error"] <= 1e-5, report
        assert report["own_block_error"] <= 1e-5, report
        assert report["block_op_name"] == report["deepest_kind"]
        assert report["callable_block_error"] <= 1e-5, report
    if name in HEADS:
        assert report["new_head_shape"][1:] == HEADS[name]
    assert report["training_changed_native"] > 0.0
    assert report["reloaded_after_training"] == 0.0
    assert report.get("predict_equals_native", 0.0) <= 1e-6
    assert sorted(report["parts"]) == PARTS.get(name, [])
    for op_name, kind, error in report["parts"].values():
        assert op_name == kind and error <= 1e-5, report["parts"]
