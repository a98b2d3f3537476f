"""What the source-export tests share (tests/test_export*.py): the exported models' cases and
arrays, the fresh interpreter that runs the written files where tbdzoo cannot be imported, and
the check of what it reports."""
import json
import os
import re
import subprocess

import numpy as np

import tbdzoo
from tbdzoo.export import export
from tbdzoo.spec.tree import build_tree

TOLERANCE = 1e-6

# The start of every runner: run by python -I (no PYTHONPATH, no user site), with tbdzoo
# blocked even where the environment installs it, so the exported file must stand alone, and
# Python 3.6 for CNTK. The rest of a runner runs each call of each case (written_cases) and
# prints one JSON line: {model name: {"results": [compared(...) for each output, ...],
# "modules": [the framework classes the model is made of]}}.
NO_TBDZOO = r'''
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


def written_cases():
    """Each case of sys.argv[1] with its written module, loaded, and its arrays."""
    for case in json.load(open(sys.argv[1])):
        spec = importlib.util.spec_from_file_location("exported_" + case["name"], case["source"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield case, module, np.load(case["arrays"], allow_pickle=False)


def compared(member, name, got, want):
    """The report's row of one output: the shapes and the largest error relative to 1 + |want|."""
    return [member, name, list(got.shape), list(want.shape),
            float(np.max(np.abs(got - want) / (1.0 + np.abs(want))))
            if got.shape == want.shape else None]
'''


def export_cases(backend, tmp_path, names, gradients=()):
    """Export the models ``names`` (tiny) from ``backend`` and save the arrays each call (the
    model, and each of its top-level parts on its own) reads and gives. For a model in
    ``gradients`` the case also has ``train``: one loss and the gradients of every trainable
    tensor, by tbdzoo's names (``__loss__``, ``__grad__<name>``), on the labels ``labels``."""
    cases = []
    for name in names:
        model = tbdzoo.build(name, backend=backend, config="tiny", seed=0)
        try:
            source, weights = export(model, backend, str(tmp_path / (name + ".py")))
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
            for _, ins, outs in calls[1:]:   # each part reads a batch of its own inputs
                arrays.update(model.values(batch, [n for n in list(ins) + list(outs)
                                                   if n not in graph.inputs]))
            if model.model_def.inference is None:   # predict is the graph's output
                arrays[graph.output] = model.predict(batch)
            else:
                arrays.update(model.values(batch, [graph.output]))
            train = None
            if name in gradients:
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


def run_exported(python, runner, tmp_path, cases, args=(), timeout=600):
    """Run ``runner`` (a script that starts with NO_TBDZOO) by ``python -I``, one intra-op
    thread, on ``cases`` (and ``args``); returns (cases, its report)."""
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    (tmp_path / "runner.py").write_text(runner)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run([python, "-I", str(tmp_path / "runner.py"),
                           str(tmp_path / "cases.json")] + list(args), cwd=str(tmp_path),
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return cases, json.loads(done.stdout.strip().splitlines()[-1])


def check_outputs(report, cases, name, layers, tolerance=TOLERANCE):
    """Every call of model ``name`` gave each output at its shape, within ``tolerance``, and
    the model is made of the framework's own ``layers`` (some of them), not an interpreter of
    the graph."""
    results = [r for r in report[name]["results"] if r[0] != "train"]
    case = next(c for c in cases if c["name"] == name)
    assert len(results) == sum(len(c["outputs"]) for c in case["calls"])
    for member, output, got, want, error in results:
        assert got == want, "{} {}: shape {} != {}".format(member, output, got, want)
        assert error <= tolerance, "{} {}: relative error {}".format(member, output, error)
    assert set(layers) & set(report[name]["modules"]), report[name]["modules"]


def assert_trains_as_the_backend(report):
    """One training-mode loss of the written ResNet and its gradients, read back by tbdzoo's
    names, against the backend's loss_and_gradients on the same batch."""
    errors = next(r[1] for r in report["resnet50"]["results"] if r[0] == "train")
    assert len(errors) == 1 + 53   # the loss and every trainable tensor
    assert errors.pop("loss") < 1e-5
    worst = max(errors, key=errors.get)
    assert errors[worst] < 1e-5, (worst, errors[worst])


def written_texts(cases):
    """Each exported model's written file, by model name."""
    text = {}
    for case in cases:
        with open(case["source"]) as f:
            text[case["name"]] = f.read()
    return text


# The block kinds of each model's spec that every writer defines, one class (or CNTK function)
# a kind, whatever number of instances the model holds
BLOCK_KINDS = {"resnet50": ("Bottleneck", "ResNet"),
               "inception_v3": ("BasicConv2d", "InceptionA", "InceptionE", "InceptionAux",
                                "Inception3"),
               "transformer": ("EncoderLayer", "DecoderLayer", "FeedForward", "Transformer"),
               "wgan": ("Generator", "Critic", "UpBlock", "DownBlock"),
               "seq2seq": ("Encoder", "Decoder", "LSTM", "AdditiveAttention"),
               "deepspeech2": ("BatchRNNStack", "GRU", "SequenceBatchNorm", "DeepSpeech2"),
               "faster_rcnn": ("Backbone", "RPNHead", "BoxHead", "FastRCNNPredictor")}


def assert_one_definition_per_kind(cases, definition, imports, extra=()):
    """Each written file defines each of its model's BLOCK_KINDS and the (model, kind) pairs
    of ``extra`` (``definition`` formats a kind into the regular expression of its definition's
    first line), imports nothing but ``imports`` and names tbdzoo only in docstrings. Returns
    the files' texts by model name."""
    text = written_texts(cases)
    pairs = [(name, kind) for name, kinds in BLOCK_KINDS.items() for kind in kinds]
    for name, kind in pairs + list(extra):
        assert re.search(definition.format(kind), text[name], re.M), (name, kind)
    for name, source in text.items():
        found = set(re.findall(r"^(?:import|from) (\w+)", source, re.M))
        assert found <= set(imports), (name, found)
        assert "tbdzoo" not in re.sub(r'""".*?"""', "", source, flags=re.S), name
    return text
