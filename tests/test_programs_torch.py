"""Training programs on the PyTorch reference backend, against what a PyTorch user writes.

The reference backend is what every other backend is compared with, so it is itself checked
against independent code: torchvision's Inception-v3 (same parameter names) and a WGAN-GP step
written with PyTorch's own double differentiation and optimizer.
"""
from collections import OrderedDict

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tbdzoo.backends import programs
from tbdzoo.backends.registry import build_native
from tbdzoo.reference.optimizers import trajectory as reference_trajectory


def test_inception_v3_matches_torchvision_loss_gradients_and_rmsprop_step():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    ours = build_native("inception_v3", "torch", device="cpu", batch_size=2, dropout=0.0,
                        num_classes=10)
    theirs = torchvision.models.inception_v3(weights=None, aux_logits=True, init_weights=False,
                                             num_classes=10, dropout=0.0)
    state = {k.replace(".gamma", ".weight").replace(".beta", ".bias"): torch.from_numpy(v)
             for k, v in ours.get_weights().items()}
    theirs.load_state_dict(state, strict=False)
    batch = ours.synthetic_batch(seed=1)
    x, y = torch.from_numpy(batch["images"]), torch.from_numpy(batch["labels"]).long()

    theirs.eval()
    with torch.no_grad():
        np.testing.assert_allclose(ours.predict(batch), theirs(x).numpy(), rtol=1e-4, atol=1e-5)

    theirs.train()
    logits, aux = theirs(x)
    loss = torch.nn.functional.cross_entropy(logits, y, label_smoothing=0.1) + \
        0.4 * torch.nn.functional.cross_entropy(aux, y, label_smoothing=0.1)
    loss.backward()
    value, grads = ours.loss_and_gradients(batch)
    assert value == pytest.approx(loss.item(), rel=1e-5)
    named = dict(theirs.named_parameters())
    for name, g in grads.items():
        expected = named[name.replace(".gamma", ".weight").replace(".beta", ".bias")].grad.numpy()
        scale = np.abs(expected).max() + 1e-12
        np.testing.assert_allclose(g / scale, expected / scale, atol=2e-4, err_msg=name)


@pytest.mark.parametrize("centered", [False, True])
def test_rmsprop_follows_the_documented_formula(centered):
    """One tensor, three steps, against the float64 reference of docs/optimizers.md: eps inside
    the root, lr inside the momentum buffer, coupled weight decay, global-norm clipping first;
    centred, the root is of the variance (the mean square less the squared mean gradient)."""
    from tbdzoo.backends.torch.optimizers import RMSProp, clip_gradients
    spec = {"kind": "rmsprop", "lr": 0.1, "alpha": 0.9, "eps": 1.0, "momentum": 0.9,
            "centered": centered, "weight_decay": 0.01}
    clip = {"kind": "global_norm", "value": 2.0}
    grads = ([3.0, 4.0, 0.0], [1.0, 1.0, 1.0], [-2.0, 0.0, 5.0])
    w = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    opt = RMSProp([w], **{k: v for k, v in spec.items() if k != "kind"})
    for grad in grads:
        w.grad = torch.tensor(grad)
        clip_gradients([w], clip)
        opt.step()
    expected = reference_trajectory(spec, [1.0, -2.0, 3.0], grads, [0.1] * 3, clip)[-1]
    np.testing.assert_allclose(w.detach().numpy(), expected, rtol=1e-6)


def handwritten_wgan_gp_step(model, step_batch):
    """One WGAN-GP step as its users write it: PyTorch's double differentiation for the
    penalty and torch.optim.Adam, on a copy of the model's network."""
    import copy
    net = copy.deepcopy(model.native)
    owner = model.program.assignment(model.spec)
    groups = {g: [net.tensor(n) for n, o in owner.items() if o == g] for g in ("generator", "critic")}
    adam = {g: torch.optim.Adam(p, lr=1e-4, betas=(0.0, 0.9), eps=1e-8) for g, p in groups.items()}
    parts, _ = programs.split_step_batch(model.spec, model.program, step_batch)
    losses = OrderedDict()
    for phase_index, part in parts:
        t = {k: torch.from_numpy(np.asarray(v)) for k, v in part.items()}
        fake = net.values(t, ("generator.tanh",))["generator.tanh"]
        if phase_index == 0:
            loss = -net.values({"noise": t["noise"]}, ("critic@fake.output",))["critic@fake.output"].mean()
            group = "generator"
        else:
            fake_score = net.values({"noise": t["noise"]}, ("critic@fake.output",))["critic@fake.output"]
            real_score = net.values({"real": t["real"]}, ("critic.output",))["critic.output"]
            a = t["alpha"].reshape(-1, 1, 1, 1)
            mixed = (a * fake + (1 - a) * t["real"]).detach().requires_grad_(True)
            score = net.values({"interpolates": mixed}, ("critic@mixed.output",))["critic@mixed.output"]
            (grad,) = torch.autograd.grad(score.sum(), mixed, create_graph=True)
            penalty = ((grad.flatten(1).norm(dim=1) - 1) ** 2).mean()
            loss = fake_score.mean() - real_score.mean() + 10.0 * penalty
            group = "critic"
        adam[group].zero_grad()
        loss.backward(inputs=groups[group])
        adam[group].step()
        losses[group] = loss.item()
    return losses, OrderedDict((n, net.tensor(n).detach().numpy().copy()) for n in owner)


def test_a_wgan_gp_step_equals_a_handwritten_one():
    """Alternation (one generator update, then n_critic critic updates on batches of their
    own), per-group Adam with beta1 = 0, and the penalty through the spec's derivative graph."""
    model = build_native("wgan", "torch", config="tiny", device="cpu")
    batch = model.synthetic_batch(seed=3)
    expected_losses, expected_weights = handwritten_wgan_gp_step(model, batch)
    losses = model.train_step(batch)
    assert list(losses) == ["generator", "critic"]
    assert losses["generator"] == pytest.approx(expected_losses["generator"], rel=1e-5)
    assert losses["critic"] == pytest.approx(expected_losses["critic"], rel=1e-4)
    weights = model.get_weights()
    for name, value in expected_weights.items():
        np.testing.assert_allclose(weights[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    assert dict(model.group_steps) == {"generator": 1, "critic": 2}


def test_the_original_wgan_clips_the_critic_after_each_update():
    model = build_native("wgan", "torch", config="tiny_original", device="cpu")
    model.train_step(model.synthetic_batch(seed=0))
    weights = model.get_weights()
    owner = model.program.assignment(model.spec)
    assert max(np.abs(weights[n]).max() for n, g in owner.items() if g == "critic") <= 0.01
    assert max(np.abs(weights[n]).max() for n, g in owner.items() if g == "generator") > 0.01


def test_a_step_batch_that_does_not_split_is_refused_by_input():
    model = build_native("wgan", "torch", config="tiny", device="cpu")
    batch = model.synthetic_batch(seed=0)
    batch["real"] = batch["real"][:-1]
    with pytest.raises(ValueError, match="\\['real'\\] has 5 rows"):
        model.train_step(batch)


def test_wgan_gp_trains_in_bf16():
    """Mixed precision through the penalty's derivative nodes (autocast mixes bf16 and fp32)."""
    model = build_native("wgan", "torch", config="tiny", device="cpu", precision="bf16")
    losses = model.train_step(model.synthetic_batch(seed=0))
    assert all(np.isfinite(v) for v in losses.values())
