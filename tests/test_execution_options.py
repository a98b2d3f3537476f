"""Precision, execution and memory format: chosen per model, honoured or refused by name.
GPU paths run on the H200 (docs/gpu-comparisons.md); here the CPU exercises the same selection."""
import numpy as np
import pytest
import torch

import tbdzoo
from tbdzoo.errors import HyperparameterError, UnknownNameError, UnsupportedOptionError


def test_every_config_carries_the_execution_options():
    for name in tbdzoo.list_models():
        hp = tbdzoo.get_model(name).hparams("tiny")
        assert (hp["precision"], hp["execution"], hp["memory_format"]) == ("fp32", "default", "auto")


def test_bf16_autocasts_the_forward_pass_and_keeps_fp32_master_weights():
    m = tbdzoo.build("transformer", backend="torch", config="tiny", precision="bf16", dropout=0.0)
    seen = []
    original = torch.nn.functional.linear

    def spy(x, w, b=None):
        out = original(x, w, b)
        seen.append(out.dtype)
        return out
    torch.nn.functional.linear = spy
    try:
        loss = m.train_step(m.synthetic_batch())
    finally:
        torch.nn.functional.linear = original
    assert np.isfinite(loss) and torch.bfloat16 in seen
    assert all(t.dtype == torch.float32 for t in m.native.parameters())
    fp32 = tbdzoo.build("transformer", backend="torch", config="tiny", dropout=0.0)
    fp32.set_weights(m.get_weights())
    # bf16 and fp32 agree to bf16's precision, and are not bit-identical
    batch = m.synthetic_batch()
    a, b = m.predict(batch), fp32.predict(batch)
    assert np.allclose(a, b, atol=0.1) and not np.array_equal(a, b)


def test_compiled_matches_eager():
    eager = tbdzoo.build("resnet50", backend="torch", config="tiny")
    compiled = tbdzoo.build("resnet50", backend="torch", config="tiny", execution="compiled")
    assert compiled._forward_loss is not compiled._loss
    batch = eager.synthetic_batch()
    losses = [(eager.train_step(batch), compiled.train_step(batch)) for _ in range(2)]
    for a, b in losses:
        assert a == pytest.approx(b, rel=1e-4)


def test_channels_last_is_applied_to_weights_and_batches():
    m = tbdzoo.build("resnet50", backend="torch", config="tiny", memory_format="channels_last")
    assert m.native.tensor("conv1.weight").is_contiguous(memory_format=torch.channels_last)
    prepared = m.prepare_batch(m.synthetic_batch())
    assert prepared.native["images"].is_contiguous(memory_format=torch.channels_last)
    assert not tbdzoo.build("resnet50", backend="torch", config="tiny", device="cpu").channels_last
    # weights come back in the canonical layout whatever the memory format
    w = m.get_weights()["conv1.weight"]
    assert w.flags["C_CONTIGUOUS"] and w.shape == (8, 3, 7, 7)


def test_tf32_needs_a_gpu_and_bad_values_are_named():
    with pytest.raises(UnsupportedOptionError, match="'tf32' needs a CUDA device"):
        tbdzoo.build("resnet50", backend="torch", config="tiny", precision="tf32", device="cpu")
    with pytest.raises(HyperparameterError, match="precision .*'fp64'.*one of: fp32, tf32, bf16"):
        tbdzoo.build("resnet50", backend="torch", config="tiny", precision="fp64")
    with pytest.raises(UnknownNameError, match="precison"):
        tbdzoo.build("resnet50", backend="torch", config="tiny", precison="bf16")


def test_a_missing_gpu_is_refused_clearly():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(UnsupportedOptionError, match="'cuda:0' is not available: PyTorch sees 0 GPU"):
        tbdzoo.build("resnet50", backend="torch", config="tiny", device="cuda:0")


@pytest.mark.parametrize("backend", ["tensorflow", "mxnet", "cntk"])
def test_other_backends_refuse_what_they_do_not_run(backend):
    from conftest import require_backend
    require_backend(backend)
    with pytest.raises(UnsupportedOptionError, match="precision 'bf16' is not available on backend " + backend):
        tbdzoo.build("resnet50", backend=backend, config="tiny", precision="bf16", isolate=True)
