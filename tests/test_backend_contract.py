"""What every backend promises, checked on all four the same way: canonical weights that round
trip exactly (tied ones included), and BatchNorm running statistics that follow the spec
whatever the framework's own convention; and the shared layer under them: every op the spec
lists implemented everywhere, a model refused at build when its backend lacks an op, and the
shared tables against direct computations."""
import copy
import importlib
import inspect
import json
import os

import numpy as np
import pytest

import tbdzoo
from conftest import random_weights, require_backend, run_in_env
from tbdzoo.backends import environments, remote
from tbdzoo.backends.common import attention, kernels, op_support, pooling
from tbdzoo.errors import BatchError, UnsupportedOpError, UnsupportedOptionError
from tbdzoo.models import get_model
from tbdzoo.spec import Graph
from tbdzoo.spec import ops as spec_ops

BACKENDS = ["torch", "tensorflow", "mxnet", "cntk", "jax"]


@pytest.mark.parametrize("name", ["resnet50", "probe/tied_dense"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_round_trip(backend, name, tmp_path):
    require_backend(backend)
    path = tmp_path / "w.npz"
    with tbdzoo.build(name, backend=backend, config="tiny", isolate=True) as model:
        weights = random_weights(model)
        model.set_weights(weights)
        got = model.get_weights()
        assert list(got) == list(model.spec.params())
        for key, value in got.items():
            np.testing.assert_array_equal(value, weights[key])
        model.save_weights(path)
    with tbdzoo.build(name, backend=backend, config="tiny", seed=7, isolate=True) as other:
        other.load_weights(path)
        for key, value in other.get_weights().items():
            np.testing.assert_array_equal(value, weights[key])


@pytest.mark.parametrize("backend", BACKENDS)
def test_running_statistics_follow_the_spec(backend):
    require_backend(backend)
    with tbdzoo.build("probe/batchnorm", backend=backend, config="tiny", isolate=True) as model:
        batch = model.synthetic_batch()
        before = model.get_weights()
        model.loss_and_gradients(batch)
        for key, value in model.get_weights().items():
            np.testing.assert_array_equal(value, before[key])
        model.train_step(batch)
        after = model.get_weights()
    x = batch["x"].astype(np.float64)
    m = model.spec.nodes["bn"].attrs["momentum"]
    np.testing.assert_allclose(after["bn.running_mean"], m * x.mean(axis=(0, 2, 3)), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(after["bn.running_var"],
                               (1 - m) + m * x.var(axis=(0, 2, 3), ddof=1), rtol=1e-5)


# -- the ops each backend implements ---------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_implements_every_op_the_spec_lists(backend):
    """Read from each backend's ops.py, so it runs for all four with no framework imported."""
    assert op_support.missing(backend) == []
    assert op_support.implemented(backend) == spec_ops.names()


def _real_ops(backend):
    """The spec's ops the imported backend can run: functions of its ops module (and, on
    TensorFlow, of its layout adapters too)."""
    module = importlib.import_module("tbdzoo.backends.{}.ops".format(backend))
    real = [op for op in spec_ops.names() if callable(getattr(module, op, None))]
    if backend == "tensorflow":
        from tbdzoo.backends.tensorflow.adapters import RUN
        real = [op for op in real if op in RUN]
    return real


_REAL_OPS = "import json, sys\n{}\nprint(json.dumps(_real_ops(sys.argv[1])))\n"


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_ops_read_from_source_are_the_ones_the_imported_backend_has(backend):
    """The static reading agrees with the module the framework imports: in this interpreter
    where it can (the suite imports those frameworks anyway), else in the backend's own."""
    require_backend(backend)
    if environments.importable_here(backend):
        real = _real_ops(backend)
    else:
        code = "import importlib\nfrom tbdzoo.spec import ops as spec_ops\n" + \
            _REAL_OPS.format(inspect.getsource(_real_ops))
        proc = run_in_env(environments.python_for(backend), ["-c", code, backend], timeout=600)
        assert proc.returncode == 0, proc.stderr
        real = json.loads(proc.stdout.strip().splitlines()[-1])
    assert real == op_support.implemented(backend)


class _Mystery(spec_ops.OpDef):
    name = "mystery_op"


@pytest.fixture
def mystery_model(monkeypatch):
    """probe/relu_add's hyperparameters on a graph with an op that no backend implements."""
    monkeypatch.setitem(spec_ops._REGISTRY, _Mystery.name, _Mystery())

    def build(hp):
        g = Graph("mystery")
        x = g.add("odd", "mystery_op", g.input("x", (4,)))
        y = g.add("fc", "dense", x, units=3)
        g.input("labels", (), dtype="int32", role="target")
        g.set_output(y)
        g.set_loss("softmax_cross_entropy", logits=y, labels="labels", label_smoothing=0.0,
                   ignore_index=None)
        return g

    model_def = copy.copy(get_model("probe/relu_add"))
    model_def.name, model_def.build_graph = "mystery", build
    return model_def


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_op_the_backend_lacks_is_refused_before_a_worker_starts(backend, mystery_model,
                                                                   monkeypatch):
    def no_worker(*args, **kwargs):
        raise AssertionError("a worker was started for a model that cannot be built")

    monkeypatch.setattr(remote.subprocess, "Popen", no_worker)
    with pytest.raises(UnsupportedOpError) as error:
        remote.RemoteModel(mystery_model, mystery_model.hparams("tiny"), 0, backend)
    message = str(error.value)
    assert "'mystery_op'" in message and "backend {}".format(backend) in message
    assert "tbdzoo/backends/{}/ops.py".format(backend) in message


def test_an_op_the_backend_lacks_is_refused_in_process_the_same_way(mystery_model):
    require_backend("torch")
    from tbdzoo.backends.torch.model import Model
    with pytest.raises(UnsupportedOpError, match="backend torch does not implement op 'mystery_op'"):
        Model(mystery_model, mystery_model.hparams("tiny"), device="cpu")


def test_an_unknown_optimizer_is_refused_before_a_worker_starts(monkeypatch):
    monkeypatch.setattr(remote.subprocess, "Popen", None)  # calling it would fail the test
    model_def = get_model("probe/relu_add")
    hparams = model_def.hparams("tiny")
    hparams["optimizer"] = "rmsprop"
    with pytest.raises(UnsupportedOptionError, match="optimizer 'rmsprop'.*sgd, adam"):
        remote.RemoteModel(model_def, hparams, 0, "cntk")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batch_the_model_cannot_take_is_refused_the_same_way_everywhere(backend, monkeypatch):
    """The one batch check (BackendModel._check_batch): the model's own rules, then the
    sequences', on every path of every backend; a worker-backed model refuses the batch before
    it crosses to the worker."""
    require_backend(backend)
    with tbdzoo.build("seq2seq", backend=backend, config="tiny") as model:
        requests = []
        if isinstance(model, remote.RemoteModel):
            send = model._call
            monkeypatch.setattr(model, "_call", lambda method, **kw: requests.append(method) or
                                send(method, **kw))
        batch = {k: np.array(v) for k, v in model.synthetic_batch(seed=0).items()}
        unknown = dict(batch, src=batch["src"].copy())
        unknown["src"][0, 1] = 19
        for step in (model.predict, model.train_step, model.loss_and_gradients):
            with pytest.raises(BatchError, match=r"batch\['src'\]\[0, 1\] = 19 is outside "
                                                 r"\[0, 19\): the vocabulary of 19 ids"):
                step(unknown)
        long = dict(batch, tgt_lengths=batch["tgt_lengths"].copy())
        long["tgt_lengths"][1] = 7
        with pytest.raises(ValueError, match=r"batch\['tgt_lengths'\]\[1\] = 7 is outside "
                                             r"\[1, 6\], the padded length"):
            model.train_step(long)
        with pytest.raises(ValueError, match=r"batch\['tgt_lengths'\]\[1\] = 7"):
            model.predict({k: long[k] for k in ("src", "src_lengths", "tgt_in", "tgt_lengths")})
        assert model.step_count == 0 and "prepare" not in requests
        assert np.isfinite(model.predict(batch)).all()  # a prediction needs no labels


# -- the shared tables, against direct computations ---------------------------------------------------

@pytest.mark.parametrize("include_pad", [False, True])
@pytest.mark.parametrize("hw,kernel,stride,padding", [
    ((9, 8), (3, 3), (2, 2), ((1, 0), (1, 1))), ((5, 7), (2, 3), (1, 2), ((0, 1), (2, 2))),
    ((4, 4), (3, 3), (3, 3), ((0, 0), (0, 0)))])
def test_pool_divisors_count_the_cells_of_each_window(hw, kernel, stride, padding, include_pad):
    (t, b), (l, r) = padding
    real = np.pad(np.ones(hw), padding)
    cells = real if not include_pad else np.ones_like(real)
    ho = (hw[0] + t + b - kernel[0]) // stride[0] + 1
    wo = (hw[1] + l + r - kernel[1]) // stride[1] + 1
    expected = np.array([[cells[i * stride[0]:i * stride[0] + kernel[0],
                                j * stride[1]:j * stride[1] + kernel[1]].sum()
                          for j in range(wo)] for i in range(ho)])
    got = pooling.divisors(hw, kernel, stride, padding, include_pad)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)


def test_a_dilated_kernel_computes_the_dilated_convolution():
    rng = np.random.RandomState(0)
    w, x = rng.standard_normal((2, 3, 3, 2)), rng.standard_normal((3, 11, 10))
    d = (2, 3)
    spread = kernels.dilate_kernel(w, d)
    assert spread.shape[2:] == kernels.dilated_extent((3, 2), d) == (5, 4)
    ho, wo = 11 - 4, 10 - 3
    direct = np.array([[[sum(w[o, c, i, j] * x[c, p + d[0] * i, q + d[1] * j]
                             for c in range(3) for i in range(3) for j in range(2))
                         for q in range(wo)] for p in range(ho)] for o in range(2)])
    plain = np.array([[[np.sum(spread[o] * x[:, p:p + 5, q:q + 4]) for q in range(wo)]
                       for p in range(ho)] for o in range(2)])
    np.testing.assert_allclose(plain, direct, rtol=1e-12)


def test_the_causal_table_masks_later_keys_only():
    table = attention.causal_table(3, 4, dtype=bool)
    assert table.tolist() == [[False, True, True, True], [False, False, True, True],
                              [False, False, False, True]]


def test_the_shared_layer_is_python36_and_framework_free():
    require_backend("cntk")
    code = ("import sys\n"
            "import tbdzoo.backends.common.attention, tbdzoo.backends.common.kernels\n"
            "import tbdzoo.backends.common.optimizers, tbdzoo.backends.common.pooling\n"
            "import tbdzoo.backends.common.sequences\n"
            "import tbdzoo.backends.common.op_support as s\n"
            "assert not s.missing('cntk')\n"
            "print(sorted(m for m in ('cntk', 'torch', 'tensorflow', 'mxnet') if m in sys.modules))\n")
    directory = os.path.join(environments.SOURCE_ROOT, "tbdzoo", "backends", "common")
    proc = run_in_env(environments.python_of("cntk"), ["-m", "compileall", "-q", "-f", directory])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_in_env(environments.python_of("cntk"), ["-c", code])
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_any_tbdzoo_error_from_a_worker_arrives_as_its_own_class():
    assert remote._error_class("UnsupportedOpError") is UnsupportedOpError
    assert remote._error_class("ValueError") is ValueError
    assert remote._error_class("SystemExit") is None  # not ours: reported as a WorkerError
