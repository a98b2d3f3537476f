"""The user-facing API on the reference backend, and the errors a user meets."""
import numpy as np
import pytest

import tbdzoo
from tbdzoo.errors import BackendUnavailableError, UnknownNameError


def test_lists():
    assert tbdzoo.list_models() == ["resnet50", "transformer", "inception_v3", "wgan", "seq2seq",
                                   "deepspeech2", "a3c", "faster_rcnn"]
    backends = {b["name"]: b for b in tbdzoo.list_backends()}
    assert list(backends) == ["torch", "tensorflow", "mxnet", "cntk", "jax"]
    assert all(isinstance(b["ready"], bool) for b in backends.values())


@pytest.mark.parametrize("name", ["resnet50", "transformer"])
def test_the_documented_session(tmp_path, name):
    m = tbdzoo.build(name, backend="torch", config="tiny", seed=0)
    import torch
    assert isinstance(m.native, torch.nn.Module)
    assert m.spec.name == name and m.hparams["config"] == "tiny"
    batch = m.synthetic_batch(seed=0)
    assert set(batch) == set(m.spec.inputs)
    losses = [m.train_step(batch) for _ in range(3)]
    assert all(np.isfinite(losses)) and losses[2] < losses[0]  # it learns the batch
    out = m.predict(batch)
    assert out.shape == (len(batch["labels"]),) + m.spec.shape_of(m.spec.output)
    w = m.get_weights()
    assert list(w) == list(m.spec.params())
    m.save_weights(tmp_path / "w.npz")
    other = tbdzoo.build(name, backend="torch", config="tiny", seed=5)
    assert not np.allclose(other.predict(batch), out)
    other.load_weights(tmp_path / "w.npz")
    np.testing.assert_allclose(other.predict(batch), out, rtol=1e-6, atol=1e-6)


def test_state_dict_keys_are_the_canonical_paths_with_pytorchs_names():
    """Canonical names, with BatchNorm's gamma and beta under PyTorch's weight and bias, and
    its step counter beside them (as in torchvision's state_dicts)."""
    m = tbdzoo.build("resnet50", backend="torch", config="tiny")
    state = m.native.state_dict()
    renamed = [n.replace(".gamma", ".weight").replace(".beta", ".bias") for n in m.spec.params()]
    assert [k for k in state if not k.endswith(".num_batches_tracked")] == renamed
    for name in m.spec.params():
        assert m.native.tensor(name).data_ptr() == \
            state[name.replace(".gamma", ".weight").replace(".beta", ".bias")].data_ptr()


def test_loss_and_gradients_changes_nothing():
    m = tbdzoo.build("resnet50", backend="torch", config="tiny")
    batch = m.synthetic_batch()
    before = m.get_weights()
    loss, grads = m.loss_and_gradients(batch)
    after = m.get_weights()
    assert all((before[k] == after[k]).all() for k in before)
    assert set(grads) == set(m.trainable_names()) and np.isfinite(loss)


@pytest.mark.parametrize("call,match", [
    (lambda: tbdzoo.build("resnet", backend="torch"),
     "unknown model 'resnet'; known: a3c, deepspeech2, faster_rcnn, inception_v3, resnet50, seq2seq, "
     "transformer, wgan"),
    (lambda: tbdzoo.build("resnet50", backend="theano"),
     "unknown backend 'theano'; known: cntk, jax, mxnet, tensorflow, torch"),
    (lambda: tbdzoo.build("resnet50", config="huge"), "unknown config.*'huge'; known: paper, tiny"),
    (lambda: tbdzoo.build("resnet50", config="tiny", lr_foo=1),
     "unknown hyperparameter.*'lr_foo'; known: .*batch_size"),
])
def test_unknown_names_list_the_known_ones(call, match):
    with pytest.raises(UnknownNameError, match=match):
        call()


def test_a_missing_environment_says_how_to_create_it(monkeypatch):
    monkeypatch.setenv("TBDZOO_CNTK_PYTHON", "/nonexistent/python3.6")
    with pytest.raises(BackendUnavailableError, match="make env-cntk"):
        tbdzoo.build("resnet50", backend="cntk", config="tiny")
    info = {b["name"]: b for b in tbdzoo.list_backends()}["cntk"]
    if info["runs"] == "worker":
        assert not info["ready"] and "make env-cntk" in info["fix"]


def test_an_installed_copy_says_which_interpreter_to_make(monkeypatch):
    """Outside a checkout there is no Makefile: the fix names the interpreter, the extra to
    install and the variable to point at it."""
    from tbdzoo.backends import environments
    monkeypatch.setattr(environments, "SOURCE_ROOT", "/nonexistent/site-packages")
    assert not environments.is_checkout()
    fix = environments.how_to_create("cntk")
    assert "CPython 3.6" in fix and "tbdzoo[cntk]" in fix and "TBDZOO_CNTK_PYTHON" in fix
    assert "make env" not in fix


def test_a_batch_of_the_wrong_shape_is_refused():
    m = tbdzoo.build("resnet50", backend="torch", config="tiny")
    batch = m.synthetic_batch()
    batch["images"] = batch["images"][:, :, :16]
    with pytest.raises(ValueError, match="images.*expected \\(3, 64, 64\\)"):
        m.train_step(batch)
    with pytest.raises(ValueError, match="lacks 'labels'"):
        m.train_step({"images": m.synthetic_batch()["images"]})
