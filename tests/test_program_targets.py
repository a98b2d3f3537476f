"""A training program's targets step (docs/programs.md): its checks when attached, when and how
the backends call its function, the replay of given targets, and the probe's three steps on
PyTorch, TensorFlow, MXNet and CNTK from one set of weights."""
from collections import OrderedDict

import numpy as np
import pytest

from conftest import require_backend
from tbdzoo import consistency
from tbdzoo.backends import programs
from tbdzoo.backends.registry import build, build_native
from tbdzoo.models import probes
from tbdzoo.spec import Graph, targets
from tbdzoo.spec.program import Program, ProgramError

PROBE = "probe/targets_topk"
SGD = {"kind": "sgd", "lr": 0.1, "momentum": 0.0, "nesterov": False, "weight_decay": 0.0}


# -- checks when the program is attached -----------------------------------------------------
def _graph():
    """x -> s = x + w -> dense 'score'; w is an input a targets step could write."""
    g = Graph("targets-check")
    x = g.input("x", (3,))
    w = g.input("w", (3,))
    g.input("gt", (3,))
    score = g.add("score", "dense", x, units=3)
    g.add("s", "add", [score, w])
    g.set_output(score)
    return g


def _program(reads, writes, loss_of="s", function="probe.top_scores", inputs=()):
    p = Program()
    p.loss("l", "mean", x=loss_of)
    p.objective("o", {"l": 1.0})
    p.group("all", "*", SGD)
    p.phase("train", "o", "all")
    p.targets("t", function, reads=reads, writes=writes, inputs=inputs)
    return p


def test_a_valid_targets_step_is_part_of_the_json_and_the_hash():
    g = _graph()
    g.set_program(_program(["score"], ["w"], inputs=["gt"]))
    data = g.program.to_json()
    assert data["targets"] == OrderedDict([("name", "t"), ("function", "probe.top_scores"),
                                           ("reads", ["score"]), ("writes", ["w"]),
                                           ("inputs", ["gt"])])
    assert Program.from_json(data).to_json() == data
    other = _graph()
    other.set_program(_program(["score"], ["w"]))  # no batch input read: another program
    assert other.hash() != g.hash()


def test_a_program_without_targets_keeps_its_json():
    """Programs that existed before the targets step keep their hash."""
    p = Program()
    p.loss("l", "mean", x="s")
    assert "targets" not in p.to_json()


@pytest.mark.parametrize("reads, writes, inputs, message", [
    (["nope"], ["w"], (), "read 'nope' is not a node"),
    (["score"], ["s"], (), "write 's' is not an input"),
    (["score"], ["w"], ["s"], "input 's' is not an input"),
    (["s"], ["w"], (), "read 's' depends on written input(s) w"),
    (["score"], ["w"], ["w"], "w both read from the batch and written"),
])
def test_faulty_targets_steps_are_refused_by_name(reads, writes, inputs, message):
    with pytest.raises(ProgramError) as e:
        _graph().set_program(_program(reads, writes, inputs=inputs))
    assert message in str(e.value)


def test_an_unregistered_function_is_refused_with_the_fix():
    with pytest.raises(ProgramError) as e:
        _program(["score"], ["w"], function="no.such.targets")
    assert "no targets function 'no.such.targets'" in str(e.value)
    assert "@register_targets('no.such.targets')" in str(e.value)


def test_a_write_no_objective_reads_is_refused():
    with pytest.raises(ProgramError) as e:
        _graph().set_program(_program(["score"], ["w"], loss_of="score"))
    assert "no phase's objective reads its written input(s) w" in str(e.value)


def test_a_second_targets_step_is_refused():
    p = _program(["score"], ["w"])
    with pytest.raises(ProgramError) as e:
        p.targets("again", "probe.top_scores", reads=["score"], writes=["w"])
    assert "already has targets step 't'" in str(e.value)


# -- when the backend calls the function -----------------------------------------------------
class Spy:
    """Wraps the probe's function: records each call's step (from the RandomState's seed)
    and what it wrote; ``updates`` records which update's stream each call drew from."""

    def __init__(self, seed):
        self.seed, self.calls, self.updates = seed, [], []

    def __call__(self, values, inputs, hparams, rng):
        state = rng.get_state()[1]
        found = [(s, u) for s in range(10) for u in range(3) if np.array_equal(
            targets.seeded_rng(self.seed, s, "targets/sample", u).get_state()[1], state)]
        steps = [s for s, _ in found]
        assert isinstance(rng, targets.StepRandomState) and [rng.step] == steps
        self.updates.append([u for _, u in found])
        out = probes.top_scores(values, inputs, hparams, rng)
        self.calls.append((steps, sorted(values), sorted(inputs), out["sampled_labels"],
                           inputs["labels"], values["logits"]))
        return out


@pytest.fixture
def spy(monkeypatch):
    recorder = Spy(seed=4)
    monkeypatch.setitem(targets._REGISTRY, "probe.top_scores", recorder)
    return recorder


