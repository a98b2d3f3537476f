"""Atomic training steps (docs/training.md): a step whose loss or gradients come out
non-finite, or that fails part-way, leaves the weights (running statistics included), the
optimizer state, the step counters and the predictions exactly as they were, on every backend,
and says what happened.

The optimizer state is checked through what it does: after the refused step the model takes
two more steps from the weights it had, and its losses and weights must equal, byte for byte,
those of a model that never saw the refused step (momentum, Adam's moments and its step
counter all enter those updates)."""
import numpy as np
import pytest

import tbdzoo
from tbdzoo.errors import NonFiniteStepError

BACKENDS = ["torch", "tensorflow", "mxnet", "cntk"]
# BatchNorm statistics (SGD with momentum); Adam with global-norm clipping; a program of a
# generator update and n_critic critic updates a step (Adam per group)
MODELS = ["resnet50", "seq2seq", "wgan"]
IN_PROCESS = ["torch", "tensorflow", "mxnet"]  # CNTK's model lives in its worker process


def _build(name, backend, **hp):
    return tbdzoo.build(name, backend=backend, config="tiny", **hp)


def _state(model, batch):
    """Everything a step may change, as bytes: weights (statistics included), counters and
    the prediction."""
    weights = model.get_weights()
    out = {k: v.tobytes() for k, v in weights.items()}
    out["step_count"] = model.step_count
    if model.program is not None and hasattr(model, "group_steps"):
        out["group_steps"] = dict(model.group_steps)
    out["predict"] = np.asarray(model.predict(batch)).tobytes()
    return out


def _loss_bytes(loss):
    values = list(loss.values()) if isinstance(loss, dict) else [loss]
    return np.asarray(values, np.float64).tobytes()


def _huge(model):
    """Every trainable weight at 3e38: the next forward pass overflows (the batch is fine)."""
    trainable = set(model.trainable_names())
    return {k: (np.full_like(v, 3e38) if k in trainable else v)
            for k, v in model.get_weights().items()}


@pytest.fixture(scope="module", params=[(b, m) for b in BACKENDS for m in MODELS],
                ids=lambda p: "{}-{}".format(*p))
def case(request):
    """(model, batch, reference): the model has taken one step; the reference is a fresh
    model's losses and weights after steps 2 and 3 on the same batch."""
    backend, name = request.param
    reference = _build(name, backend)
    batch = reference.synthetic_batch(seed=0)
    reference.train_step(batch)
    losses = [_loss_bytes(reference.train_step(batch)) for _ in range(2)]
    after = {k: v.tobytes() for k, v in reference.get_weights().items()}
    reference.close()
    model = _build(name, backend)
    model.train_step(batch)
    yield model, batch, (losses, after)
    model.close()


def test_nonfinite_step_changes_nothing_and_says_so(case):
    model, batch, (losses, after) = case
    weights = model.get_weights()
    model.set_weights(_huge(model))
    before = _state(model, batch)
    with pytest.raises(NonFiniteStepError) as info:
        model.train_step(batch)
    error = info.value
    objectives = ["loss"] if model.program is None or len(model.program.objectives) == 1 \
        else list(model.program.objectives)
    assert error.step == 2 and error.objective in objectives
    message = str(error)
    assert "step 2" in message and repr(error.objective) in message
    assert "skipped" in message and "as before the step" in message
    assert "learning rate" in message
    assert _state(model, batch) == before
    # the optimizer state and the counters are as before: the next steps are the reference's
    model.set_weights(weights)
    assert [_loss_bytes(model.train_step(batch)) for _ in range(2)] == losses
    assert {k: v.tobytes() for k, v in model.get_weights().items()} == after


@pytest.mark.parametrize("backend", BACKENDS)
def test_nonfinite_later_update_undoes_the_whole_step(backend):
    """WGAN at a learning rate of 1e30: the generator's update is finite and applied, the
    critic's that follows is not; the whole step is undone."""
    model = _build("wgan", backend, lr=1e30)
    try:
        batch = model.synthetic_batch(seed=0)
        before = _state(model, batch)
        with pytest.raises(NonFiniteStepError) as info:
            model.train_step(batch)
        assert info.value.objective == "critic" and info.value.step == 1
        assert "earlier updates were undone" in str(info.value)
        assert _state(model, batch) == before
    finally:
        model.close()


