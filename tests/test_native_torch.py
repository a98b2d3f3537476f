"""The PyTorch backend's model is a tree of torch.nn modules that behaves like one."""
import io
import sys

import numpy as np
import pytest
import torch
from torch import nn

import tbdzoo
from conftest import run_in_env
from tbdzoo.models.catalog import list_models

pytestmark = pytest.mark.backend

MODELS = list_models()


def _model(name, seed=0):
    return tbdzoo.build(name, backend="torch", config="tiny", seed=seed, device="cpu")


def _batch(model):
    return model.synthetic_batch(seed=3)


def _output_name(model):
    """The model's output; for a model whose output needs a targets step's written inputs
    (Faster R-CNN's box head reads the sampled RoIs), the first value that step reads."""
    step = model.program.targets_step if model.program is not None else None
    return step["reads"][0] if step is not None else model.spec.output


def _output(model, batch):
    name = _output_name(model)
    return model.values(batch, [name])[name]


def _last_layer(model):
    """The (path, layer) of the last dense layer or convolution the output reads."""
    graph = model.spec
    wanted = {_output_name(model)}
    for node in reversed(list(graph.nodes.values())):
        if node.name not in wanted:
            continue
        if node.op in ("dense", "conv2d"):
            return node.name, model.native.get_submodule(node.name)
        wanted.update(node.inputs)
    raise AssertionError("no head in " + graph.name)


@pytest.mark.parametrize("name", MODELS)
def test_prints_torch_layers_and_block_classes(name):
    model = _model(name)
    text = str(model.native)
    assert type(model.native).__name__ in text.splitlines()[0]
    assert any(isinstance(m, (nn.Conv2d, nn.Linear)) for m in model.native.modules())
    kinds = set(model.spec.blocks.values())
    for kind in kinds:
        if any(s == "" or s in dict(model.native.named_modules()) for s, k in
               model.spec.blocks.items() if k == kind):
            assert kind in text, kind
    assert "Module()" not in text


