"""The neutral spec: shapes, padding, parameters, serialisation and hashing."""
import json

import pytest

import tbdzoo
from tbdzoo.spec import Graph, initial_weights, ops, padding


def test_resnet50_has_exactly_the_reference_parameter_count():
    g = tbdzoo.get_model("resnet50").build_graph(tbdzoo.get_model("resnet50").hparams())
    assert g.trainable_count() == 25557032  # torchvision.models.resnet50
    assert g.shape_of(g.output) == (1000,)
    assert g.nodes["layer2.0.conv2"].attrs["stride"] == (2, 2)  # v1.5: stride on the 3x3
    assert g.nodes["layer2.0.conv1"].attrs["stride"] == (1, 1)


def test_resnet50_v1_moves_the_stride_to_the_1x1():
    md = tbdzoo.get_model("resnet50")
    g = md.build_graph(md.hparams(stride_in_1x1=True))
    assert g.nodes["layer2.0.conv1"].attrs["stride"] == (2, 2)
    assert g.nodes["layer2.0.conv2"].attrs["stride"] == (1, 1)
    assert g.trainable_count() == 25557032


def test_resnet50_forward_flops_match_the_published_4_1_gmacs():
    md = tbdzoo.get_model("resnet50")
    gflops = sum(md.build_graph(md.hparams()).flops().values()) / 1e9
    assert 8.1 < gflops < 8.4


def test_transformer_ties_one_matrix_three_ways():
    md = tbdzoo.get_model("transformer")
    g = md.build_graph(md.hparams())
    assert "embed.weight" in g.params()
    assert "tgt_embed.weight" not in g.params() and "generator.weight" not in g.params()
    assert g.param_names(g.nodes["generator"])["weight"] == "embed.weight"
    assert g.shape_of("generator") == (32, 32000)
    attn = g.nodes["decoder.0.self_attn"]
    assert attn.attrs["causal"] and attn.inputs[2] == "tgt_in"
    assert g.nodes["decoder.0.cross_attn"].inputs[1:] == ["encoder.5.ffn.norm", "src"]


def test_json_round_trip_keeps_the_hash():
    for name in tbdzoo.list_models():
        md = tbdzoo.get_model(name)
        for config in md.configs:
            g = md.build_graph(md.hparams(config))
            again = Graph.from_json(json.loads(g.dumps()))
            assert again.hash() == g.hash()
            assert again.dumps() == g.dumps()


def test_hash_changes_with_any_attribute():
    md = tbdzoo.get_model("resnet50")
    assert md.build_graph(md.hparams("tiny")).hash() != md.build_graph(
        md.hparams("tiny", bn_eps=1e-3)).hash()


def test_shape_errors_name_the_node():
    g = Graph("t")
    x = g.input("x", (3, 4, 4))
    with pytest.raises(ValueError, match="node 'c'.*too small"):
        g.add("c", "conv2d", x, filters=2, kernel=7)
    with pytest.raises(ValueError, match="not defined"):
        g.add("d", "relu", "nope")
    with pytest.raises(ValueError, match="no attribute.*colour"):
        g.add("e", "relu", x, colour=1)
    with pytest.raises(ValueError, match="unknown op 'conv3d'"):
        g.add("f", "conv3d", x)


def test_stored_shapes_are_checked_on_load():
    g = Graph("t")
    g.set_output(g.add("r", "relu", g.input("x", (2, 3))))
    data = json.loads(g.dumps())
    data["nodes"][0]["shape"] = [9]
    with pytest.raises(ValueError, match="stored shape"):
        Graph.from_json(data)


@pytest.mark.parametrize("size,kernel,stride,odd,expected", [
    (224, 7, 2, "end", (2, 3)), (224, 7, 2, "begin", (3, 2)), (5, 3, 1, "end", (1, 1)),
    (8, 1, 2, "end", (0, 0)), (7, 2, 2, "end", (0, 1)),
])
def test_same_padding_is_resolved_explicitly(size, kernel, stride, odd, expected):
    assert padding.same(size, kernel, stride, odd=odd) == expected


def test_conv_output_with_asymmetric_padding():
    assert ops.conv_out(9, 3, 2, (1, 0)) == 4
    g = Graph("t")
    c = g.add("c", "conv2d", g.input("x", (3, 9, 8)), filters=4, kernel=3, stride=2,
              padding=((1, 0), (0, 1)))
    assert g.shape_of(c) == (4, 4, 4)


def test_initial_weights_depend_on_seed_and_name_only():
    md = tbdzoo.get_model("resnet50")
    g = md.build_graph(md.hparams("tiny"))
    a, b, c = initial_weights(g, 0), initial_weights(g, 0), initial_weights(g, 1)
    assert all((a[k] == b[k]).all() for k in a)
    assert not (a["conv1.weight"] == c["conv1.weight"]).all()
    fan_out = 8 * 7 * 7
    assert abs(a["layer1.0.conv2.weight"].std() - (2.0 / (8 * 9)) ** 0.5) < 0.03
    assert abs(a["conv1.weight"].std() - (2.0 / fan_out) ** 0.5) < 0.03
    assert (a["bn1.running_var"] == 1).all() and (a["bn1.gamma"] == 1).all()
    deeper = md.build_graph(md.hparams("tiny", blocks=(2, 1, 1, 1)))
    assert (initial_weights(deeper, 0)["conv1.weight"] == a["conv1.weight"]).all()


def test_learning_rate_schedules():
    from tbdzoo.schedules import learning_rate
    r = tbdzoo.get_model("resnet50").hparams()
    spe = r["steps_per_epoch"]
    assert learning_rate(r, 0) == pytest.approx(0.1)
    assert learning_rate(r, 30 * spe) == pytest.approx(0.01)
    assert learning_rate(r, 80 * spe) == pytest.approx(1e-4)
    t = tbdzoo.get_model("transformer").hparams()
    peak = learning_rate(t, 3999)
    assert peak == pytest.approx(512 ** -0.5 * 4000 ** -0.5)
    assert learning_rate(t, 0) < peak and learning_rate(t, 16000) == pytest.approx(peak / 2, rel=1e-3)
