"""A bad batch never changes a model: every kind of bad batch, made from each model's declared
inputs, over every model (tiny) and backend (CNTK through its worker, as users build it), is
refused with a BatchError naming the input and the first offending position, before anything
changed: weights and statistics, predict's output, the step count and the optimizer's state
are byte for byte as before. Also: predict takes only the inputs inference reads, and
synthetic_batch / set_weights / load_weights refuse bad arguments."""
from collections import OrderedDict

import numpy as np
import pytest

import tbdzoo
from conftest import require_backend
from tbdzoo.backends import programs
from tbdzoo.backends.common import batches, sequences
from tbdzoo.errors import BatchError, HyperparameterError, WeightsError
from tbdzoo.models import list_models

BACKENDS = ("torch", "tensorflow", "mxnet", "cntk", "jax")
# ResNet-50 last: the tests after the matrix use it, and one CNTK worker is alive at a time
MODELS = [m for m in list_models() if m != "resnet50"] + ["resnet50"]
_BUILT = OrderedDict()
_MESSAGES = {}  # (model, kind, input) -> {backend: message}, compared across backends


@pytest.fixture(scope="module", autouse=True)
def _close_models():
    yield
    for model in _BUILT.values():
        model.close()
    _BUILT.clear()


def _model(name, backend):
    """One tiny model per (model, backend) for the module; building a worker-backed one closes
    the worker built before it (one worker alive at a time)."""
    key = (name, backend)
    if key not in _BUILT:
        require_backend(backend)
        if backend in ("cntk", "jax"):
            for other in [k for k in _BUILT if k[1] == backend]:
                _BUILT.pop(other).close()
        _BUILT[key] = tbdzoo.build(name, backend=backend, config="tiny", seed=0)
    return _BUILT[key]


def _needed(model, batch):
    """input -> how many batches of it a step's batch stacks, for the inputs a step reads."""
    if model.program is None:
        return OrderedDict((n, 1) for n in model.spec.inputs)
    rows = programs.rows_per_input(model.spec, model.program)
    return OrderedDict((n, k) for n, k in rows.items() if k)


def _set(batch, name, value, dtype=None):
    """A copy of ``batch`` whose input ``name`` holds ``value`` at its last row's first element."""
    out = OrderedDict((k, np.array(v)) for k, v in batch.items())
    array = out[name].astype(dtype) if dtype is not None else out[name]
    array[(len(array) - 1,) + (0,) * (array.ndim - 1)] = value
    out[name] = array
    return out


def _ctc_too_long(model, batch):
    """For each CTC loss: example 0 given the fewest frames the model takes, and one label more
    than the output steps they make (alternating, so each needs one step)."""
    found = []
    for loss in (model.program.losses.values() if model.program is not None else ()):
        if loss["kind"] != "ctc":
            continue
        roles = loss["inputs"]
        source = sequences.source_input(model.spec, roles["input_lengths"])
        bad = OrderedDict((k, np.array(v)) for k, v in batch.items())
        bad[roles["labels"]][0] = 0
        bad[roles["labels"]][0, 0] = 1
        bad[roles["label_lengths"]][0] = 1
        for frames in range(1, model.spec.inputs[source.replace("_lengths", "")].shape[0] + 1):
            bad[source][0] = frames
            try:
                model._check_batch(bad)
                break
            except BatchError:
                continue
        steps = int(sequences.resolve_lengths(model.spec, roles["input_lengths"], bad)[0])
        bad[roles["labels"]][0, :steps + 1] = [1 + i % 2 for i in range(steps + 1)]
        bad[roles["label_lengths"]][0] = steps + 1
        found.append(("ctc labels too long for their input", roles["labels"], bad, 0))
    return found


