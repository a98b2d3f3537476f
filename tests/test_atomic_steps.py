"""Atomic training steps (docs/backends.md): a step whose loss or gradients come out
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

BACKENDS = ["torch", "tensorflow", "mxnet", "cntk", "jax"]
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
    """(model, batch, reference): the model has taken one step; the reference is the losses
    and weights after steps 2 and 3 of a fresh model with the guard off (the benchmarking
    switch; in process only), so a match also shows that the guard leaves training as it was."""
    backend, name = request.param
    reference = _build(name, backend)
    reference.guard_steps = False
    batch = reference.synthetic_batch(seed=0)
    reference.train_step(batch)
    losses = [_loss_bytes(reference.train_step(batch)) for _ in range(2)]
    after = {k: v.tobytes() for k, v in reference.get_weights().items()}
    reference.close()
    model = _build(name, backend)
    model.train_step(batch)
    yield model, batch, (losses, after)
    model.close()


def test_step_is_atomic(case, monkeypatch):
    """A failing update and a non-finite step (and, for WGAN, a non-finite last update of a
    step) change nothing; then the model trains on exactly as a model that never saw them."""
    model, batch, (losses, after) = case
    weights = model.get_weights()
    if model.backend in IN_PROCESS:
        before = _state(model, batch)
        with monkeypatch.context() as patch:
            _break_update(model, patch)
            with pytest.raises(RuntimeError, match="injected failure after the update"):
                model.train_step(batch)
        assert _state(model, batch) == before
        if model.program is not None and len(model.program.phases) > 1:
            _check_last_update_overflow(model, batch, monkeypatch)
    model.set_weights(_huge(model))
    _check_nonfinite_step(model, batch)
    if model.backend == "tensorflow" and model.program is None:
        _check_queued_steps(model, batch)
    # the optimizer state and the counters are as before: the next steps are the reference's
    model.set_weights(weights)
    assert [_loss_bytes(model.train_step(batch)) for _ in range(2)] == losses
    assert {k: v.tobytes() for k, v in model.get_weights().items()} == after


def _check_nonfinite_step(model, batch):
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


def _check_last_update_overflow(model, batch, monkeypatch):
    """The step's last update (a critic update, after the generator's and another critic's)
    starts from weights that overflow: the earlier updates of the step are undone too."""
    before = _state(model, batch)
    calls, update = [], model._update
    last = sum(phase["repeat"] for phase in model.program.phases)

    def update_with_overflow(phase_index, native, lr):
        calls.append(phase_index)
        if len(calls) == last:
            model.set_weights(_huge(model))
        return update(phase_index, native, lr)
    with monkeypatch.context() as patch:
        patch.setattr(model, "_update", update_with_overflow)
        with pytest.raises(NonFiniteStepError) as info:
            model.train_step(batch)
    assert len(calls) == last > 2 and info.value.objective == "critic" and info.value.step == 2
    assert "earlier updates were undone" in str(info.value)
    assert _state(model, batch) == before


def _check_queued_steps(model, batch):
    """Steps queued with sync=False raise at synchronize(), naming the first skipped step and
    taking the skipped steps off the counter."""
    before = _state(model, batch)
    prepared = model.prepare_batch(batch)
    model.train_step(prepared, sync=False)
    model.train_step(prepared, sync=False)
    with pytest.raises(NonFiniteStepError) as info:
        model.synchronize()
    assert info.value.step == 2 and "2 of the steps queued" in str(info.value)
    assert _state(model, batch) == before


def test_nonfinite_update_after_an_applied_one_undoes_the_step():
    """WGAN in CNTK's worker at a learning rate of 1e30: the generator's update is finite and
    applied, the critic's that follows is not; the whole step is undone, and the error keeps
    its objective and step across the worker boundary."""
    model = _build("wgan", "cntk", lr=1e30)
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


@pytest.mark.parametrize("name", ["resnet50", "wgan", "inception_v3"])
def test_torch_gpu_path_skips_on_the_device(name, monkeypatch):
    """PyTorch's GPU path run on the CPU: the flag stays a tensor, the fused optimizers skip
    their kernels on it (``found_inf``), the statistics and a program's state are selected
    back by it; ``train_step`` raises when it reads the loss, and steps queued with
    ``sync=False`` raise at synchronize(), naming the first bad update's objective."""
    import torch

    from tbdzoo.backends.torch.model import Model
    monkeypatch.setattr(Model, "_checks_on_host", lambda self: False)
    model = _build(name, "torch")
    for optimizer in model.torch_optimizers:  # as on a GPU (PyTorch's fused kernels run on the CPU too)
        if not isinstance(optimizer, (torch.optim.Adam, torch.optim.SGD)):
            continue  # tbdzoo's RMSProp (Inception-v3): its state is copied and selected back
        optimizer.defaults["fused"] = True
        for group in optimizer.param_groups:
            group["fused"] = True
    batch = model.synthetic_batch(seed=0)
    model.train_step(batch)
    model.set_weights(_huge(model))
    before = _state(model, batch)
    objective = "loss" if model.program is None else model.program.phases[0]["objective"]
    with pytest.raises(NonFiniteStepError) as info:
        model.train_step(batch)
    assert (info.value.objective, info.value.step) == (objective, 2)
    assert _state(model, batch) == before
    model.train_step(batch, sync=False)
    model.train_step(batch, sync=False)
    with pytest.raises(NonFiniteStepError) as info:
        model.synchronize()
    assert (info.value.objective, info.value.step) == (objective, 2)
    assert _state(model, batch) == before
