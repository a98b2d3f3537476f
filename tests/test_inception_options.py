"""Inception-v3 without its auxiliary head (``aux_head=False``): the architecture of Keras' and
Gluon's models, which the native benchmark compares against (docs/benchmarks.md)."""
import numpy as np
import pytest

import tbdzoo

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

from tbdzoo.backends.registry import build_native


def _spec(**overrides):
    md = tbdzoo.get_model("inception_v3")
    return md.build_graph(md.hparams("paper", **overrides))


def _torch_name(name):
    return name.replace(".gamma", ".weight").replace(".beta", ".bias")


def test_dropping_the_aux_head_removes_exactly_torchvisions_aux_head_parameters():
    with_aux, without = _spec(), _spec(aux_head=False)
    aux_head = torchvision.models.inception_v3(weights=None, aux_logits=True,
                                               init_weights=False).AuxLogits
    kept = set(without.params())
    removed = [p for n, p in with_aux.params().items() if n not in kept]
    assert kept < set(with_aux.params())
    assert all(p.name.startswith("AuxLogits.") for p in removed)
    assert {_torch_name(p.name) for p in removed if p.trainable} == \
        {"AuxLogits." + n for n, _ in aux_head.named_parameters()}
    assert with_aux.trainable_count() - without.trainable_count() == \
        sum(p.numel() for p in aux_head.parameters()) == 3326696
    assert without.trainable_count() == 23834568
    assert [name for name, _ in without.program.objectives["total"]] == ["main"]


def test_without_the_aux_head_the_loss_and_gradients_are_torchvisions_without_aux_logits():
    torch.manual_seed(0)
    ours = build_native("inception_v3", "torch", device="cpu", batch_size=2, dropout=0.0,
                        num_classes=10, aux_head=False)
    theirs = torchvision.models.inception_v3(weights=None, aux_logits=False, init_weights=False,
                                             num_classes=10, dropout=0.0)
    state = {_torch_name(k): torch.from_numpy(v) for k, v in ours.get_weights().items()}
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    assert unexpected == [] and all(k.endswith("num_batches_tracked") for k in missing)
    batch = ours.synthetic_batch(seed=1)
    x, y = torch.from_numpy(batch["images"]), torch.from_numpy(batch["labels"]).long()
    theirs.train()
    loss = torch.nn.functional.cross_entropy(theirs(x), y, label_smoothing=0.1)
    loss.backward()
    value, grads = ours.loss_and_gradients(batch)
    assert value == pytest.approx(loss.item(), rel=1e-5)
    named = dict(theirs.named_parameters())
    assert {_torch_name(n) for n in grads} == set(named)
    for name, g in grads.items():
        expected = named[_torch_name(name)].grad.numpy()
        scale = np.abs(expected).max() + 1e-12
        np.testing.assert_allclose(g / scale, expected / scale, atol=2e-4, err_msg=name)


def test_without_the_aux_head_the_tiny_model_trains():
    """Eight steps on one batch; eps 1e-3 instead of the paper's 1.0, whose steps are too short
    to show progress this soon."""
    model = build_native("inception_v3", "torch", config="tiny", device="cpu", dropout=0.0,
                         aux_head=False, lr=0.01, eps=1e-3)
    prepared = model.prepare_batch(model.synthetic_batch(seed=0))
    losses = [model.train_step(prepared) for _ in range(8)]
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.7 * losses[0], losses


# -- the smallest inputs: 75 pixels without the auxiliary head, 299 with it ----------------------

def test_the_smallest_inputs_are_computed_from_the_layers():
    from tbdzoo.models import inception_v3 as inception
    assert (inception.MIN_IMAGE_SIZE, inception.MIN_AUX_IMAGE_SIZE) == (75, 299)
    assert inception.grid_sizes(75)["Mixed_7a"] == 1 and inception.grid_sizes(74)["Mixed_7a"] < 1
    aux = inception.grid_sizes(299, aux_head=True)
    assert (aux["Mixed_6a"], aux["AuxLogits.pool"], aux["AuxLogits.conv1"]) == (17, 5, 1)
    assert inception.grid_sizes(298, aux_head=True)["AuxLogits.conv1"] < 1


@pytest.mark.parametrize("size,aux_head", [(75, False), (107, False), (299, True)])
def test_the_computed_grids_are_the_graphs(size, aux_head):
    from tbdzoo.models import inception_v3 as inception
    graph = _spec(image_size=size, aux_head=aux_head, width_divisor=16)
    nodes = {"Conv2d_1a_3x3": "Conv2d_1a_3x3.relu", "Conv2d_2a_3x3": "Conv2d_2a_3x3.relu",
             "maxpool1": "maxpool1", "Conv2d_4a_3x3": "Conv2d_4a_3x3.relu", "maxpool2": "maxpool2",
             "Mixed_6a": "Mixed_6e.concat", "Mixed_7a": "Mixed_7c.concat",
             "AuxLogits.pool": "AuxLogits.pool", "AuxLogits.conv1": "AuxLogits.conv1.relu"}
    for layer, side in inception.grid_sizes(size, aux_head).items():
        assert graph.shape_of(nodes[layer])[1:] == (side, side), layer


def test_the_boundaries_are_accepted():
    md = tbdzoo.get_model("inception_v3")
    assert md.hparams("tiny", image_size=75, aux_head=False)["image_size"] == 75
    assert md.hparams("tiny", image_size=299, aux_head=True)["image_size"] == 299


def test_one_pixel_below_is_refused_naming_the_smallest_size_and_the_fix():
    md = tbdzoo.get_model("inception_v3")
    with pytest.raises(tbdzoo.errors.HyperparameterError,
                       match=r"image_size 298 is too small for the auxiliary head.*17 x 17 grid: "
                             r"the smallest input with the head is 299; set aux_head=false"):
        md.hparams("tiny", image_size=298, aux_head=True)
    with pytest.raises(tbdzoo.errors.HyperparameterError,
                       match=r"image_size of inception_v3 = 74 .*an integer >= 75"):
        md.hparams("tiny", image_size=74, aux_head=False)


def test_a_75_pixel_model_trains_a_step_on_torch():
    model = build_native("inception_v3", "torch", config="tiny", device="cpu", image_size=75,
                         aux_head=False, batch_size=4)
    batch = model.synthetic_batch(seed=0)
    assert batch["images"].shape == (4, 3, 75, 75)
    before = {k: v.copy() for k, v in model.get_weights().items()}
    loss = model.train_step(model.prepare_batch(batch))
    assert np.isfinite(loss)
    after = model.get_weights()
    assert any(not np.array_equal(before[k], after[k]) for k in before)
    assert model.predict(batch).shape == (4, 10)