@pytest.mark.parametrize("backend", IN_PROCESS)
def test_nonfinite_fourth_critic_update_undoes_the_step(backend, monkeypatch):
    """The step's fifth update (the fourth critic update of five) comes out non-finite: the
    generator's update and the three critic updates before it are undone too."""
    model = _build("wgan", backend, n_critic=5)
    batch = model.synthetic_batch(seed=0)
    model.train_step(batch)
    before = _state(model, batch)
    calls, update = [], model._update

    def update_with_overflow(phase_index, native, lr):
        calls.append(phase_index)
        if len(calls) == 5:  # the weights this update starts from overflow its forward pass
            model.set_weights(_huge(model))
        return update(phase_index, native, lr)
    monkeypatch.setattr(model, "_update", update_with_overflow)
    with pytest.raises(NonFiniteStepError) as info:
        model.train_step(batch)
    assert len(calls) == 5 and info.value.objective == "critic" and info.value.step == 2
    assert _state(model, batch) == before


def _fail_after(obj, attribute, monkeypatch):
    """``obj.attribute`` runs, then raises: a failure after the update has been applied."""
    original = getattr(obj, attribute)

    def failing(*args, **kwargs):
        original(*args, **kwargs)
        raise RuntimeError("injected failure after the update")
    monkeypatch.setattr(obj, attribute, failing)


def _break_update(model, monkeypatch):
    """Make the model's update raise after it has changed the weights and optimizer state."""
    if model.backend == "tensorflow":  # the update runs inside the step's function
        _fail_after(model, "_update_call" if model.program is not None else "_train_call",
                    monkeypatch)
    elif model.program is None:
        _fail_after(model.optimizer, "step", monkeypatch)
    else:
        for optimizer in model._optimizers.values():
            _fail_after(optimizer, "step", monkeypatch)


@pytest.mark.parametrize("backend", IN_PROCESS)
@pytest.mark.parametrize("name", ["resnet50", "wgan"])
def test_failing_step_restores_state_and_reraises(backend, name, monkeypatch):
    reference = _build(name, backend)
    batch = reference.synthetic_batch(seed=0)
    expected = [_loss_bytes(reference.train_step(batch)) for _ in range(3)]
    model = _build(name, backend)
    model.train_step(batch)
    before = _state(model, batch)
    with monkeypatch.context() as patch:
        _break_update(model, patch)
        with pytest.raises(RuntimeError, match="injected failure after the update"):
            model.train_step(batch)
    assert _state(model, batch) == before
    assert [_loss_bytes(model.train_step(batch)) for _ in range(2)] == expected[1:]


def test_queued_nonfinite_steps_raise_at_synchronize():
    """TensorFlow queues steps with sync=False: the flags are read when it synchronises,
    naming the first skipped step and taking the skipped steps off the counter."""
    model = _build("resnet50", "tensorflow")
    batch = model.prepare_batch(model.synthetic_batch(seed=0))
    model.train_step(batch)
    model.set_weights(_huge(model))
    weights = {k: v.tobytes() for k, v in model.get_weights().items()}
    model.train_step(batch, sync=False)
    model.train_step(batch, sync=False)
    with pytest.raises(NonFiniteStepError) as info:
        model.synchronize()
    assert info.value.step == 2 and "2 of the steps queued" in str(info.value)
    assert model.step_count == 1
    assert {k: v.tobytes() for k, v in model.get_weights().items()} == weights


@pytest.mark.parametrize("backend", IN_PROCESS)
def test_guard_leaves_training_unchanged(backend):
    """The guard off (the benchmarking switch) and on give the same losses, byte for byte."""
    runs = []
    for guard in (True, False):
        model = _build("resnet50", backend)
        model.guard_steps = guard
        batch = model.synthetic_batch(seed=0)
        runs.append([model.train_step(batch) for _ in range(3)])
    assert runs[0] == runs[1]
