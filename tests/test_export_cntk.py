"""CNTK source export: the written file, run by the CNTK environment's Python 3.6 where tbdzoo
cannot be imported, computes what the CNTK backend's model computes."""
import re

import pytest

import tbdzoo
from conftest import require_backend
from export_helpers import (
    NO_TBDZOO,
    assert_one_definition_per_kind,
    check_outputs,
    export_cases,
    run_exported,
)
from tbdzoo.backends import environments
from tbdzoo.errors import TbdError
from tbdzoo.export import writers

pytestmark = pytest.mark.backend

CNTK_MODELS = tbdzoo.list_models()

# After NO_TBDZOO (tests/export_helpers.py), each call builds the model's function (the root:
# function(model)) or a part's on input variables of the saved arrays' shapes, evaluates it
# and reports the largest relative error per output and, as its modules, the op names of the
# CNTK block functions it is made of.
RUNNER = NO_TBDZOO + r'''
import cntk as C
from cntk.logging import graph

report = {}
for case, module, data in written_cases():
    model = module.build(case["weights"])
    results, kinds = [], set()
    for call in case["calls"]:
        if call["member"] is None:
            f = module.function(model)
        else:
            target = model
            for part in call["member"].split("."):
                target = target[int(part)] if part.isdigit() else getattr(target, part)
            inputs = [C.input_variable(data[n].shape[1:], np.float32, name=n)
                      for n in call["inputs"]]
            out = target(*inputs)
            f = C.combine(list(out) if isinstance(out, tuple) else [out])
        arrays = module.prepare({a.name: data[a.name] for a in f.arguments})
        feed = {a: arrays[a.name] for a in f.arguments}
        got = f.eval(feed)
        if not isinstance(got, dict):
            got = {f.outputs[0]: got}
        for name, output in zip(call["outputs"], f.outputs):
            value, want = np.asarray(got[output]), data[name]
            results.append(compared(call["member"], name, value, want))
        kinds.update(b.op_name for b in graph.depth_first_search(
            f, lambda x: isinstance(x, C.Function) and x.is_block, depth=-1))
    report[case["name"]] = {"results": results, "modules": sorted(kinds)}
print(json.dumps(report))
'''


@pytest.fixture(scope="module")
def cntk_export(tmp_path_factory):
    require_backend("cntk")
    tmp_path = tmp_path_factory.mktemp("export_cntk")
    return run_exported(environments.python_of("cntk"), RUNNER, tmp_path,
                        export_cases("cntk", tmp_path, CNTK_MODELS), timeout=600)


@pytest.mark.parametrize("name", CNTK_MODELS)
def test_cntk_source_reproduces_the_backend_without_tbdzoo(cntk_export, name):
    cases, report = cntk_export
    # made of CNTK block functions, one per layer and block, as the backend's model is
    check_outputs(report, cases, name, ("Convolution2D", "Dense"))


def test_cntk_source_defines_one_function_per_block_kind(cntk_export):
    cases, _ = cntk_export
    text = assert_one_definition_per_kind(
        cases, r"^def {}\(", {"math", "collections", "numpy", "cntk"},
        [("transformer", "MultiHeadAttention"), ("faster_rcnn", "FrozenBatchNorm")])
    assert re.search(r"^def Bottleneck\(name, in_channels, ", text["resnet50"], re.M)
    assert re.search(r"^def ResNet\(name=\"\"\):", text["resnet50"], re.M)


def test_cntk_source_refuses_an_op_it_does_not_write_naming_it(tmp_path):
    from tbdzoo.backends.cntk import source
    from tbdzoo.export import make_plan
    from tbdzoo.models import get_model

    assert "cntk" in writers()
    model_def = get_model(CNTK_MODELS[0])
    graph = model_def.build_graph(model_def.hparams("tiny"))
    node = next(n for n in graph.nodes.values() if n.op == "relu")
    node.op = "lerp"   # an op of the spec the writer has no code for
    with pytest.raises(TbdError, match="CNTK source writer does not write op .lerp. .*export "
                                       "this model to PyTorch"):
        make_plan(graph, source)


def test_paper_resnet_writes_its_bottlenecks_once_per_kind_of_instance():
    """The paper ResNet's 16 Bottlenecks: one function, each stage's repeated instances one
    comprehension, the downsample an optional argument."""
    from tbdzoo.backends.cntk import source
    from tbdzoo.export import make_plan
    from tbdzoo.models import get_model

    model_def = get_model(CNTK_MODELS[0])
    plan = make_plan(model_def.build_graph(model_def.hparams("paper")), source)
    text = source.write(plan, "resnet", "paper", "test")
    assert re.search(r"^def Bottleneck\(name, in_channels, .*downsample\):", text, re.M)
    assert "self.downsample = Sequential(" in text and "if downsample else None" in text
    assert text.count(" for i in range(1, ") == 4   # a comprehension per stage
    assert len(text.splitlines()) < 400
    compile(text, "resnet_cntk.py", "exec")
