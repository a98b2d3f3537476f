"""Standalone source export: the written file, run where tbdzoo cannot be imported, computes
what the backend's model computes."""
import re
import sys

import numpy as np
import pytest

import tbdzoo
from export_helpers import (
    NO_TBDZOO,
    assert_one_definition_per_kind,
    assert_trains_as_the_backend,
    check_outputs,
    export_cases,
    run_exported,
    written_texts,
)
from tbdzoo.errors import TbdError, UnknownNameError
from tbdzoo.export import ExportError, export, writers

pytestmark = pytest.mark.backend

# The runner's framework part (sys.argv[2] names the framework), after NO_TBDZOO.
RUNNER = NO_TBDZOO + r'''
framework = sys.argv[2]
report = {}
for case, module, data in written_cases():
    results = []
    if framework == "torch":
        import torch
        model = module.build(case["weights"])
        model.eval()
        for call in case["calls"]:
            target = model if call["member"] is None else model.get_submodule(call["member"])
            args = [torch.from_numpy(data[n].astype(np.int64) if data[n].dtype.kind in "iu"
                                     else data[n]) for n in call["inputs"]]
            with torch.no_grad():
                out = target(*args)
            outs = out if isinstance(out, tuple) else (out,)
            for name, value in zip(call["outputs"], outs):
                got, want = value.numpy(), data[name]
                results.append(compared(call["member"], name, got, want))
        if case.get("train"):   # one training-mode loss and its gradients, by tbdzoo's names
            train = case["train"]
            model.train()
            logits = model(*[torch.from_numpy(data[n]) for n in train["inputs"]])
            loss = torch.nn.functional.cross_entropy(
                logits, torch.from_numpy(data[train["labels"]].astype(np.int64)))
            loss.backward()
            errors = {"loss": abs(float(loss) - float(data["__loss__"]))}
            for prefix, sub in model.named_modules():
                for native, parts in module._canonical(sub).items():
                    tensor = dict(sub.named_parameters(recurse=False)).get(native)
                    if tensor is None or len(parts) != 1:
                        continue
                    name = (prefix + "." if prefix else "") + parts[0]
                    want = data["__grad__" + name]
                    errors[name] = float(np.max(np.abs(tensor.grad.numpy() - want))
                                         / (1e-3 + np.max(np.abs(want))))
            results.append(["train", errors])
    if framework == "tensorflow":
        import keras
        model = module.build(case["weights"])
        def nhwc(a):
            return a.transpose(0, 2, 3, 1) if a.ndim == 4 else a
        for call in case["calls"]:
            target = model
            for part in (call["member"] or "").split(".") if call["member"] else ():
                target = target.layers[int(part)] if part.isdigit() else getattr(target, part)
            out = target(*[nhwc(data[n]) for n in call["inputs"]], training=False)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            for name, value in zip(call["outputs"], outs):
                got, want = nhwc(data[name]), np.asarray(value)
                results.append(compared(call["member"], name, got, want))
        modules = set()
        for layer in model._flatten_layers(include_self=True, recursive=True):
            modules.add(type(layer).__name__)
        report[case["name"]] = {"results": results, "modules": sorted(modules)}
        continue
    if framework == "mxnet":
        import mxnet as mx
        model = module.build(case["weights"])
        model.hybridize()
        for call in case["calls"]:
            target = model
            for part in (call["member"] or "").split(".") if call["member"] else ():
                target = target[int(part)] if part.isdigit() else getattr(target, part)
            args = [mx.nd.array(data[n], dtype="float32") for n in call["inputs"]]
            out = target(*args)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            for name, value in zip(call["outputs"], outs):
                got, want = value.asnumpy(), data[name]
                results.append(compared(call["member"], name, got, want))
        modules = set()
        def walk(block):
            modules.add(type(block).__name__)
            for child in block._children.values():
                walk(child)
        walk(model)
        report[case["name"]] = {"results": results, "modules": sorted(modules)}
        continue
    report[case["name"]] = {"results": results,
                            "modules": sorted(set(type(m).__name__ for m in model.modules()))}
print(json.dumps(report))
'''


def _run_exported(backend, tmp_path, names):
    gradients = ("resnet50",) if backend == "torch" else ()   # one loss, no dropout
    return run_exported(sys.executable, RUNNER, tmp_path,
                        export_cases(backend, tmp_path, names, gradients), [backend], 300)


