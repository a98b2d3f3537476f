"""Flax source export: the written file, run by the JAX environment's Python where tbdzoo
cannot be imported, computes what the jax backend's model computes."""
import re

import pytest

import tbdzoo
from conftest import require_backend
from export_helpers import (
    NO_TBDZOO,
    assert_one_definition_per_kind,
    assert_trains_as_the_backend,
    check_outputs,
    export_cases,
    run_exported,
)
from tbdzoo.backends import environments
from tbdzoo.errors import TbdError
from tbdzoo.export import make_plan, writers
from tbdzoo.models import get_model

pytestmark = pytest.mark.backend

JAX_MODELS = tbdzoo.list_models()

# After NO_TBDZOO (tests/export_helpers.py), each call runs the model (or one of its top-level
# parts) in eval mode, jitted as the backend's predict is, on the saved arrays and reports the
# largest relative error per output and the class names of the NNX modules it holds.
RUNNER = NO_TBDZOO + r'''
import jax
import jax.numpy as jnp
from flax import nnx

report = {}
for case, module, data in written_cases():
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
            results.append(compared(call["member"], name, got, want))
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


@pytest.fixture(scope="module")
def jax_export(tmp_path_factory):
    require_backend("jax")
    tmp_path = tmp_path_factory.mktemp("export_jax")
    cases = export_cases("jax", tmp_path, JAX_MODELS, gradients=("resnet50",))
    return run_exported(environments.python_for("jax"), RUNNER, tmp_path, cases, timeout=900)


@pytest.mark.parametrize("name", JAX_MODELS)
def test_flax_source_reproduces_the_backend_without_tbdzoo(jax_export, name):
    cases, report = jax_export
    check_outputs(report, cases, name, ("Conv2d", "Linear"))   # Flax's own layers


def test_flax_source_trains_as_the_backend_does(jax_export):
    """One training-mode loss of the written ResNet (batch statistics) and its gradients, read
    back by tbdzoo's names, against the backend's loss_and_gradients on the same batch."""
    assert_trains_as_the_backend(jax_export[1])


def test_flax_source_defines_one_module_class_per_block_kind(jax_export):
    cases, _ = jax_export
    text = assert_one_definition_per_kind(cases, r"^class {}\((nnx\.\w+|Recurrent)\):",
                                          {"jax", "flax", "optax", "numpy"},
                                          [("deepspeech2", "GRUCell")])
    assert "self.generator.weight = self.embed.embedding  # shared" in text["transformer"]
    assert "class Conv2d(nnx.Conv):" in text["resnet50"] and "class BatchNorm(nnx.BatchNorm):" in \
        text["resnet50"]


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
