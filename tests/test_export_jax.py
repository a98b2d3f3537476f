"""Flax source export: the written file, run by the JAX environment's Python where tbdzoo
cannot be imported, computes what the jax backend's model computes."""
import json
import os
import re
import subprocess

import numpy as np
import pytest

import tbdzoo
from conftest import require_backend
from tbdzoo.backends import environments
from tbdzoo.errors import TbdError
from tbdzoo.export import export, make_plan, writers
from tbdzoo.models import get_model
from tbdzoo.spec.tree import build_tree

pytestmark = pytest.mark.backend

TOLERANCE = 1e-6
JAX_MODELS = tbdzoo.list_models()

# python -I (no PYTHONPATH, no user site), tbdzoo blocked even where it is installed. Each call
# runs the model (or one of its top-level parts) in eval mode, jitted as the backend's predict
# is, on the saved arrays and reports
# the largest relative error per output and the class names of the NNX modules it holds.
RUNNER = r'''
import importlib.abc, importlib.util, json, sys

class _NoTbdzoo(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "tbdzoo" or name.startswith("tbdzoo."):
            raise ImportError("tbdzoo is not importable here")
        return None

sys.meta_path.insert(0, _NoTbdzoo())
try:
    import tbdzoo  # noqa: F401
    raise SystemExit("tbdzoo could be imported")
except ImportError:
    pass
import numpy as np
import jax
import jax.numpy as jnp
from flax import nnx

report = {}
for case in json.load(open(sys.argv[1])):
    spec = importlib.util.spec_from_file_location("exported_" + case["name"], case["source"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = np.load(case["arrays"], allow_pickle=False)
    model = module.build(case["weights"])
    results = []
    for call in case["calls"]:
        target = model
        for part in (call["member"] or "").split(".") if call["member"] else ():
            target = module._child(target, part)
        out = nnx.jit(lambda m, *xs: m(*xs))(target, *[jnp.asarray(data[n])
                                                       for n in call["inputs"]])
        outs = out if isinstance(out, tuple) else (out,)
        for name, value in zip(call["outputs"], outs):
            got, want = np.asarray(value), data[name]
            results.append([call["member"], name, list(got.shape), list(want.shape),
                            float(np.max(np.abs(got - want) / (1.0 + np.abs(want))))
                            if got.shape == want.shape else None])
    if case.get("train"):   # one training-mode loss and its gradients, by tbdzoo's names
        train = case["train"]
        model.train()
        inputs = [jnp.asarray(data[n]) for n in train["inputs"]]
        labels = jnp.asarray(data[train["labels"]])

        def loss_fn(m):
            log_p = jax.nn.log_softmax(m(*inputs), axis=-1)
            return -jnp.take_along_axis(log_p, labels[:, None], axis=-1).mean()
        loss, grads = nnx.jit(nnx.value_and_grad(loss_fn))(model)
        flat = dict(nnx.to_flat_state(grads))
        path_of = {id(v): p for p, v in nnx.iter_graph(model) if isinstance(v, nnx.Variable)}
        errors = {"loss": abs(float(loss) - float(data["__loss__"]))}
        for key in data.files:
            if key.startswith("__grad__"):
                name = key[len("__grad__"):]
                var, change = module._variable(model, name)
                want = data[key]
                got = np.asarray(flat[path_of[id(var)]][...])
                native = change(want) if change is not None else want
                errors[name] = float(np.max(np.abs(got - native)) / (1e-3 + np.max(np.abs(want))))
        results.append(["train", errors])
    modules = sorted(set(type(node).__name__ for _, node in nnx.iter_graph(model)
                         if isinstance(node, nnx.Module)))
    report[case["name"]] = {"results": results, "modules": modules}
print(json.dumps(report))
'''


def _cases(tmp_path, names):
    """Export the models ``names`` (tiny) from the jax backend and save the arrays each call
    (the model, and each of its top-level parts on its own) reads and gives."""
    cases = []
    for name in names:
        model = tbdzoo.build(name, backend="jax", config="tiny", seed=0)
        try:
            source, weights = export(model, "jax", str(tmp_path / (name + ".py")))
            batch = dict(model.synthetic_batch(seed=1))
            graph = model.spec
            if graph.program is not None and graph.program.targets_step is not None:
                batch.update(model.step_targets(batch))   # Faster R-CNN's RoIs
            root = build_tree(graph)
            calls = [(None, root.inputs, [graph.output])]
            for path, child in root.children.items():
                if any(b.layers for b in child.walk()):
                    calls.append((path, child.inputs, child.outputs))
            arrays = {n: np.asarray(batch[n]) for _, ins, _ in calls for n in ins
                      if n in graph.inputs}
            for _, ins, outs in calls[1:]:
                arrays.update(model.values(batch, [n for n in list(ins) + list(outs)
                                                   if n not in graph.inputs]))
            if model.model_def.inference is None:   # predict is the graph's output
                arrays[graph.output] = model.predict(batch)
            else:
                arrays.update(model.values(batch, [graph.output]))
            train = None
            if name == "resnet50":   # one loss, no dropout: comparable
                loss, grads = model.loss_and_gradients(batch)
                arrays["__loss__"] = np.asarray(loss)
                arrays["labels"] = np.asarray(batch["labels"])
                arrays.update(("__grad__" + k, np.asarray(v)) for k, v in grads.items())
                train = {"inputs": list(root.inputs), "labels": "labels"}
            path = str(tmp_path / (name + ".arrays.npz"))
            np.savez(path, **arrays)
            cases.append({"name": name, "source": source, "weights": weights, "arrays": path,
                          "calls": [{"member": m, "inputs": list(i), "outputs": list(o)}
                                    for m, i, o in calls], "train": train})
        finally:
            model.close()
    return cases