@pytest.fixture(scope="module")
def torch_export(tmp_path_factory, one_torch_thread):
    # one intra-op thread on both sides (the runner has OMP_NUM_THREADS=1): with more, a
    # convolution's reduction may be split otherwise, and Inception-v3's outputs differ by
    # rounding (1.5e-6 on a 2-core host)
    pytest.importorskip("torch")
    return _run_exported("torch", tmp_path_factory.mktemp("export_torch"), tbdzoo.list_models())


MXNET_MODELS = tbdzoo.list_models()


KERAS_MODELS = tbdzoo.list_models()


@pytest.fixture(scope="module")
def keras_export(tmp_path_factory):
    return _run_exported("tensorflow", tmp_path_factory.mktemp("export_keras"), KERAS_MODELS)


@pytest.fixture(scope="module")
def mxnet_export(tmp_path_factory):
    return _run_exported("mxnet", tmp_path_factory.mktemp("export_mxnet"), MXNET_MODELS)


@pytest.mark.parametrize("name", tbdzoo.list_models())
def test_torch_source_reproduces_the_backend_without_tbdzoo(torch_export, name):
    cases, report = torch_export
    check_outputs(report, cases, name, ("Conv2d", "Linear"))


def test_torch_source_trains_as_the_backend_does(torch_export):
    """One training-mode loss of the written ResNet and its gradients, read back by tbdzoo's
    names, against the backend's loss_and_gradients on the same batch."""
    assert_trains_as_the_backend(torch_export[1])


@pytest.mark.parametrize("name", MXNET_MODELS)
def test_mxnet_source_reproduces_the_backend_without_tbdzoo(mxnet_export, name):
    cases, report = mxnet_export
    check_outputs(report, cases, name, ("Conv2D", "Dense"))


@pytest.mark.parametrize("name", KERAS_MODELS)
def test_keras_source_reproduces_the_backend_without_tbdzoo(keras_export, name):
    cases, report = keras_export
    check_outputs(report, cases, name, ("Conv2D", "Dense"))


def test_keras_source_refuses_an_op_it_has_no_layer_for_naming_it():
    from tbdzoo.backends.tensorflow import source as keras_source
    from tbdzoo.export import make_plan
    from tbdzoo.spec import Graph

    g = Graph("hand/grouped")
    x = g.input("x", (4, 8, 8))
    g.set_output(g.add("grouped", "conv2d", x, filters=4, kernel=3, padding=1, groups=2))
    with pytest.raises(TbdError, match=r"does not write op 'conv2d' \(grouped\) yet; export "
                                       "this model to PyTorch or MXNet"):
        make_plan(g, keras_source)


def test_torch_source_defines_one_class_per_block_kind(torch_export):
    cases, _ = torch_export
    text = assert_one_definition_per_kind(cases, r"^class {}\(", {"math", "numpy", "torch"})
    assert re.search(r"^class Bottleneck\(nn\.Module\):", text["resnet50"], re.M)
    assert re.search(r"^class ResNet\(nn\.Module\):", text["resnet50"], re.M)
    for name, source in text.items():
        # no flat list of layers: each class's __init__ stays short
        for body in re.split(r"^class ", source, flags=re.M)[1:]:
            init = body.split("def forward")[0]
            assert init.count("\n") < 100, (name, body.splitlines()[0])