def bad_batches(model, batch):
    """[(kind, input it names, bad batch, row it names or None)], made from the model's declared
    inputs (a step's batch: every input each update reads)."""
    needed = _needed(model, batch)
    facts = batches.Facts(model.spec)
    rows = {n: len(batch[n]) for n in needed}
    out = []
    first = next(iter(needed))
    out.append(("empty batch", first, OrderedDict((k, np.array(v)[:0]) for k, v in batch.items()),
                None))
    last = list(needed)[-1]
    fewer = OrderedDict((k, np.array(v)) for k, v in batch.items())
    fewer[last] = fewer[last][:-needed[last]]   # one example fewer than the other inputs
    out.append(("mismatched batch sizes", last, fewer, None))
    for name in needed:
        inp = model.spec.inputs[name]
        out.append(("missing input", name, OrderedDict(
            (k, v) for k, v in batch.items() if k != name), None))
        value = np.array(batch[name])
        wrong = value[:, None] if not inp.shape else value[..., :-1] if inp.shape[-1] > 1 \
            else np.concatenate([value, value], axis=-1)
        out.append(("wrong per-example shape", name, dict(batch, **{name: wrong}), None))
        row = rows[name] - 1
        if inp.dtype == "float32":
            out.append(("NaN", name, _set(batch, name, np.nan), row))
            out.append(("inf", name, _set(batch, name, -np.inf), row))
        else:
            out.append(("float id 2.5", name, _set(batch, name, 2.5, np.float64), row))
            out.append(("value far too high", name, _set(batch, name, 10 ** 6), row))
            if name not in facts.ids or facts.ids[name][1] != -1:
                out.append(("value -1", name, _set(batch, name, -1), row))
            if name in facts.ids:  # the first id past the range the graph gives
                out.append(("id at the range's end", name,
                            _set(batch, name, facts.ids[name][0]), row))
    return out + _ctc_too_long(model, batch)


def _optimizer_state(model):
    """The optimizers' numbers (state and the parameters they hold), as bytes, for a model in
    this process: ``optimizer`` (one loss) or ``_optimizers`` (a program's groups). None for a
    model in a worker, which exposes no optimizer."""
    import sys
    holders = [getattr(model, a) for a in ("optimizer", "_optimizers") if hasattr(model, a)]
    if not holders:
        return None
    found, seen = [], set()

    def walk(value, depth):
        if id(value) in seen or depth > 6:
            return
        seen.add(id(value))
        torch = sys.modules.get("torch")
        if isinstance(value, np.ndarray):
            found.append(value.tobytes())
        elif torch is not None and isinstance(value, torch.Tensor):
            found.append(value.detach().float().cpu().numpy().tobytes())
        elif hasattr(value, "asnumpy"):
            found.append(value.asnumpy().tobytes())
        elif hasattr(value, "numpy") and hasattr(value, "assign"):  # a tf.Variable
            found.append(value.numpy().tobytes())
        elif isinstance(value, dict):
            for v in value.values():
                walk(v, depth + 1)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v, depth + 1)
        elif hasattr(value, "__dict__") and type(value).__module__.startswith(("tbdzoo", "torch")):
            for v in vars(value).values():
                walk(v, depth + 1)

    walk(holders, 0)
    assert found, "no optimizer state found on {!r}".format(model)
    return found


def _state(model, batch):
    weights = model.get_weights()
    out = model.predict(batch)
    out = out if isinstance(out, dict) else {"output": out}
    return (OrderedDict((k, np.asarray(v).tobytes()) for k, v in weights.items()),
            OrderedDict((k, np.asarray(v).tobytes()) for k, v in out.items()),
            model.step_count, _optimizer_state(model))


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_bad_batch_is_refused_and_changes_nothing(backend, name):
    model = _model(name, backend)
    batch = model.synthetic_batch(seed=0)
    # predict takes only the inputs inference reads (no labels)
    inference = OrderedDict((n, batch[n]) for n in model._predict_inputs(batch))
    assert not any(i.name in inference for i in model.spec.target_inputs()), list(inference)
    before = _state(model, inference)
    cases = bad_batches(model, batch)
    wrong = []
    for kind, input_name, bad, row in cases:
        try:
            model.train_step(bad)
        except BatchError as e:
            _MESSAGES.setdefault((name, kind, input_name), {})[backend] = str(e)
            if e.input != input_name or (row is not None and (e.position or (None,))[0] != row):
                wrong.append("{} in {!r}: named input {!r} at {}: {}".format(
                    kind, input_name, e.input, e.position, e))
        except Exception as e:  # noqa: BLE001  (the test reports what else came back)
            wrong.append("{} in {!r}: {}: {}".format(kind, input_name, type(e).__name__, e))
        else:
            wrong.append("{} in {!r}: trained on it".format(kind, input_name))
    after = _state(model, batch)  # the whole step's batch: its labels play no part
    assert not wrong, "\n".join(wrong)
    assert after[0] == before[0], "weights or statistics changed"
    assert after[1] == before[1], "predict's output changed"
    assert after[2] == before[2] == 0
    assert after[3] == before[3], "the optimizer's state changed"
    assert len(cases) >= 8
    first = next(iter(inference))
    with pytest.raises(BatchError, match="batch lacks {!r}".format(first)):
        model.predict(OrderedDict((n, v) for n, v in inference.items() if n != first))