def test_the_function_runs_once_per_step_with_that_steps_random_state(spy):
    model = build_native(PROBE, "torch", config="tiny", seed=4)
    batch = model.synthetic_batch(seed=0)
    assert "sampled_labels" not in batch
    model.predict(batch)  # the output does not read the written input
    assert spy.calls == []
    model.loss_and_gradients(batch)
    model.train_steps(batch, 3)  # one prepared batch, three steps
    assert [c[0] for c in spy.calls] == [[0], [0], [1], [2]]
    assert all(c[1:3] == (["logits"], ["labels"]) for c in spy.calls)
    for _, _, _, written, _, _ in spy.calls:  # the probe keeps 3 of 5 positions per example
        kept = written != 0
        assert np.all(kept.sum(axis=1) <= 3)
        np.testing.assert_array_equal(written[kept], batch["labels"][kept])


def test_each_update_of_a_step_gets_its_targets_before_the_first_update(spy):
    """Two updates on their own examples: the step's batch holds 2 x 3 rows of x and labels,
    none of the written input; both targets come from the weights at the start of the step,
    each from its update's stream."""
    model = build_native(PROBE + "_repeated", "torch", config="tiny", seed=4)
    batch = model.synthetic_batch(seed=0)
    assert {k: len(v) for k, v in batch.items()} == {"x": 6, "labels": 6}
    first = build_native(PROBE, "torch", config="tiny", seed=4)
    first.set_weights(model.get_weights())
    model.train_steps(batch, 2)
    assert [c[0] for c in spy.calls] == [[0], [0], [1], [1]]
    assert spy.updates == [[0], [1], [0], [1]]
    np.testing.assert_array_equal(spy.calls[0][4], batch["labels"][:3])
    np.testing.assert_array_equal(spy.calls[1][4], batch["labels"][3:])
    # both updates' targets read the weights of the start of the step
    before = first.predict({"x": batch["x"]})
    np.testing.assert_allclose(spy.calls[0][5], before[:3], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(spy.calls[1][5], before[3:], rtol=1e-6, atol=1e-7)
    assert np.abs(spy.calls[3][5] - before[3:]).max() > 1e-4  # the next step's: updated
    # step_targets stacks both updates' targets as a replaying batch holds them
    again = build_native(PROBE + "_repeated", "torch", config="tiny", seed=4)
    again.set_weights(first.get_weights())
    made = again.step_targets(batch)["sampled_labels"]
    np.testing.assert_array_equal(made, np.concatenate([spy.calls[0][3], spy.calls[1][3]]))
    calls = len(spy.calls)
    again.train_step(dict(batch, sampled_labels=made))
    assert len(spy.calls) == calls


def test_the_random_state_gives_detection_its_streams():
    """The function's RandomState is seeded_rng of its step; its streams are the detection
    samplers' step_rng (docs/detection.md)."""
    from tbdzoo.models.faster_rcnn.detection.randomness import step_rng
    rng = targets.StepRandomState(4, 2, "targets/sample", 1)
    np.testing.assert_array_equal(rng.randint(1000, size=8), targets.seeded_rng(
        4, 2, "targets/sample", 1).randint(1000, size=8))
    np.testing.assert_array_equal(rng.stream("sample_rois", 3).randint(1000, size=8),
                                  step_rng(4, 2, "sample_rois", 3).randint(1000, size=8))


def test_a_batch_holding_the_written_input_replays_it(spy):
    """Given the targets, the function is skipped and the step is the one it would have made."""
    model = build_native(PROBE, "torch", config="tiny", seed=4)
    weights, batch = model.get_weights(), model.synthetic_batch(seed=0)
    computed = model.loss_and_gradients(batch)
    written = spy.calls[-1][3]
    replay = build_native(PROBE, "torch", config="tiny", seed=9)
    replay.set_weights(weights)
    given = dict(batch, sampled_labels=written)
    calls = len(spy.calls)
    replayed = replay.loss_and_gradients(given)
    replay.train_step(given)
    assert len(spy.calls) == calls
    assert replayed[0] == pytest.approx(computed[0], abs=1e-7)
    for name, g in computed[1].items():
        np.testing.assert_allclose(replayed[1][name], g, rtol=1e-6, atol=1e-8)


def test_what_the_function_returns_is_checked(monkeypatch):
    def wrong_shape(values, inputs, hparams, rng):
        return {"sampled_labels": inputs["labels"][:, :2]}
    monkeypatch.setitem(targets._REGISTRY, "probe.top_scores", wrong_shape)
    model = build_native(PROBE, "torch", config="tiny", seed=0)
    with pytest.raises(ValueError) as e:
        model.train_step(model.synthetic_batch(seed=0))
    assert "wrote 'sampled_labels' of shape (3, 2), expected (3, 5)" in str(e.value)


class _Resident(targets.DeviceArray):
    """A device value whose "device" is a NumPy array; counts its copies to the host."""
    copies = 0

    def _host_copy(self):
        type(self).copies += 1
        return self.native

    @classmethod
    def stack(cls, arrays):
        return cls(np.stack([a.native for a in arrays]), arrays[0].dtype)


def test_a_value_a_kernel_left_on_its_device_is_checked_and_kept_there(monkeypatch):
    """A written DeviceArray of the input's dtype passes the checks without a host copy (the
    backend owning the device takes it as it is); one of another dtype is converted on the
    host; a wrong shape is refused as a NumPy one is."""
    g = _graph()
    g.set_program(_program(["score"], ["w"]))
    values = targets.HostValues.of_arrays({"score": np.zeros((2, 3), np.float32)})
    rows = [_Resident(np.full(3, i, np.float32), np.float32) for i in range(2)]
    written_by = {}
    monkeypatch.setitem(targets._REGISTRY, "probe.top_scores",
                        lambda values, inputs, hparams, rng: {"w": written_by["w"]})
    _Resident.copies = 0
    written_by["w"] = targets.stack_written(rows)
    got = programs.call_targets(g, g.program, values, {}, {}, None)["w"]
    assert isinstance(got, _Resident) and got.shape == (2, 3) and _Resident.copies == 0
    np.testing.assert_array_equal(np.asarray(got), [[0, 0, 0], [1, 1, 1]])
    assert _Resident.copies == 1 and np.asarray(got) is np.asarray(got)  # one copy, kept
    written_by["w"] = _Resident(np.zeros((2, 3), np.float64), np.float64)
    got = programs.call_targets(g, g.program, values, {}, {}, None)["w"]
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    written_by["w"] = _Resident(np.zeros((2, 2), np.float32), np.float32)
    with pytest.raises(ValueError, match=r"wrote 'w' of shape \(2, 2\), expected \(2, 3\)"):
        programs.call_targets(g, g.program, values, {}, {}, None)
    mixed = targets.stack_written([rows[0], np.ones(3, np.float32)])
    assert isinstance(mixed, np.ndarray) and mixed.shape == (2, 3)


def test_a_program_with_several_writes_takes_all_or_none():
    g = Graph("two-writes")
    x = g.input("x", (3,))
    for name in ("w", "v"):
        g.input(name, (3,))
    score = g.add("score", "dense", x, units=3)
    g.add("s", "add", [score, g.add("wv", "add", ["w", "v"])])
    g.set_output(score)
    g.set_program(_program(["score"], ["w", "v"]))
    batch = {"x": np.zeros((2, 3), np.float32), "w": np.zeros((2, 3), np.float32)}
    with pytest.raises(ValueError) as e:
        programs.replays_targets(g.program, batch)
    assert "holds written input(s) w but not v" in str(e.value)
    assert programs.rows_per_input(g, g.program) == OrderedDict([("x", 1), ("w", 0), ("v", 0)])
    assert programs.rows_per_input(g, g.program, replay=True) == \
        OrderedDict([("x", 1), ("w", 1), ("v", 1)])


# -- the same steps on every backend ---------------------------------------------------------
def _protocol(backend, weights, batch, seed):
    """(the targets it makes for ``batch`` at step 0, or None when the batch replays them; the
    consistency protocol's record)."""
    if backend in ("cntk", "jax"):  # through its worker
        model = build(PROBE, backend=backend, config="tiny", seed=seed, isolate=True)
    else:
        model = build_native(PROBE, backend, config="tiny", seed=seed)
    try:
        model.set_weights(weights)
        made = None if "sampled_labels" in batch else model.step_targets(batch)
        return made, consistency.run_protocol(model, weights, batch, steps=3)
    finally:
        model.close()


@pytest.mark.parametrize("backend", ["tensorflow", "mxnet", "cntk", "jax"])
def test_three_steps_agree_with_the_reference(backend):
    """Each backend computes its own targets from its own forward values and the same seeded
    draws (same model seed); given the reference's targets (``step_targets``), a backend built
    with another seed replays them instead of drawing its own."""
    require_backend("torch")
    require_backend(backend)
    reference = build_native(PROBE, "torch", config="tiny", seed=0)
    weights, batch = reference.get_weights(), reference.synthetic_batch(seed=0)
    targets_made = reference.step_targets(batch)
    assert list(targets_made) == ["sampled_labels"]
    record = consistency.run_protocol(reference, weights, batch, steps=3)
    made, other = _protocol(backend, weights, batch, seed=0)
    np.testing.assert_array_equal(made["sampled_labels"], targets_made["sampled_labels"])
    assert consistency.compare(record, other) == []

    given = dict(batch, **targets_made)
    reference = build_native(PROBE, "torch", config="tiny", seed=0)  # fresh optimizer state
    record = consistency.run_protocol(reference, weights, given, steps=3)
    assert consistency.compare(record, _protocol(backend, weights, given, seed=7)[1]) == []