def test_keras_source_defines_one_class_per_block_kind(keras_export):
    cases, _ = keras_export
    text = written_texts(cases)
    kinds = {"resnet50": ("Bottleneck",), "transformer": ("EncoderLayer", "DecoderLayer"),
             "wgan": ("Generator", "Critic", "UpBlock", "DownBlock"),
             "seq2seq": ("Encoder", "Decoder"), "deepspeech2": ("BatchRNNStack",),
             "faster_rcnn": ("Backbone", "RPNHead", "BoxHead", "FastRCNNPredictor")}
    for name, names in kinds.items():
        for kind in names:
            assert re.search(r"^class {}\((layers\.Layer|LayerList)\):".format(kind),
                             text[name], re.M), (name, kind)
    assert "self.generator = TiedDense(self.embed)  # shared" in text["transformer"]
    assert "layers.LSTM" in text["seq2seq"] and "layers.GRU" in text["deepspeech2"]
    # TensorFlow itself only for pads Keras' padding cannot give, in the class of every
    # instance of their place: one Bottleneck, 'same' at stride 1 and explicit at stride 2
    padded = {"resnet50", "faster_rcnn"}
    assert "self.conv2 = PaddedConv2D(conv1_filters, 3, strides=stride, padding=padding, " \
        "use_bias=False)" in text["faster_rcnn"]
    assert re.search(r"self\.conv1 = PaddedConv2D\(\d+, 7, strides=2, "
                     r"padding=\(\(3, 3\), \(3, 3\)\), use_bias=False\)", text["resnet50"])
    for name, source in text.items():
        imports = set(re.findall(r"^(?:import|from) (\w+)", source, re.M))
        allowed = {"keras", "numpy"} | ({"tensorflow"} if name in padded else set())
        assert imports == allowed, (name, imports)
        assert ("class PaddedConv2D(layers.Conv2D):" in source) == (name in padded), name


def test_paper_resnet_unifies_its_bottlenecks_with_an_optional_downsample():
    from tbdzoo.backends.torch import source as torch_source
    from tbdzoo.export import make_plan
    from tbdzoo.models import get_model

    model_def = get_model("resnet50")
    plan = make_plan(model_def.build_graph(model_def.hparams("paper")), torch_source)
    bottleneck = next(c for c in plan.classes if c.name == "Bottleneck")
    assert bottleneck.count == 16
    assert bottleneck.members["downsample"].optional is not None
    assert sorted(p.name for p in bottleneck.params) == [
        "conv1_out_channels", "conv3_out_channels", "downsample", "in_channels", "stride"]
    text = torch_source.write(plan, "resnet50", "paper", "test")
    assert "Bottleneck(256, 64, 256, stride=1, downsample=False) for _ in range(2)" in text
    assert "if self.downsample is not None:" in text
    assert len(text.splitlines()) < 250   # torchvision's resnet.py scale, not 160 layers


def test_export_names_the_backends_it_writes(tmp_path):
    assert "torch" in writers()
    for backend in ("tensorflow", "mxnet", "cntk", "jax"):
        if backend in writers():
            continue
        with pytest.raises(ExportError, match="writes source for: .*torch"):
            export("a3c", backend, str(tmp_path), config="tiny")
    with pytest.raises(UnknownNameError, match="backend"):
        export("a3c", "theano", str(tmp_path), config="tiny")
    with pytest.raises(UnknownNameError, match="model"):
        export("alexnet", "torch", str(tmp_path), config="tiny")


def test_export_refuses_a_path_it_cannot_write(tmp_path):
    with pytest.raises(ExportError, match="does not exist"):
        export("a3c", "torch", str(tmp_path / "missing" / "a3c.py"), config="tiny")
    with pytest.raises(ExportError, match="path"):
        export("a3c", "torch", 42, config="tiny")
    with pytest.raises(TbdError, match="no weights file"):
        export("a3c", "torch", str(tmp_path / "a3c.py"), config="tiny",
               weights=str(tmp_path / "trained.npz"))


def test_export_into_a_folder_writes_the_source_and_weights_beside_it(tmp_path):
    source, weights = export("a3c", "torch", str(tmp_path), config="tiny")
    assert source == str(tmp_path / "a3c_torch.py") and weights == str(tmp_path / "a3c_torch.npz")
    with np.load(weights, allow_pickle=False) as data:
        assert "conv1.weight" in data.files


def test_tbd_export_writes_the_files_and_names_a_backend_it_cannot_write(tmp_path, capsys):
    from tbdzoo.cli import main

    assert main(["export", "a3c", "--backend", "torch", "--config", "tiny",
                 "-o", str(tmp_path / "ac.py")]) == 0
    assert (tmp_path / "ac.py").exists() and (tmp_path / "ac.npz").exists()
    assert "class ActorCritic(nn.Module)" in (tmp_path / "ac.py").read_text()
    missing = [b for b in ("tensorflow", "mxnet", "cntk") if b not in writers()]
    if missing:
        assert main(["export", "a3c", "--backend", missing[0], "--config", "tiny",
                     "-o", str(tmp_path)]) == 2
        assert "writes source for" in capsys.readouterr().err