@pytest.fixture(scope="module")
def jax_export(tmp_path_factory):
    require_backend("jax")
    tmp_path = tmp_path_factory.mktemp("export_jax")
    cases = _cases(tmp_path, JAX_MODELS)
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    (tmp_path / "runner.py").write_text(RUNNER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run([environments.python_for("jax"), "-I", str(tmp_path / "runner.py"),
                           str(tmp_path / "cases.json")], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return cases, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", JAX_MODELS)
def test_flax_source_reproduces_the_backend_without_tbdzoo(jax_export, name):
    cases, report = jax_export
    case = next(c for c in cases if c["name"] == name)
    results = [r for r in report[name]["results"] if r[0] != "train"]
    assert len(results) == sum(len(c["outputs"]) for c in case["calls"])
    for member, output, got, want, error in results:
        assert got == want, "{} {}: shape {} != {}".format(member, output, got, want)
        assert error <= TOLERANCE, "{} {}: relative error {}".format(member, output, error)
    # Flax's own layers, not an interpreter of the graph
    assert {"Conv2d", "Linear"} & set(report[name]["modules"]), report[name]["modules"]


def test_flax_source_trains_as_the_backend_does(jax_export):
    """One training-mode loss of the written ResNet (batch statistics) and its gradients, read
    back by tbdzoo's names, against the backend's loss_and_gradients on the same batch."""
    _, report = jax_export
    errors = next(r[1] for r in report["resnet50"]["results"] if r[0] == "train")
    assert len(errors) == 1 + 53   # the loss and every trainable tensor
    assert errors.pop("loss") < 1e-5
    worst = max(errors, key=errors.get)
    assert errors[worst] < 1e-5, (worst, errors[worst])


def test_flax_source_defines_one_module_class_per_block_kind(jax_export):
    cases, _ = jax_export
    text = {}
    for case in cases:
        with open(case["source"]) as f:
            text[case["name"]] = f.read()
    kinds = {"resnet50": ("Bottleneck", "ResNet"),
             "inception_v3": ("BasicConv2d", "InceptionA", "InceptionE", "InceptionAux"),
             "transformer": ("EncoderLayer", "DecoderLayer", "FeedForward", "Transformer"),
             "wgan": ("Generator", "Critic", "UpBlock", "DownBlock"),
             "seq2seq": ("Encoder", "Decoder", "LSTM", "AdditiveAttention"),
             "deepspeech2": ("BatchRNNStack", "GRU", "GRUCell", "SequenceBatchNorm"),
             "faster_rcnn": ("Backbone", "RPNHead", "BoxHead", "FastRCNNPredictor")}
    for name, names in kinds.items():
        for kind in names:
            assert re.search(r"^class {}\((nnx\.\w+|Recurrent)\):".format(kind), text[name],
                             re.M), (name, kind)
    assert "self.generator.weight = self.embed.embedding  # shared" in text["transformer"]
    assert "class Conv2d(nnx.Conv):" in text["resnet50"] and "class BatchNorm(nnx.BatchNorm):" in \
        text["resnet50"]
    for name, source in text.items():
        imports = set(re.findall(r"^(?:import|from) (\w+)", source, re.M))
        assert imports <= {"jax", "flax", "optax", "numpy"}, (name, imports)
        assert "tbdzoo" not in re.sub(r'""".*?"""', "", source, flags=re.S), name


def test_flax_source_refuses_an_op_it_does_not_write_naming_it(tmp_path):
    from tbdzoo.backends.jax import source

    assert "jax" in writers()
    model_def = get_model(JAX_MODELS[0])
    graph = model_def.build_graph(model_def.hparams("tiny"))
    node = next(n for n in graph.nodes.values() if n.op == "relu")
    node.op = "relu_grad"   # an op of the spec (WGAN-GP's derivative) the writer has no code for
    with pytest.raises(TbdError, match=r"Flax source writer has no code for op 'relu_grad' "
                                       r"\(.*\) yet; export this model to PyTorch"):
        make_plan(graph, source)


def test_paper_resnet_writes_its_bottlenecks_once_per_kind_of_instance():
    from tbdzoo.backends.jax import source

    model_def = get_model(JAX_MODELS[0])
    plan = make_plan(model_def.build_graph(model_def.hparams("paper")), source)
    text = source.write(plan, "resnet50", "paper", "test")
    assert re.search(r"^    def __init__\(self, in_channels, .*downsample, \*, rngs\):", text,
                     re.M)
    assert "Bottleneck(256, 64, 256, stride=1, downsample=False, rngs=rngs) for _ in " \
           "range(2)" in text
    assert "if self.downsample is not None:" in text
    assert len(text.splitlines()) < 400
    compile(text, "resnet50_jax.py", "exec")
    assert re.findall(r"^class (\w+)", text, re.M) == ["Conv2d", "BatchNorm", "Bottleneck",
                                                      "ResNet"]