def test_a_refusal_says_the_same_on_every_backend():
    """Runs after the matrix: every (model, kind, input) refused on each backend built, with
    one message."""
    compared = 0
    for key, by_backend in _MESSAGES.items():
        if len(by_backend) > 1:
            assert len(set(by_backend.values())) == 1, (key, by_backend)
            compared += 1
    if not compared:
        pytest.skip("fewer than two backends ran the matrix")


def test_the_cntk_worker_refuses_a_bad_batch_itself_and_keeps_serving():
    """A batch the caller's side did not check (sent straight to the worker) is refused by
    the worker's own check, the empty batch that killed CNTK with SIGFPE among them."""
    from tbdzoo.weights import save_arrays
    model = _model("resnet50", "cntk")
    batch = model.synthetic_batch(seed=0)
    for bad, message in (({k: v[:0] for k, v in batch.items()}, "is empty"),
                         (_set(batch, "images", np.nan), "is not finite"),
                         (_set(batch, "labels", 10), r"outside \[0, 10\)")):
        path = model._path("bad")
        save_arrays(path, bad)
        with pytest.raises(BatchError, match=message):
            model._call("prepare", key="bad", path=path)
    assert np.isfinite(model.train_step(batch))


def test_float_ids_holding_whole_numbers_are_taken():
    model = _model("resnet50", "torch")
    batch = model.synthetic_batch(seed=0)
    as_floats = dict(batch, labels=batch["labels"].astype(np.float32))
    np.testing.assert_array_equal(model.loss_and_gradients(as_floats)[0],
                                  model.loss_and_gradients(batch)[0])


def test_a_refusal_names_the_input_position_value_and_what_is_allowed():
    model = _model("resnet50", "torch")
    batch = model.synthetic_batch(seed=0)
    batch["labels"][3] = 1000
    with pytest.raises(BatchError) as e:
        model.train_step(batch)
    assert str(e.value).startswith("batch['labels'][3] = 1000 is outside [0, 10): class ids of "
                                   "10 classes")
    assert (e.value.input, e.value.position, e.value.value, e.value.allowed) == (
        "labels", (3,), 1000, (0, 10))
    with pytest.raises(BatchError, match=r"batch is a dict of arrays keyed by input name"):
        model.train_step([batch["images"], batch["labels"]])


@pytest.mark.parametrize("backend", ("cntk", "torch"))
def test_synthetic_batch_refuses_a_bad_size_or_seed_like_build(backend):
    model = _model("resnet50", backend)
    for size in (0, -1, "x", 2.5, True):
        with pytest.raises(HyperparameterError, match=r"batch_size .* = {!r} is not allowed; "
                                                      r"batch_size takes an integer >= 1".format(
                                                          size).replace("(", r"\(")):
            model.synthetic_batch(batch_size=size)
    for seed in (-1, "x", 1.5, None):
        with pytest.raises(HyperparameterError, match="seed .* is not allowed"):
            model.synthetic_batch(seed=seed)
    with pytest.raises(HyperparameterError, match="batch_size"):
        tbdzoo.build("resnet50", backend=backend, config="tiny", batch_size=0)
    assert len(model.synthetic_batch(batch_size=None)["labels"]) == 4
    assert len(model.synthetic_batch(seed=np.int64(2), batch_size=np.int32(3))["labels"]) == 3


@pytest.mark.parametrize("backend", ("cntk", "torch"))
def test_set_weights_and_load_weights_refuse_what_is_not_weights(backend, tmp_path):
    model = _model("resnet50", backend)
    before = model.get_weights()
    for value, message in ((None, "dict of canonical name -> array.*got None"),
                           ([np.zeros(3)], "got a list of 1 item"),
                           ("w.npz", "not the path 'w.npz'; read a weights file with "
                                     "load_weights"),
                           (tmp_path / "w.npz", "not the path"),
                           (np.zeros(3), "got an array of shape")):
        with pytest.raises(WeightsError, match=message):
            model.set_weights(value)
    for value, message in ((None, "takes the path of a .npz weights file, not None"),
                           (before, "assign a dict of arrays with set_weights")):
        with pytest.raises(WeightsError, match=message):
            model.load_weights(value)
    after = model.get_weights()
    assert all(np.array_equal(before[k], after[k]) for k in before)
