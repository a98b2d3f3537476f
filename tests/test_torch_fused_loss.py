"""The PyTorch backend's block-wise label-smoothed cross-entropy against F.cross_entropy."""
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from tbdzoo.backends.torch import fused_loss


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("ignore_index", [0, None])
def test_matches_cross_entropy_over_several_blocks(monkeypatch, dtype, overwrite, ignore_index):
    monkeypatch.setattr(fused_loss, "BLOCK_BYTES", 4 * 50 * 7)  # 7 rows a block: 6 blocks
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(37, 50, generator=generator, dtype=torch.float64) * 3
    labels = torch.randint(0, 50, (37,), generator=generator)
    labels[::5] = 0

    reference = start.clone().to(dtype).requires_grad_()
    expected = F.cross_entropy(reference.float(), labels, label_smoothing=0.1,
                               ignore_index=-100 if ignore_index is None else ignore_index)
    expected.backward(torch.tensor(2.0))

    leaf = start.clone().to(dtype).requires_grad_()
    logits = leaf * 1.0  # an intermediate, as the output projection's result is
    loss = fused_loss.smoothed_cross_entropy(logits, labels, ignore_index, 0.1, overwrite_logits=overwrite)
    loss.backward(torch.tensor(2.0))

    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert leaf.grad.dtype == dtype
    tolerance = 1e-7 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(leaf.grad.float(), reference.grad.float(), rtol=0, atol=tolerance)
    if ignore_index is not None:
        assert leaf.grad[labels == ignore_index].abs().max().item() == 0.0
    assert (leaf.float() == start.to(dtype).float()).all()  # the leaf is never overwritten


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("ignore_index", [0, None, 50])
def test_matches_cross_entropy_in_one_block(smoothing, ignore_index):
    """One block (the Seq2Seq's logits): without smoothing the loss is one nll_loss."""
    generator = torch.Generator().manual_seed(1)
    start = torch.randn(37, 50, generator=generator) * 3
    labels = torch.randint(0, 50, (37,), generator=generator)
    labels[::4] = 50 if ignore_index == 50 else 0

    reference = start.clone().requires_grad_()
    expected = F.cross_entropy(reference, labels, label_smoothing=smoothing,
                               ignore_index=-100 if ignore_index is None else ignore_index)
    expected.backward(torch.tensor(3.0))
    leaf = start.clone().requires_grad_()
    loss = fused_loss.smoothed_cross_entropy(leaf * 1.0, labels, ignore_index, smoothing)
    loss.backward(torch.tensor(3.0))

    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    torch.testing.assert_close(leaf.grad, reference.grad, rtol=0, atol=1e-6)
    if ignore_index is not None:
        assert leaf.grad[labels == ignore_index].abs().max().item() == 0.0


def test_overwrite_writes_the_gradient_over_the_logits():
    logits = torch.randn(6, 5, requires_grad=True) * 1.0
    loss = fused_loss.smoothed_cross_entropy(logits, torch.tensor([1, 2, 3, 4, 0, 1]), None, 0.0,
                                             overwrite_logits=True)
    seen = []
    logits.register_hook(lambda grad: seen.append(grad))
    loss.backward()
    assert seen[0].data_ptr() == logits.data_ptr()
    # each row of a cross-entropy gradient sums to zero
    torch.testing.assert_close(seen[0].sum(dim=1), torch.zeros(6), rtol=0, atol=1e-7)