@pytest.mark.parametrize("name", MODELS)
def test_inner_block_is_callable_and_its_hook_fires(name):
    model = _model(name)
    blocks = [(n, m) for n, m in model.native.named_modules()
              if n and type(m).__module__ == "tbdzoo.backends.torch.native"]
    seen = {}
    handles = []
    def hook(path):
        def record(module, args, out):
            seen.setdefault(path, (args, out))   # returns None: the output stays as it is
        return record
    for path, module in blocks:
        handles.append(module.register_forward_hook(hook(path)))
    model.predict(_batch(model))
    for h in handles:
        h.remove()
    called = [p for p, _ in blocks if p in seen]
    if not blocks:
        pytest.skip("{} has no blocks below the model".format(name))
    assert called, "no block's hook fired during predict"
    path = called[0]
    args, out = seen[path]
    module = model.native.get_submodule(path)
    with torch.no_grad():
        again = module(*args)
    outs = again if isinstance(again, tuple) else (again,)
    ref = out if isinstance(out, tuple) else (out,)
    for a, b in zip(outs, ref):
        np.testing.assert_allclose(a.float().numpy(), b.float().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", MODELS)
def test_replacing_the_head_changes_the_output(name):
    model = _model(name)
    batch = _batch(model)
    before = _output(model, batch)
    path, head = _last_layer(model)
    parent_path, _, local = path.rpartition(".")
    parent = model.native.get_submodule(parent_path) if parent_path else model.native
    if isinstance(head, nn.Linear):
        new = nn.Linear(head.in_features, head.out_features + 3)
    else:
        new = nn.Conv2d(head.in_channels, head.out_channels + 3, head.kernel_size,
                        head.stride, head.padding)
    setattr(parent, local, new)
    after = _output(model, batch)
    assert after.shape != before.shape
    assert getattr(parent, local) is new


@pytest.mark.parametrize("name", MODELS)
def test_state_dict_round_trips(name, tmp_path):
    model = _model(name, seed=0)
    batch = _batch(model)
    expected = _output(model, batch)
    path = tmp_path / "m.pt"
    torch.save(model.native.state_dict(), path)
    other = _model(name, seed=1)
    assert not np.allclose(_output(other, batch), expected)
    other.native.load_state_dict(torch.load(path, weights_only=True), strict=True)
    np.testing.assert_allclose(_output(other, batch), expected, rtol=1e-6, atol=1e-6)
    # the canonical view reads what the module holds
    weights = other.get_weights()
    for key, value in model.get_weights().items():
        np.testing.assert_array_equal(weights[key], value)


def test_training_updates_the_native_layers():
    model = _model("resnet50")
    before = model.native.fc.weight.detach().clone()
    model.train_step(_batch(model))
    assert not torch.equal(before, model.native.fc.weight)
    np.testing.assert_array_equal(model.get_weights()["fc.weight"],
                                  model.native.fc.weight.detach().numpy())


# Run in a fresh interpreter, as a user's export script would: tracing leaves Dynamo's and
# FX's state (guards, fake tensors, caches) in the process, which the shared test process
# then carries into every later test.
_EXPORT = """
import sys
import numpy as np
import torch
import tbdzoo

name = sys.argv[1]
model = tbdzoo.build(name, backend="torch", config="tiny", seed=0, device="cpu")
batch = model.synthetic_batch(seed=3)
if model.program is not None and model.program.targets_step is not None:
    batch = dict(batch, **model.step_targets(batch))
net = model.native.eval()
args = [torch.from_numpy(np.asarray(batch[n])) for n in net.input_names]
program = torch.export.export(net, tuple(args))
lengths = [i for i, n in enumerate(net.input_names) if n.endswith("lengths")]
for i in lengths:  # shorter examples than the traced ones, at least one step each
    args[i] = (args[i] - torch.arange(len(args[i])) % 3).clamp(min=1)
with torch.no_grad():
    np.testing.assert_allclose(program.module()(*args).numpy(), net(*args).numpy(),
                               rtol=1e-5, atol=1e-6)
print("lengths", len(lengths))
"""


@pytest.mark.parametrize("name", MODELS)
def test_torch_export_gives_the_same_outputs(name):
    """Every model exports (Faster R-CNN given its targets step's RoIs, as the module is
    called); a program traced on one batch's lengths gives the module's outputs on others:
    the recurrences and the sequence BatchNorm read no lengths on the host under export."""
    proc = run_in_env(sys.executable, ["-c", _EXPORT, name], timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert ("lengths 0" not in proc.stdout) == (name in ("seq2seq", "deepspeech2")), proc.stdout


def _tv_state(model):
    return {k: v for k, v in model.state_dict().items()}


def test_resnet50_loads_torchvision_weights_and_agrees():
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    reference = tv.models.resnet50(weights=None).eval()
    model = tbdzoo.build("resnet50", backend="torch", device="cpu")
    model.native.load_state_dict(_tv_state(reference), strict=True)
    x = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        np.testing.assert_allclose(model.native.eval()(x).numpy(), reference(x).numpy(),
                                   rtol=1e-5, atol=1e-5)


def test_inception_v3_loads_torchvision_weights_and_agrees():
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    reference = tv.models.inception_v3(weights=None, aux_logits=True, init_weights=False,
                                       transform_input=False).eval()
    model = tbdzoo.build("inception_v3", backend="torch", device="cpu")
    model.native.load_state_dict(_tv_state(reference), strict=True)
    x = torch.randn(1, 3, 299, 299)
    with torch.no_grad():
        np.testing.assert_allclose(model.native.eval()(x).numpy(), reference(x).numpy(),
                                   rtol=1e-5, atol=1e-5)


def test_faster_rcnn_backbone_loads_torchvision_resnet101():
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    resnet = tv.models.resnet101(weights=None).eval()
    # torchvision's FrozenBatchNorm2d's epsilon, not the MXNet reference's 2e-5
    model = tbdzoo.build("faster_rcnn", backend="torch", device="cpu", bn_eps=1e-5)
    state = _tv_state(resnet)
    backbone = {k: v for k, v in state.items() if not k.startswith(("layer4.", "fc."))}
    model.native.backbone.load_state_dict(backbone, strict=True)
    head = {k[len("layer4."):]: v for k, v in state.items() if k.startswith("layer4.")}
    model.native.roi_heads.box_head.layer4.load_state_dict(head, strict=True)
    x = torch.randn(1, 3, 64, 64)
    trunk = nn.Sequential(resnet.conv1, resnet.bn1, resnet.relu, resnet.maxpool, resnet.layer1,
                          resnet.layer2, resnet.layer3)
    with torch.no_grad():
        np.testing.assert_allclose(model.native.eval().backbone(x).numpy(), trunk(x).numpy(),
                                   rtol=1e-4, atol=1e-5)


def test_wgan_exposes_generator_and_critic():
    model = _model("wgan")
    net = model.native
    noise = torch.randn(2, model.hparams["z_dim"])
    with torch.no_grad():
        images = net.generator(noise)
        scores = net.critic(images)
    assert images.shape[1] == 3 and scores.shape == (2, 1)
    buffer = io.BytesIO()
    torch.save(net.critic.state_dict(), buffer)
    assert len(buffer.getvalue()) > 0
