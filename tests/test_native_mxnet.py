"""The MXNet backend's native model as Gluon users know it, for every model (tiny configs):
printing shows Gluon's layers and the blocks' classes, a child block runs on its own and
gives the graph's values, a forward hook on an inner block fires during predict, replacing the
classifier head changes the output's shape, and ``save_parameters``/``load_parameters`` and
``export``/``SymbolBlock.imports`` give back the same outputs."""

import numpy as np
import pytest

from conftest import random_weights, require_framework

require_framework("mxnet")

import tbdzoo.backends.mxnet.framework  # noqa: F401  (sets numpy.bool before mxnet is imported)

# isort: split
from mxnet import gluon, nd
from mxnet.gluon import nn

from tbdzoo.backends.mxnet import native
from tbdzoo.backends.registry import build_native
from tbdzoo.errors import UnsupportedOptionError
from tbdzoo.spec.tree import build_tree

# model -> (overrides, a child's path, a block kind below the root, (block, its head layer))
CASES = {
    "resnet50": ({}, "layer1", "Bottleneck", ("", "fc")),
    "transformer": ({"dropout": 0.0}, "encoder", "EncoderLayer", ("", "generator")),
    "inception_v3": ({"dropout": 0.0}, "Mixed_5b", "InceptionA", ("", "fc")),
    "wgan": ({}, "generator", "UpBlock", ("critic", "output")),
    "seq2seq": ({}, "encoder", "Encoder", ("", "output_projection")),
    "deepspeech2": ({}, "rnn", "BatchRNNStack", ("", "output")),
    "a3c": ({}, "conv2", "ActorCritic", ("", "policy")),
    "faster_rcnn": ({}, "backbone", "Bottleneck", ("roi_heads.box_predictor", "cls_score")),
}


def _model(name, seed=0):
    model = build_native(name, "mxnet", config="tiny", seed=seed, **CASES[name][0])
    model.set_weights(random_weights(model, seed=seed))
    return model


def _arrays(model, batch, names):
    """NDArrays of ``names``: the batch's inputs, or graph values in inference mode (the
    inputs a targets step writes, from that step)."""
    batch = dict(batch)
    program = model.program
    if program is not None and program.targets_step is not None and \
            not all(n in batch for n in program.written_inputs()):
        batch.update(model._run_targets(batch, 0))
    nodes = [n for n in names if n not in batch]
    values = model.values(batch, nodes) if nodes else {}
    return [nd.array(np.asarray(batch[n] if n in batch else values[n], np.float32))
            for n in names]


def _io(model, path):
    """(inputs, outputs) of the block or layer at ``path`` in the spec's tree."""
    try:
        block = build_tree(model.spec).find(path)
        return block.inputs, block.outputs
    except KeyError:
        return model.spec.nodes[path].inputs, [path]


def _same(got, expected):
    """Equal up to float32 rounding: oneDNN's fused RNN may sum in another order in another
    instance of the same graph."""
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def _flat(out):
    return list(out.values()) if isinstance(out, dict) else [out]


def _first(out):
    return out[0] if isinstance(out, (list, tuple)) else out


@pytest.mark.parametrize("name", list(CASES))
def test_the_native_model_is_made_of_gluon_blocks(name):
    _, path, kind, (head_block, head) = CASES[name]
    model = _model(name)
    net, batch = model.native, model.synthetic_batch()
    assert isinstance(net, gluon.HybridBlock)
    assert type(net).__name__ == build_tree(model.spec).kind
    printed = str(net)
    assert "Conv2D(" in printed or "Dense(" in printed
    assert kind + "(" in printed
    assert sum(isinstance(b, (nn.Conv2D, nn.Dense, nn.BatchNorm, nn.Embedding, nn.LayerNorm))
               for b in native.blocks(net)) >= 3

    # a child runs on its own and gives the graph's own values
    sub = native.child(net, path)
    inputs, outputs = _io(model, path)
    expected = model.values(batch, outputs)
    got = sub(*_arrays(model, batch, inputs))
    got = got if isinstance(got, (list, tuple)) else [got]
    for o, g in zip(outputs, got):
        np.testing.assert_allclose(g.asnumpy(), expected[o], rtol=1e-5, atol=1e-6, err_msg=o)

    # a forward hook on it fires when the model predicts, and sees that value
    seen = []
    before = model.predict(batch)
    handle = sub.register_forward_hook(lambda block, args, out: seen.append(_first(out)))
    after = model.predict(batch)
    assert seen  # Faster R-CNN calls its backbone twice: for the proposals, for the box head
    handle.detach()
    np.testing.assert_allclose(seen[0].asnumpy(), expected[outputs[0]], rtol=1e-5, atol=1e-6)
    for got, was in zip(_flat(after), _flat(before)):  # block by block: as close as that
        np.testing.assert_allclose(got, was, rtol=1e-5, atol=1e-5)
    count = len(seen)
    for got, was in zip(_flat(model.predict(batch)), _flat(before)):  # the graph again
        np.testing.assert_array_equal(got, was)
    assert len(seen) == count

    # replacing the head changes the output's shape
    block = native.child(net, head_block) if head_block else net
    block_inputs = _arrays(model, batch, _io(model, head_block)[0] if head_block
                           else net.input_names)
    old = _first(block(*block_inputs)).shape
    units = native.child(block, head)._units
    setattr(block, head, nn.Dense(units + 3, flatten=False))
    native.child(block, head).initialize()
    new = _first(block(*block_inputs)).shape
    assert new == old[:-1] + (old[-1] + 3,)
    with pytest.raises(UnsupportedOptionError, match="native.{}.* was replaced".format(
            (head_block + "." if head_block else "") + head)):
        model.get_weights()  # tbdzoo's weights are the model as built


@pytest.mark.parametrize("name", list(CASES))
def test_gluon_save_load_and_export_give_the_same_outputs(name, tmp_path):
    model = _model(name)
    net, batch = model.native, model.synthetic_batch()
    inputs = _arrays(model, batch, net.input_names)
    expected = net(*inputs).asnumpy()
    if getattr(model.model_def, "inference", None) is None:
        _same(model.predict(batch), expected)

    net.save_parameters(str(tmp_path / "net.params"))
    fresh = _model(name, seed=1)
    assert not np.array_equal(fresh.native(*inputs).asnumpy(), expected)
    fresh.native.load_parameters(str(tmp_path / "net.params"))
    _same(fresh.native(*inputs).asnumpy(), expected)
    if getattr(model.model_def, "inference", None) is None:
        _same(fresh.predict(batch), expected)

    net.export(str(tmp_path / "net"))
    names = ["data"] if len(inputs) == 1 else ["data{}".format(i) for i in range(len(inputs))]
    imported = gluon.SymbolBlock.imports(str(tmp_path / "net-symbol.json"), names,
                                         str(tmp_path / "net-0000.params"))
    _same(imported(*inputs).asnumpy(), expected)
